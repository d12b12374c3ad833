"""How far a long lookup match's repeat runs past the block, by the match's length: what
picks `engine.lookup.SPAN_MATCH` for `--lookup-span`.

    python scripts/span_study.py --limit 8 --json benchmarks/stage29/span-study-cpu.json

Decodes each suite's prompts (greedy, whole blocks, full vocabulary, the shipped draft) with
every lookup match of the engine's minimum length or more filling verifies of up to SPAN
tokens (SPAN_MATCH lowered to that minimum for the study), and records, for each cycle the
lookup proposed that way, the match's length and the tokens the target accepted. A proposal
of fewer tokens is a prefix of the same repeat, so its accepted count is min(accepted, its
length): the per-bucket rows say how often each match length would run past a block of 16
and fill 32 or 64 tokens. Greedy replies are the target's, whoever proposes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401,I001  (first: the fast CPU BLAS)
import engine.cycle as cycle  # noqa: E402
import engine.runtime as runtime  # noqa: E402
from engine import DFlashConfig, DFlashRuntime  # noqa: E402
from engine.bench.environment import machine_info, versions  # noqa: E402
from engine.bench.suites import SUITES, load_prompts  # noqa: E402
from engine.lookup import MIN_MATCH  # noqa: E402

SPAN = 64
BUCKETS = ((MIN_MATCH, 8), (8, 16), (16, 32), (32, 10_000))


def traced_cycles(rt: DFlashRuntime, messages: list[dict], max_tokens: int) -> list[dict]:
    """Decode one reply; -> per cycle: the lookup's match length when it proposed, the
    verify's length and the accepted count."""
    matches: list[int] = []
    propose = cycle.DraftProposer.propose

    def recording(self, staged, size, position, room=None):
        matches.append(self.lookup.match()[0] if self.lookup is not None else 0)
        return propose(self, staged, size, position, room=room)

    cycles: list[dict] = []
    decode = runtime.speculative_decode

    def traced(*args, **kwargs):
        for commit in decode(*args, **kwargs):
            if commit.cycle is not None:
                cycles.append({"match": matches[-1], "verify": commit.cycle.block_size,
                               "accepted": commit.cycle.accepted,
                               "looked_up": bool(commit.cycle.looked_up)})
            yield commit

    cycle.DraftProposer.propose, runtime.speculative_decode = recording, traced
    try:
        rt.generate(messages, max_tokens=max_tokens)
    finally:
        cycle.DraftProposer.propose, runtime.speculative_decode = propose, decode
    return cycles


def bucket_rows(long_cycles: list[dict]) -> list[dict]:
    rows = []
    for low, high in BUCKETS:
        runs = [c["accepted"] for c in long_cycles if low <= c["match"] < high]
        n = len(runs)
        rows.append({"match": f"{low}-{high - 1}" if high < 10_000 else f"{low}+",
                     "cycles": n,
                     "mean_accepted": sum(runs) / n if n else None,
                     "past_block_share": sum(a >= 16 for a in runs) / n if n else None,
                     "filled_32_share": sum(a >= 31 for a in runs) / n if n else None,
                     "filled_64_share": sum(a >= 63 for a in runs) / n if n else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=8, help="prompts per suite (spread)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    cycle.SPAN_MATCH = MIN_MATCH  # every long match fills a long verify
    rt = DFlashRuntime.from_pretrained(config=DFlashConfig(
        min_draft_confidence=None, draft_vocab=None, lookup_span=SPAN))
    report = {"command": "python " + " ".join(sys.argv), "span": SPAN,
              "max_tokens": args.max_tokens, "machine": machine_info(), "versions": versions(),
              "suites": {}}
    pooled: list[dict] = []
    for suite in sorted(SUITES):
        prompts, _ = load_prompts(suite=suite, limit=args.limit)
        long_cycles = []
        for prompt in prompts:
            cycles = traced_cycles(rt, [{"role": "user", "content": prompt.text}],
                                   args.max_tokens)
            long_cycles += [c for c in cycles if c["looked_up"] and c["match"] >= MIN_MATCH]
        pooled += long_cycles
        report["suites"][suite] = {"long_match_cycles": len(long_cycles),
                                   "by_match": bucket_rows(long_cycles)}
    report["pooled"] = bucket_rows(pooled)
    for row in report["pooled"]:
        share = row["past_block_share"]
        print(f"match {row['match']:>6}: {row['cycles']:3d} cycles, past the block "
              f"{'-' if share is None else f'{share:.0%}'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
