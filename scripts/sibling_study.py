"""Which sibling trees (engine/tree.py) raise tokens/cycle at a verify of the block's length?
Simulated greedy cycles, without decoding again.

    python scripts/sibling_study.py --draft engine/drafts/smollm2-135m-instruct-dflash \
        --limit 16 --json benchmarks/stage40/sibling-study-16-cpu.json

Per anchor of the suites' greedy replies the draft's block forward runs as in training
(`branch_study.anchor_rows`: its top choices per slot, its top probability, the target's
continuation). A shape `main{L}_first{M}_top{K}` verifies the draft's top L drafts and its
2nd..K-th choices at its first M slots as single tokens (1 + L + M (K - 1) tokens); a cycle
runs as far as the chain agrees, and one token further where the target's token at the
chain's first wrong slot is one of that slot's siblings. `cut{M}x{K}` is the CPU default's
verify cut (the draft's first draft below 0.4, padded to 8 or 16 tokens) with up to M slots
of siblings in its padding. Each is walked as a decode walks (`walk_cycles`: the draft alone,
no suffix lookup); tokens/cycle pooled over a set's cycles.
"""

from __future__ import annotations

from branch_study import anchor_rows, rule_study, run_of  # scripts/ is on the path when run

from engine.config import DEFAULT_MIN_CONFIDENCE

PADDED = [0, *([8] * 8), *([16] * 8)]  # the 2-core CPU's verify lengths (verify-lengths-cpu)
# (main, slots, choices), choices at most branch_study.TOP (the choices kept per slot)
SHAPES = ((15, 0, 1), (13, 1, 3), (11, 2, 3), (9, 3, 3), (7, 4, 3), (11, 4, 2), (9, 6, 2),
          (9, 2, 4), (7, 8, 2))
CUTS = ((0, 1), (2, 2), (3, 2), (2, 3), (3, 3), (2, 4))


def sibling_run(row: dict, main: int, slots: int, choices: int) -> int:
    """The drafts a cycle keeps from a tree of `main` chained drafts and siblings."""
    top, future = row["top"], row["future"]
    chain = [int(t) for t in top[:, 0]]
    run = run_of(chain[:main], future)
    if run >= min(main, len(future)) or run >= slots:
        return run
    return run + 1 if any(int(top[run, c]) == future[run] for c in range(1, choices)) else run


def cut_run(row: dict, slots: int, choices: int) -> int:
    """`sibling_run` of the tree the verify cut leaves room for (engine/cycle.py)."""
    confident = 0
    for p in row["p1"]:
        if p < DEFAULT_MIN_CONFIDENCE:
            break
        confident += 1
    cut = min(confident + 2, len(PADDED) - 1)
    length = PADDED[cut]
    slots = min(slots, (length - cut) // (choices - 1)) if choices > 1 else 0
    return sibling_run(row, length - 1 - slots * (choices - 1), slots, choices)


def main(argv: list[str] | None = None) -> int:
    shapes = {f"main{m}_first{s}_top{k}": (lambda row, m=m, s=s, k=k: sibling_run(row, m, s, k),
                                          1 + m + s * (k - 1)) for m, s, k in SHAPES}
    shapes.update({f"cut{s}x{k}": (lambda row, s=s, k=k: cut_run(row, s, k), None)
                   for s, k in CUTS})
    return rule_study(__doc__, anchor_rows, shapes, argv)


if __name__ == "__main__":
    raise SystemExit(main())
