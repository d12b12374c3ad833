"""How far the suffix lookup (engine/lookup.py) carries, per minimum match length, without
decoding again: simulated greedy cycles over replies whose draft runs are known.

    python scripts/draft_acceptance.py --draft D --limit 8 --walk --lookup off \
        --heldout benchmarks/stage5/heldout.npz --heldout-limit 40 --json A.json
    python scripts/lookup_study.py A.json --heldout benchmarks/stage5/heldout.npz \
        --json benchmarks/stage13/lookup-study-cpu.json

A.json holds, per reply, its tokens and the draft's run at every anchor (`--walk`). A cycle
anchored at reply token a commits 1 + the run of its proposal: the draft's run, or, where the
lookup finds a match of at least N tokens, the lookup's (its proposal against the reply's
next tokens: greedy replies are the target's, whoever proposes). Cycles walk the reply as a
decode does (`engine.train.objective.walk_cycles`). Per set and N: tokens/cycle pooled over
replies, the share of cycles looked up, and `best_of` (each cycle takes the longer of the
two runs: what a perfect choice between them would reach). The held-out answers (real
prompts never trained on) pick the engine's default N; the suites only report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.bench.timing import first_mismatch
from engine.lookup import SuffixLookup
from engine.train.dataset import Dataset

MATCHES = (2, 3, 4, 5, 6, 8, 12, 16)
BLOCK = 16


def lookup_runs(prompt: Sequence[int], reply: Sequence[int], min_match: int,
                short_match: int | None = None, count: int = BLOCK - 1) -> list[int | None]:
    """Per anchor a (reply token a staged): the run of the lookup's proposal of up to `count`
    tokens, None without one. `short_match`: the shorter matches it also proposes from (the
    engine's SHORT_MATCH, as an alternative to the draft); None: none."""
    found = SuffixLookup(min_match, short_match=short_match or min_match)
    found.extend(prompt)
    out: list[int | None] = []
    for a in range(len(reply) - 1):
        found.extend([reply[a]])
        _, proposal = found.propose(count)
        if not proposal:
            out.append(None)
            continue
        future = reply[a + 1:a + 1 + len(proposal)]
        mismatch = first_mismatch(proposal, future)
        out.append(len(future) if mismatch is None else mismatch)
    return out


def walk(draft: Sequence[int], looked: Sequence[int | None],
         choose: Callable[[int, int | None], tuple[int, bool]]) -> tuple[int, int, int]:
    """-> (tokens after the first, cycles, looked-up cycles) of one reply's walk."""
    n = len(draft) + 1
    a = cycles = used = 0
    while a < n - 1:
        run, from_lookup = choose(draft[a], looked[a])
        a += min(1 + run, n - 1 - a)
        cycles += 1
        used += from_lookup
    return n - 1, cycles, used


def lookup_first(d: int, m: int | None) -> tuple[int, bool]:
    return (d, False) if m is None else (m, True)


def best_of(d: int, m: int | None) -> tuple[int, bool]:
    return (d, False) if m is None or m <= d else (m, True)


def study(replies: list[tuple[list[int], list[int], list[int]]]) -> dict:
    """replies: (prompt tokens, reply tokens, draft run per anchor)."""
    def pooled(choose, min_match: int | None) -> dict:
        tokens = cycles = used = 0
        for prompt, reply, draft in replies:
            looked = (lookup_runs(prompt, reply, min_match) if min_match
                      else [None] * len(draft))
            t, c, u = walk(draft, looked, choose)
            tokens, cycles, used = tokens + t, cycles + c, used + u
        return {"tokens_per_cycle": tokens / cycles, "lookup_cycle_share": used / cycles}

    out = {"draft_only": pooled(lookup_first, None)}
    for m in MATCHES:
        out[f"lookup_{m}"] = pooled(lookup_first, m)
        out[f"best_of_{m}"] = pooled(best_of, m)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", help="a draft_acceptance.py --walk report (one draft)")
    p.add_argument("--heldout", help="the .npz its held-out runs simulated")
    p.add_argument("--json", help="write the study here")
    args = p.parse_args(argv)
    report = json.loads(Path(args.report).read_text())
    (draft_name, rows), = report["drafts"].items()
    sets: dict[str, list] = {}
    for suite, row in rows.items():
        if suite != "heldout":
            sets[suite] = [(r["prompt_tokens"], r["reply"], r["anchor_runs"]) for r in row["runs"]]
    if args.heldout and "heldout" in rows:
        data = Dataset.load(Path(args.heldout))
        sets["heldout"] = []
        for i, r in enumerate(rows["heldout"]["runs"]):
            seq, cut = [int(t) for t in data.sequences[i]], int(data.prompt_lens[i])
            sets["heldout"].append((seq[:cut], seq[cut:], r["anchor_runs"]))
    result = {"command": "python " + " ".join(sys.argv), "source": args.report,
              "draft": draft_name, "block_size": BLOCK, "sets": {}}
    for name, replies in sets.items():
        result["sets"][name] = found = study(replies)
        line = "  ".join(f"{k} {v['tokens_per_cycle']:.2f}" for k, v in found.items()
                         if not k.startswith("best_of"))
        print(f"{name:9s} ({len(replies)} replies)  {line}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
