"""How far would cycles run if each verify held the draft's likeliest tree (engine/tree.py:
`likeliest_tree`) instead of its row or a fixed sibling shape? Simulated greedy cycles, without
decoding again.

    python scripts/tree_study.py --draft engine/drafts/smollm2-135m-instruct-dflash \
        --limit 16 --json benchmarks/stage41/tree-study-16-cpu.json

Per anchor of the suites' greedy replies the draft's block forward runs as in training
(`choice_study.reply_blocks`): its top tokens per slot and their probabilities, and the
target's continuation. `row` verifies the draft's top 15 drafts; `siblings3x3` the stage-40
sibling tree (9 drafts, the 2nd and 3rd choices at the first 3 slots); `tree{N}_top{C}` the
N likeliest nodes of the tree of the draft's top C tokens per slot (`likeliest_nodes`: a
node as likely as the product of its path's probabilities), a verify of N + 1 tokens. A
cycle runs as deep as the tree holds the target's continuation. Each is walked as a decode
walks (`walk_cycles`: the draft alone, no suffix lookup); tokens/cycle pooled over a set's
cycles.
"""

from __future__ import annotations

import numpy as np
from branch_study import rule_study  # scripts/ is on the path when run
from choice_study import reply_blocks
from sibling_study import sibling_run

from engine.tree import likeliest_nodes

TOP = 8  # choices kept per slot
TREES = ((15, 2), (15, 3), (15, 4), (15, 6), (15, 8), (7, 6), (23, 6), (31, 6))


def anchor_rows(draft, target, seq: list[int], prompt_len: int) -> list[dict]:
    """Per reply anchor: the draft's top TOP tokens per slot `top` [B - 1, TOP], best first,
    their probabilities `probs`, and the target's continuation `future`."""
    import mlx.core as mx  # here: the engine's imports load the fast CPU BLAS first

    from engine.tree import top_choices

    B = draft.args.block_size
    rows = []
    for anchors, logits, _ in reply_blocks(draft, target, seq, prompt_len):
        probs = mx.softmax(logits, axis=-1, precise=True)
        top = top_choices(probs, TOP)
        top_probs = mx.take_along_axis(probs, top, axis=-1)
        top, top_probs = np.array(top), np.array(top_probs)
        for j, a in enumerate(anchors):
            rows.append({"top": top[j], "probs": top_probs[j], "future": seq[a + 1:a + B]})
    return rows


def tree_run(row: dict, nodes: int, choices: int) -> int:
    """The drafts a cycle keeps from the `nodes` likeliest nodes of the draft's tree."""
    found = likeliest_nodes(row["top"][:, :choices], row["probs"][:, :choices], nodes)
    children: dict[int, list[int]] = {}
    for i, (parent, _, _) in enumerate(found):
        children.setdefault(parent, []).append(i)
    node, run = -1, 0
    for true in row["future"]:
        node = next((i for i in children.get(node, []) if found[i][2] == true), None)
        if node is None:
            break
        run += 1
    return run


def main(argv: list[str] | None = None) -> int:
    rules = {"row": (lambda row: sibling_run(row, 15, 0, 1), 16),
             "siblings3x3": (lambda row: sibling_run(row, 9, 3, 3), 16)}
    rules.update({f"tree{n}_top{c}": (lambda row, n=n, c=c: tree_run(row, n, c), n + 1)
                  for n, c in TREES})
    return rule_study(__doc__, anchor_rows, rules, argv)


if __name__ == "__main__":
    raise SystemExit(main())
