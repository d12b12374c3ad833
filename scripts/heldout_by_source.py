"""Simulated tokens/cycle of drafts on the held-out real-prompt answers, per prompt source:
which kinds of prompts a draft predicts worst (where more or other training data would pay).
A training run reports its own draft this way at its end (train-log.json's
final_val_by_source); this script compares drafts already trained.

    git show 2b41663:benchmarks/stage5/heldout.npz > heldout.npz   # SmolLM2's, from history
    python3 scripts/heldout_by_source.py --draft engine/drafts/smollm2-135m-instruct-dflash \
        --heldout heldout.npz --json F  # seconds on a GPU; the 2-core CPU needs > 25 min

A held-out set holds answers never trained on, with the record ids in its meta, whose prefix is
the source: SmolLM2's (255 answers) and the Qwen pair's (`git show
9d038af:train-data/qwen-coder/heldout-1.npz`, with `--model qwen2.5-coder-1.5b`) are kept in
git history, not the tree. The figure is engine.train's validation:
fixed anchors, greedy acceptance simulated from the draft's argmax (whole blocks), and beside
it the decode walk (engine.train.loop.walk_tokens_per_cycle: the cycles a greedy decode of each
answer runs, which the anchor mean overstates; `scripts/draft_acceptance.py --walk` compares
both with real decoding).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.bench.environment import machine_info, versions
from engine.loading import load_draft_folder, load_target
from engine.targets import adapter_for
from engine.train.dataset import Dataset
from engine.train.loop import TrainConfig, held_out_sources, validate, walk_tokens_per_cycle
from engine.train.objective import slot_weights

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", action="append", required=True, help="draft folder (repeatable)")
    p.add_argument("--heldout", required=True, type=Path,
                   help="held-out answers (.npz; see above for where they are kept)")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    if not args.heldout.is_file():
        p.error(f"{args.heldout} does not exist; the held-out sets live in git history "
                "(this script's docstring gives the `git show` commands)")
    import mlx.core as mx  # after engine: its import loads the fast CPU BLAS first

    heldout = Dataset.load(args.heldout)
    by_source = held_out_sources(heldout)
    model, _, model_id = load_target(args.model, "float32")
    target = adapter_for(model)
    report = {"command": " ".join(["python", *sys.argv]), "model": model_id,
              "heldout": str(args.heldout), "machine": machine_info(), "versions": versions(),
              "drafts": {}}
    for folder in args.draft:
        draft = load_draft_folder(Path(folder), mx.float32)
        cfg = TrainConfig(model=args.model, out="", batch=8, anchors=96,
                          block_size=draft.args.block_size)
        weights = slot_weights(cfg.block_size, cfg.gamma)
        rows = {}
        for source, idx in sorted(by_source.items()):
            answers = heldout.subset(idx)
            rows[source] = {**validate(draft, target, answers, cfg, weights),
                            "walk_tokens_per_cycle": walk_tokens_per_cycle(draft, target, answers),
                            "answers": len(idx)}
        blocks = sum(r["blocks"] for r in rows.values())  # all sources: blocks-weighted
        rows["all"] = {"tokens_per_cycle": sum(r["tokens_per_cycle"] * r["blocks"]
                                               for r in rows.values()) / blocks,
                       "walk_tokens_per_cycle": sum(r["walk_tokens_per_cycle"] * r["answers"]
                                                    for r in rows.values()) / len(heldout),
                       "blocks": blocks, "answers": len(heldout)}
        report["drafts"][folder] = rows
        for source, row in rows.items():
            print(f"{folder}  {source:<14} tokens/cycle {row['tokens_per_cycle']:.2f}  "
                  f"decode walk {row['walk_tokens_per_cycle']:.2f}  blocks {row['blocks']}",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
