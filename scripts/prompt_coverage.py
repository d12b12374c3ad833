"""How much of the training prompt file the kept answers already cover, per source and slice.

A generation run (`dflash train-draft --prompt-slice K/N --skip-answered ...`) asks only the
prompts of its slice that no kept dataset answered; once a slice runs dry its new answers
come from whatever sources are left in it. This counts, for each source, the prompts of each
slice (held-out ones excluded) whose first user turn a dataset already answered, so a session
can pick the slice that still holds the prompts it wants.

    python scripts/prompt_coverage.py --data D1.npz D2.npz ... --slices 2 \
        --prompts ../shared/data/train_prompts.jsonl.gz --json F
    # the Qwen2.5-Coder answers (engine/drafts/qwen2.5-coder-1.5b-instruct-dflash):
    python scripts/prompt_coverage.py --model qwen2.5-coder-1.5b --slices 4 --data gen-*.npz ...

The datasets are token ids: `--model` must be the target that answered them (its tokenizer
reads them back); another tokenizer finds nothing answered.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path

import engine  # noqa: F401  (the fast BLAS before MLX)
from engine.train.collect import Answered
from engine.train.mix import in_slice, is_held_out


def first_turn(record: dict) -> str:
    turns = record.get("turns")
    return turns[0] if turns else record["prompt"]


def coverage(answered: Answered, prompts: Path, slices: int) -> dict[str, list[dict]]:
    """-> {source: [{"slice": k, "prompts": n, "answered": m} for each slice]}."""
    total: collections.Counter = collections.Counter()
    done: collections.Counter = collections.Counter()
    with gzip.open(prompts, "rt", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if is_held_out(record["id"]):
                continue
            k = next(i for i in range(slices) if in_slice(record["id"], i, slices))
            key = (record["source"], k)
            total[key] += 1
            done[key] += answered.has_text(first_turn(record))
    sources = sorted({s for s, _ in total})
    return {s: [{"slice": k, "prompts": total[(s, k)], "answered": done[(s, k)]}
                for k in range(slices)] for s in sources}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="kept datasets (.npz)")
    p.add_argument("--prompts", required=True, help="the prompt file (train_prompts.jsonl.gz)")
    p.add_argument("--slices", type=int, default=2, help="N of --prompt-slice K/N")
    p.add_argument("--json", help="write the counts here")
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help="the target that answered the datasets (its tokenizer)")
    args = p.parse_args(argv)
    from engine.loading import load_target

    _, tokenizer, _ = load_target(args.model)
    answered = Answered.load(tuple(args.data), tokenizer)
    assert answered is not None
    counts = coverage(answered, Path(args.prompts), args.slices)
    for source, rows in counts.items():
        print(f"{source:14s}", "  ".join(f"slice {r['slice']}: {r['answered']:>6} of "
                                         f"{r['prompts']:>6} answered" for r in rows))
    if args.json:
        report = {"command": "python " + " ".join(sys.argv), "model": args.model,
                  "slices": args.slices,
                  "datasets": [Path(d).name for d in args.data],
                  "answered_sequences": len(answered.answers), "sources": counts}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
