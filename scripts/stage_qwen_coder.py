"""Gather what a lent GPU needs for the Qwen2.5-Coder pair into one folder, for
`../shared/gpu/stage DIR/*` (the GPU machines reach no package index):

    python scripts/stage_qwen_coder.py /tmp/qwen-stage [--ar-draft] [--data REV:PATH ...] \
        [--init engine/drafts/qwen2.5-coder-1.5b-instruct-dflash]

- the target's GGUF (and with --ar-draft the 0.5B one, mlx-lm's draft in benchmarks), fetched
  into this machine's cache first if needed (engine/offline.py);
- qwen-extras.tar: the evaluation sets (training decontaminates against them) and
  ../shared/data/train_prompts.jsonl.gz's path beside;
- earlier sessions' answers, kept in git history rather than the tree (`--data
  REV:train-data/qwen-coder/gen-1.npz`): written out as files;
- with --init, a draft folder as qwen-draft.tar, for PART=train's INIT.
scripts/train_qwen_coder_gpu.sh reads them from /root/stash/files on the GPU machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import offline  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
EVALS = ("mt_bench.jsonl", "humaneval.jsonl.gz", "gsm8k_100.jsonl")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--ar-draft", action="store_true", help="also the 0.5B GGUF")
    p.add_argument("--data", action="append", default=[], metavar="REV:PATH",
                   help="a file from git history (e.g. an earlier session's answers)")
    p.add_argument("--init", type=Path, metavar="DRAFT",
                   help="a draft folder to train on from, packed as qwen-draft.tar (PART=train "
                        "INIT=/root/stash/files/qwen-draft.tar)")
    args = p.parse_args()
    if args.init is not None and not (args.init / "model.safetensors").is_file():
        p.error(f"--init {args.init}: no model.safetensors there (a draft folder, before its "
                "weights are emptied for the staging)")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    def say(message: str, fraction: float | None = None) -> None:
        print(message if fraction is None else f"{message}: {fraction:.0%}", flush=True)

    models = [offline.QWEN_CODER_15B] + ([offline.QWEN_CODER_05B] if args.ar_draft else [])
    for model in models:
        gguf = offline.gguf_path(model, say)
        link = out / gguf.name
        link.unlink(missing_ok=True)
        link.symlink_to(gguf)
    prompts = out / "train_prompts.jsonl.gz"
    prompts.unlink(missing_ok=True)
    prompts.symlink_to(SHARED / "train_prompts.jsonl.gz")
    with tarfile.open(out / "qwen-extras.tar", "w") as tar:
        for name in EVALS:
            tar.add(SHARED / name, arcname=f"evals/{name}")
    if args.init is not None:
        with tarfile.open(out / "qwen-draft.tar", "w") as tar:
            for name in ("config.json", "model.safetensors", "token_ranking.json"):
                if (args.init / name).is_file():
                    tar.add(args.init / name, arcname=name)
    for item in args.data:
        rev, _, path = item.partition(":")
        blob = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True,
                              capture_output=True).stdout
        (out / Path(path).name).write_bytes(blob)
    for f in sorted(out.iterdir()):
        print(f"{f.stat().st_size / 1e6:9.1f} MB  {f.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
