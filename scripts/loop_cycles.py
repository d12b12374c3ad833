"""Where a decode's cycles commit their tokens: inside a reply's loop or before it. From a
`draft_acceptance.py --walk` report's real decodes (each reply and its cycles), the tokens
per cycle pooled over the cycles that end before the reply's loop starts
(`engine.bench.metrics.loop_start`, the non-loop figure's cut) and over the rest, per suite.
Loops are trivial to draft: this shows whether the decode drafts them as such, and how much
of the shortfall is elsewhere.

    python scripts/draft_acceptance.py --draft D --limit 16 --walk --json walk.json
    python scripts/loop_cycles.py walk.json --json F
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.bench.metrics import loop_start, split_at_loop  # noqa: E402


def split_cycles(reply: Sequence[int], cycles: Sequence[int]) -> tuple[list[int], list[int]]:
    """A reply's cycles (tokens each; token 0 came from prefill) -> (those that end before
    its loop starts, the rest), cut as the non-loop figure cuts them."""
    return split_at_loop(cycles, loop_start(reply))


def pooled(cycles: Sequence[int]) -> float | None:
    return sum(cycles) / len(cycles) if cycles else None


def shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("walk_json", type=Path, help="a draft_acceptance.py --walk report")
    p.add_argument("--draft", help="which draft of the report (default: its first)")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    report = json.loads(args.walk_json.read_text())
    name = args.draft or next(iter(report["drafts"]))
    if name not in report["drafts"]:
        p.error(f"no draft {name!r} in {args.walk_json}: it has {sorted(report['drafts'])}")
    out = {"command": "python " + " ".join(sys.argv), "walk_report": str(args.walk_json),
           "draft": name, "sets": {}}
    for suite, row in report["drafts"][name].items():
        runs = [r for r in row.get("runs", []) if "reply" in r]
        if not runs:
            p.error(f"{args.walk_json}: its {suite} runs keep no replies. Fix: make it with "
                    f"--walk.")
        before: list[int] = []
        inside: list[int] = []
        for r in runs:
            b, i = split_cycles(r["reply"], r["real_cycles"])
            before += b
            inside += i
        out["sets"][suite] = {
            "replies": len(runs), "looping_replies": sum(loop_start(r["reply"]) is not None
                                                          for r in runs),
            "before_loop": {"cycles": len(before), "tokens": sum(before),
                            "tokens_per_cycle": pooled(before)},
            "in_loop": {"cycles": len(inside), "tokens": sum(inside),
                        "tokens_per_cycle": pooled(inside)}}
        s = out["sets"][suite]
        print(f"{suite:9s} before the loop {shown(s['before_loop']['tokens_per_cycle'])} tokens/"
              f"cycle ({s['before_loop']['cycles']} cycles)  in the loop "
              f"{shown(s['in_loop']['tokens_per_cycle'])} ({s['in_loop']['cycles']} cycles, "
              f"{s['looping_replies']} of {s['replies']} replies loop)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
