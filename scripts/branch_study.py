"""Would verifying a few alternative drafts beside the draft's own raise tokens/cycle? Simulated
greedy cycles for trees of alternatives, without decoding again.

    python scripts/branch_study.py --draft engine/drafts/smollm2-135m-instruct-dflash \
        --limit 8 --json benchmarks/stage18/branch-study-cpu.json

A block's proposal is the draft's top token at every slot; its run ends at the first slot
where that token is not the target's. A tree adds rows that differ from it at one slot: the
draft's 2nd (to k-th) choice at slot j, its own top tokens elsewhere. A row branching at j
can only help where the draft's row first fails at j, and then runs on while its later top
tokens keep matching. The verify then holds all rows (a batch, or one tree-masked forward of
fewer tokens), and a cycle keeps the longest run. Per anchor of the suites' greedy replies
(and --heldout answers: real prompts never trained on) the draft's block forward runs as in
training (`engine.train.objective.slot_logits`); each tree `first{m}_top{k}` (branches at
slots 1..m, choices 2..k) is walked as a decode walks (`walk_cycles`: the draft alone, no
suffix lookup). `at_failure_top{k}` branches only where the draft's row fails (an oracle:
the most any tree with those choices can add); `least_sure_top2` branches only at the slot
of the first 8 the draft is least sure of (one extra row, chosen before verifying). Tokens/
cycle are pooled over a set's cycles (tokens / cycles); `rows` and `tree_tokens` say what a
verify would hold.
"""

from __future__ import annotations

import sys

import numpy as np
from choice_study import (  # on the path when run
    reply_blocks,
    study_parser,
    study_sets,
    whole_block_runtime,
    write_study,
)

from engine.train.objective import walk_cycles

TOP = 4  # choices kept per slot
TREES = ((1, 2), (2, 2), (4, 2), (8, 2), (15, 2), (2, 3), (4, 3), (4, 4), (15, 4))


def run_of(row: list[int], future: list[int]) -> int:
    """How many leading tokens of `row` the target's own continuation `future` confirms."""
    n = 0
    for drafted, true in zip(row, future):
        if drafted != true:
            break
        n += 1
    return n


def tree_run(top: np.ndarray, future: list[int], slots: list[int], k: int) -> int:
    """The longest run among the draft's row (top [S, TOP]: its choices per slot) and the
    rows that take choice 2..k at one of `slots` (0-based), its top tokens elsewhere."""
    main = [int(t) for t in top[:, 0]]
    fails = run_of(main, future)  # the slot where the draft's row fails
    if fails not in slots or fails >= len(future):  # only a branch there can run further
        return fails
    rows = (main[:fails] + [int(top[fails, r])] + main[fails + 1:] for r in range(1, k))
    return max([fails, *(run_of(row, future) for row in rows)])


def anchor_rows(draft, target, seq: list[int], prompt_len: int) -> list[dict]:
    """Per reply anchor: the draft's choices per slot `top` [B - 1, TOP], its probability of
    its top choice per slot `p1`, and the target's continuation `future`."""
    import mlx.core as mx  # here: the engine's imports load the fast CPU BLAS first

    B = draft.args.block_size
    rows = []
    for anchors, logits, _ in reply_blocks(draft, target, seq, prompt_len):
        top = np.array(mx.argsort(-logits, axis=-1)[..., :TOP])
        p1 = np.array(mx.max(mx.softmax(logits, axis=-1, precise=True), axis=-1))
        for j, a in enumerate(anchors):
            rows.append({"top": top[j], "p1": p1[j], "future": seq[a + 1:a + B]})
    return rows


def trees(block_size: int) -> dict:
    """name -> (run of an anchor row, rows a verify holds, tokens of a tree-masked verify)."""
    S = block_size - 1
    found = {"draft": (lambda row: tree_run(row["top"], row["future"], [], 1), 1, block_size)}
    for m, k in TREES:
        slots = list(range(min(m, S)))
        tokens = block_size + (k - 1) * sum(S - j for j in slots)  # branches share prefixes
        found[f"first{m}_top{k}"] = (
            lambda row, s=slots, k=k: tree_run(row["top"], row["future"], s, k),
            1 + (k - 1) * len(slots), tokens)
    for k in (2, 4):
        found[f"at_failure_top{k}"] = (
            lambda row, k=k: tree_run(row["top"], row["future"], list(range(S)), k),
            None, None)
    found["least_sure_top2"] = (
        lambda row: tree_run(row["top"], row["future"], [int(np.argmin(row["p1"][:8]))], 2),
        2, 2 * block_size)
    return found


def pooled(replies: list[list[dict]], run) -> float:
    """Tokens/cycle over the replies' walks (anchored at token 0, then wherever the last
    cycle stopped)."""
    tokens = cycles = 0
    for rows in replies:
        walked = walk_cycles([run(row) for row in rows], len(rows) + 1)
        tokens, cycles = tokens + sum(walked), cycles + len(walked)
    return tokens / cycles if cycles else float("nan")


def pooled_sets(sets: dict[str, list], runs: dict) -> dict[str, dict[str, float]]:
    """Set name -> each rule's `pooled` tokens/cycle over the set's replies (printed per set
    as they come); `runs`: rule name -> run of an anchor row."""
    found = {}
    for name, replies in sets.items():
        found[name] = {rule: pooled(replies, run) for rule, run in runs.items()}
        print(f"{name:9s} ({len(replies)} replies)  " + "  ".join(
            f"{k} {v:.2f}" for k, v in found[name].items()), flush=True)
    return found


def rule_study(doc: str, rows_of, rules: dict, argv: list[str] | None) -> int:
    """A study's whole run: its flags (`study_parser`), the suites' replies as `rows_of`
    gives their anchors, each rule's pooled tokens/cycle, the JSON; `rules`: name -> (run of
    an anchor row, the tokens its verify holds)."""
    args = study_parser(doc).parse_args(argv)
    draft, rt = whole_block_runtime(args.draft)
    sets = study_sets(draft, rt, rows_of, args.limit, args.max_tokens, args.heldout,
                      args.heldout_limit)
    result = {"command": "python " + " ".join(sys.argv), "draft": args.draft,
              "replies": {k: len(v) for k, v in sets.items()},
              "verify_tokens": {name: tokens for name, (_, tokens) in rules.items()}}
    result["sets"] = pooled_sets(sets, {name: run for name, (run, _) in rules.items()})
    write_study(args.json, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = study_parser(__doc__).parse_args(argv)
    draft, rt = whole_block_runtime(args.draft)
    sets = study_sets(draft, rt, anchor_rows, args.limit, args.max_tokens, args.heldout,
                      args.heldout_limit)
    walked = trees(draft.args.block_size)
    result = {"command": "python " + " ".join(sys.argv), "draft": args.draft,
              "replies": {k: len(v) for k, v in sets.items()}, "trees": {}, "sets": {}}
    for name, (_, rows, tokens) in walked.items():
        result["trees"][name] = {"rows": rows, "tree_tokens": tokens}
    result["sets"] = pooled_sets(sets, {tree: run for tree, (run, _, _) in walked.items()})
    write_study(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
