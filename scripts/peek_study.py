"""How much does a draft gain from peeking at its anchor (`DraftArgs.anchor_peek`)? Simulated
greedy cycles of the draft alone at each peek depth, on held-out answers and the suites'
greedy replies, without decoding again.

    python scripts/peek_study.py --draft DRAFT --heldout benchmarks/stage5/heldout.npz \
        --heldout-limit 64 --limit 8 --json benchmarks/stage34/peek-study-cpu.json

At every anchor of a reply the draft's block forward runs as in training
(`engine.train.objective.slot_logits`), its anchor seen through the target's first D taps
(`peek_context`; D = 0: the published recipe). Per set and depth: `slot_accuracy` (the
draft's argmax right at slots 1..15, every anchor counted), `anchor_mean` (1 + the run of
right slots, over all anchors) and `walk` (tokens/cycle walked as a decode walks,
`walk_cycles`, averaged over replies). A peek costs the target's first layers on one token
per cycle (up to tap D), so its gain has to beat that.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from choice_study import study_sets, whole_block_runtime, write_study  # on the path when run

from engine.train.objective import anchor_hits, walk_cycles

CHUNK = 32


def depth_rows(depths: list[int]):
    """rows_of for `study_sets`: per reply, one row per depth (right slots, runs)."""
    def rows_of(draft, target, seq: list[int], prompt_len: int) -> list[dict]:
        rows = []
        for depth in depths:
            hits, valid = anchor_hits(draft, target, seq, prompt_len, CHUNK, depth)
            rows.append({"depth": depth, "right": hits.sum(0), "slots": valid.sum(0),
                         "runs": np.cumprod(hits, axis=-1).sum(-1), "n": len(seq) - prompt_len})
        return rows
    return rows_of


def summary(replies: list[list[dict]], depth_index: int) -> dict:
    rows = [reply[depth_index] for reply in replies if len(reply[depth_index]["runs"])]
    right = sum(r["right"] for r in rows)
    slots = sum(r["slots"] for r in rows)
    runs = np.concatenate([r["runs"] for r in rows])
    walks = [(r["n"] - 1) / len(c) for r in rows if (c := walk_cycles(r["runs"], r["n"]))]
    return {"slot_accuracy": [round(float(a), 4) for a in right / np.maximum(slots, 1)],
            "anchor_mean": round(float(1 + runs.mean()), 4),
            "walk": round(float(np.mean(walks)), 4), "anchors": int(len(runs))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True, help="a draft folder trained with --anchor-peek")
    p.add_argument("--depths", default="0,1,2,3,4", help="peek depths to study (tap counts)")
    p.add_argument("--heldout", default="benchmarks/stage5/heldout.npz")
    p.add_argument("--heldout-limit", type=int, default=64)
    p.add_argument("--limit", type=int, default=8, help="prompts per suite")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    draft, rt = whole_block_runtime(args.draft)
    if max(depths) > len(draft.args.target_layer_ids):
        p.error(f"--depths: the draft has {len(draft.args.target_layer_ids)} taps")
    sets = study_sets(draft, rt, depth_rows(depths), args.limit, args.max_tokens, args.heldout,
                      args.heldout_limit)
    result = {"command": "python " + " ".join(sys.argv), "draft": args.draft,
              "trained_peek": draft.args.anchor_peek,
              "replies": {k: len(v) for k, v in sets.items()},
              "sets": {name: {str(d): summary(replies, i) for i, d in enumerate(depths)}
                       for name, replies in sets.items()}}
    for name, per_depth in result["sets"].items():
        print(name, "  ".join(f"peek {d}: walk {s['walk']:.2f} anchor mean "
                              f"{s['anchor_mean']:.2f} slot 1 {s['slot_accuracy'][0]:.3f}"
                              for d, s in per_depth.items()))
    write_study(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
