"""What does a draft's token chain (`engine.draft.TokenChain`) buy, and at how many candidates
per slot? Simulated greedy cycles of the draft alone, without and with its chain, on held-out
answers and the suites' greedy replies, without decoding again.

    python scripts/chain_study.py --draft DRAFT --candidates 8,16,64 \
        --heldout benchmarks/stage5/heldout.npz --heldout-limit 64 --limit 8 \
        --json benchmarks/stage35/chain-study-cpu.json

At every anchor of a reply the draft's block forward runs as in training
(`engine.train.objective.anchor_hits`); the chain sees the true previous token, which is
exact for a run (it ends at the first wrong proposal). Per set and variant (`none`: the
draft's own proposals; K: the chain choosing among the draft's top K): `slot_accuracy`,
`anchor_mean` and `walk` as in scripts/peek_study.py.
"""

from __future__ import annotations

import sys

from choice_study import study_parser, study_sets, whole_block_runtime, write_study
from peek_study import summary  # on the path when run

from engine.train.objective import anchor_hits

CHUNK = 32


def variant_rows(variants: list[int]):
    """rows_of for `study_sets`: per reply, one row per variant (0: the chain off)."""
    def rows_of(draft, target, seq: list[int], prompt_len: int) -> list[dict]:
        import numpy as np

        chain, width = draft.chain, draft.args.chain_candidates
        rows = []
        try:
            for k in variants:
                draft.chain = chain if k else None
                draft.args.chain_candidates = k or width
                hits, valid = anchor_hits(draft, target, seq, prompt_len, CHUNK)
                rows.append({"candidates": k, "right": hits.sum(0), "slots": valid.sum(0),
                             "runs": np.cumprod(hits, axis=-1).sum(-1),
                             "n": len(seq) - prompt_len})
        finally:
            draft.chain, draft.args.chain_candidates = chain, width
        return rows
    return rows_of


def main() -> int:
    p = study_parser(__doc__)
    p.add_argument("--candidates", default="8",
                   help="comma-separated candidate counts per slot to study (beside none)")
    args = p.parse_args()
    draft, rt = whole_block_runtime(args.draft)
    if draft.chain is None:
        raise SystemExit(f"{args.draft}: this draft has no token chain (train one with "
                         "dflash train-draft --chain UNITS)")
    variants = [0, *(int(k) for k in args.candidates.split(","))]
    sets = study_sets(draft, rt, variant_rows(variants), args.limit, args.max_tokens,
                      args.heldout, args.heldout_limit)
    result = {"command": " ".join(["python", *sys.argv]), "draft": args.draft,
              "sets": {name: {("none" if k == 0 else str(k)): summary(replies, i)
                              for i, k in enumerate(variants)}
                       for name, replies in sets.items()}}
    for name, by_variant in result["sets"].items():
        print(name, "  ".join(f"{v}: walk {s['walk']:.2f} anchor {s['anchor_mean']:.2f}"
                              for v, s in by_variant.items()), flush=True)
    write_study(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
