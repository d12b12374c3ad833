"""What a larger block could win at most, from a `draft_acceptance.py --walk` report: the
draft's run at every anchor of every reply (block size B), and the walk a greedy decode
takes through them, re-walked as if every full run (all B-1 slots right) went on being right
up to a block of size B' (`--block`, repeatable). A draft trained on longer blocks keeps its
first B-1 slots at best as good, and gets its later slots right at most always: an
optimistic figure for what the larger block could add to the draft-alone walk (no suffix
lookup). Not a strict bound: a longer cycle moves the walk's later anchors, which may land
on worse ones, so it can read below B's own walk.

    python scripts/draft_acceptance.py --draft D --limit 8 --walk --heldout \
        benchmarks/stage5/heldout.npz --heldout-limit 40 --json walk.json
    python scripts/block_size_bound.py walk.json --draft D --block 24 --block 32 --json F
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.train.objective import walk_cycles  # noqa: E402


def stretched_runs(runs: Sequence[int], block: int, larger: int) -> list[int]:
    """Each full run of a block of `block` slots (block - 1 right) lengthened to a block of
    `larger`: the bound's assumption that the extra slots are always right."""
    full = block - 1
    return [larger - 1 if r >= full else int(r) for r in runs]


def walk_tokens_per_cycle(answers: Sequence[tuple[Sequence[int], int]]) -> float:
    """Tokens per cycle of the walks through (anchor runs, reply length) pairs, pooled."""
    tokens = cycles = 0
    for runs, n in answers:
        walked = walk_cycles(runs, n)
        tokens += sum(walked)
        cycles += len(walked)
    return tokens / cycles if cycles else float("nan")


def suite_bound(runs_of: list[dict], block: int, larger: list[int]) -> dict:
    """One suite's (or the held-out answers') runs -> full-run share, walks at each size."""
    answers = [(r["anchor_runs"], len(r["anchor_runs"]) + 1) for r in runs_of
               if r.get("anchor_runs")]
    anchors = [x for runs, _ in answers for x in runs]
    row = {"anchors": len(anchors),
           "full_run_share": sum(x >= block - 1 for x in anchors) / max(len(anchors), 1),
           "walk": {str(block): walk_tokens_per_cycle(answers)}}
    for size in larger:
        row["walk"][str(size)] = walk_tokens_per_cycle(
            [(stretched_runs(runs, block, size), n) for runs, n in answers])
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("walk_json", help="a draft_acceptance.py --walk report")
    p.add_argument("--draft", help="which draft of the report (default: its first)")
    p.add_argument("--block-size", type=int, default=16, help="the report draft's block size")
    p.add_argument("--block", type=int, action="append", required=True,
                   help="a larger block size to bound (repeatable)")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    report = json.loads(Path(args.walk_json).read_text())
    name = args.draft or next(iter(report["drafts"]))
    if name not in report["drafts"]:
        p.error(f"no draft {name!r} in {args.walk_json}: it has {sorted(report['drafts'])}")
    out = {"command": "python " + " ".join(sys.argv), "walk_report": args.walk_json,
           "draft": name, "block_size": args.block_size, "sets": {}}
    for suite, row in report["drafts"][name].items():
        bound = suite_bound(row["runs"], args.block_size, args.block)
        if not bound["anchors"]:
            p.error(f"{args.walk_json} holds no anchor runs: make it with --walk")
        out["sets"][suite] = bound
        walks = "  ".join(f"B={k} {v:.2f}" for k, v in bound["walk"].items())
        print(f"{suite:9s} full runs {bound['full_run_share']:.1%}  walk tokens/cycle {walks}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
