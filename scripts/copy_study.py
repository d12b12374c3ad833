"""Would copying from the context inside a draft's block raise tokens/cycle? Simulated greedy
cycles, without decoding again.

    python scripts/copy_study.py --draft engine/drafts/smollm2-135m-instruct-dflash \
        --limit 8 --json benchmarks/stage24/copy-study-cpu.json

The draft predicts a block's slots in parallel, so where it knows a word or identifier has
started it often cannot finish it. The context can: where the block's tokens so far (after
the context) end in an n-gram seen earlier, the token that followed it then is a candidate
(`engine.lookup.ContextCopy`, the engine's --copy-odds). A rule `copy_a{alpha}_n{n}` builds
the block slot by slot and takes the candidate (from a match of at least n tokens) over the
draft's top token where the draft gives the candidate at least alpha times its top token's
probability (n = 1: the engine's rule); `bigram_a{alpha}` takes its candidate from the
previous token alone; `oracle_n{n}` takes it wherever the draft's token is wrong and the
candidate right (the most such a rule could add). Per anchor of the suites' greedy replies
(and --heldout answers) the draft's block forward runs as in training
(`choice_study.reply_blocks`); each rule is walked as a decode walks (`walk_cycles`), the
draft alone (`draft`, no suffix lookup) and with the engine's whole-block lookup in front
(`lookup+...`: a match of MIN_MATCH tokens proposes the repeat instead). The short match's
choice is left out: real decodes measure the whole (scripts/draft_acceptance.py).
"""

from __future__ import annotations

import sys

import branch_study  # on the path when run, as choice_study
import numpy as np
from choice_study import (
    reply_blocks,
    study_parser,
    study_sets,
    whole_block_runtime,
    write_study,
)

from engine.lookup import MIN_MATCH, ContextCopy, SuffixLookup

ALPHAS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5)
MATCHES = (1, 2, 3)


def copy_row(index: ContextCopy, top1: np.ndarray, probs: np.ndarray, alpha: float,
             min_match: int, future: list[int] | None = None) -> list[int]:
    """The block built slot by slot: the draft's top token, or the context's candidate where
    the rule takes it (`future` given: the oracle, where the draft is wrong and it right)."""
    row: list[int] = []
    for j in range(len(top1)):
        n, cand = index.match(row)
        token = int(top1[j])
        if n >= min_match and cand != token:
            if future is not None:
                if j < len(future) and token != future[j] and cand == future[j]:
                    token = cand
            elif probs[j, cand] >= alpha * probs[j, token]:
                token = cand
        row.append(token)
    return row


def bigram_row(follower: dict[int, int], staged: int, top1: np.ndarray, probs: np.ndarray,
               alpha: float) -> list[int]:
    """`copy_row` with the candidate from the previous token alone: what followed its latest
    earlier occurrence (`follower`, a table the device can hold)."""
    row: list[int] = []
    prev = staged
    for j in range(len(top1)):
        token, cand = int(top1[j]), follower.get(prev, -1)
        if cand >= 0 and cand != token and probs[j, cand] >= alpha * probs[j, token]:
            token = cand
        row.append(token)
        prev = token
    return row


def rules() -> list[tuple[str, float | None, int]]:
    found: list[tuple[str, float | None, int]] = [("draft", None, 0)]
    found += [(f"copy_a{a}_n{n}", a, n) for n in MATCHES for a in ALPHAS]
    found += [(f"oracle_n{n}", None, n) for n in MATCHES]
    found += [(f"bigram_a{a}", a, -1) for a in ALPHAS]
    return found


def anchor_rows(draft, target, seq: list[int], prompt_len: int) -> list[dict]:
    """Per reply anchor: each rule's run, and the engine lookup's run where its match is long
    enough to propose without the draft (None elsewhere)."""
    import mlx.core as mx  # here: the engine's imports load the fast CPU BLAS first

    B = draft.args.block_size
    index, lookup = ContextCopy(), SuffixLookup()
    index.extend(seq[:prompt_len])
    lookup.extend(seq[:prompt_len])
    follower = {seq[i]: seq[i + 1] for i in range(prompt_len - 1)}
    rows = []
    for anchors, logits, _ in reply_blocks(draft, target, seq, prompt_len):
        probs = np.array(mx.softmax(logits, axis=-1, precise=True))
        top1 = probs.argmax(axis=-1)
        for j, a in enumerate(anchors):
            index.extend([seq[a]])  # the context: the prompt and the reply up to the anchor
            lookup.extend([seq[a]])
            follower[seq[a - 1]] = seq[a]
            future = seq[a + 1:a + B]
            row: dict = {}
            for name, alpha, n in rules():
                if name == "draft":
                    proposal = [int(t) for t in top1[j]]
                elif n < 0:
                    proposal = bigram_row(follower, seq[a], top1[j], probs[j], alpha)
                elif alpha is None:
                    proposal = copy_row(index, top1[j], probs[j], 0.0, n, future)
                else:
                    proposal = copy_row(index, top1[j], probs[j], alpha, n)
                row[name] = branch_study.run_of(proposal, future)
            length, repeat = lookup.propose(B - 1)
            row["lookup"] = branch_study.run_of(repeat, future) if length >= MIN_MATCH else None
            rows.append(row)
    return rows


def pooled(replies: list[list[dict]], name: str, with_lookup: bool) -> float:
    """Tokens/cycle of rule `name`'s walks, the lookup's run first where it proposes."""
    return branch_study.pooled(replies, lambda r: (
        r["lookup"] if with_lookup and r["lookup"] is not None else r[name]))


def main(argv: list[str] | None = None) -> int:
    args = study_parser(__doc__).parse_args(argv)
    draft, rt = whole_block_runtime(args.draft)
    sets = study_sets(draft, rt, anchor_rows, args.limit, args.max_tokens, args.heldout,
                      args.heldout_limit)
    result = {"command": "python " + " ".join(sys.argv), "draft": args.draft,
              "replies": {k: len(v) for k, v in sets.items()}, "sets": {}}
    for set_name, replies in sets.items():
        found = {}
        for name, _, _ in rules():
            found[name] = pooled(replies, name, False)
            found["lookup+" + name] = pooled(replies, name, True)
        result["sets"][set_name] = found
        best = sorted(found.items(), key=lambda kv: -kv[1])[:6]
        print(f"{set_name:9s} ({len(replies)} replies) draft {found['draft']:.2f} "
              f"lookup+draft {found['lookup+draft']:.2f}  best: "
              + "  ".join(f"{k} {v:.2f}" for k, v in best), flush=True)
    write_study(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
