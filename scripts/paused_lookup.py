"""Whether the suffix lookup should still propose while speculation is paused: every prompt
decoded always paused (a pacer that never resumes), where a paused cycle is a plain 1-token
step, or a verify of the lookup's repeat where it finds a long match. No timing: each cycle
is costed with this machine's measured verify costs (engine/verify_lengths.py, the forward
of L tokens after 128 of context), so the report compares the cost of the paused decode with
the lookup on (sum of its verifies' costs) against plain steps only (one 1-token forward per
token), in plain steps. The tokens are the same either way (greedy).

    python scripts/paused_lookup.py --limit 2 --json benchmarks/pause-lookup-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import engine.runtime  # noqa: I001  (before mlx.core: the fast BLAS, engine/blas.py)
from engine import DFlashConfig, DFlashRuntime
from engine.bench.suites import SUITES, encode, load_prompts
from engine.pause import Pacer
from engine.runtime import target_model_dtype
from engine.verify_lengths import load_or_measure


class AlwaysPaused(Pacer):
    """A pacer that pauses from the first cycle and never probes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.left = 10 ** 9

    def end(self, *args, **kwargs) -> None:
        self.left = 10 ** 9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=2, help="prompts per suite (spread pick)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--json")
    args = p.parse_args()
    engine.runtime.Pacer = AlwaysPaused
    rt = DFlashRuntime.from_pretrained(config=DFlashConfig(prompt_cache_bytes=0))
    rt.step_s = 1.0  # the pacer on (AlwaysPaused ignores the cost)
    costs = load_or_measure(rt.model, rt.target, str(target_model_dtype(rt.model)),
                            rt.draft.args.target_layer_ids, rt.plan.block_size)["costs_ms"]
    rows = []
    for suite in SUITES:
        for prompt in load_prompts(suite=suite, limit=args.limit)[0]:
            spans = list(rt.stream_generate(encode(rt, prompt), args.max_tokens))
            result = spans[-1].result
            cycles = [s.cycle for s in spans[:-1] if s.cycle is not None]
            looked = [c for c in cycles if c.block_size > 1]
            cost = sum(costs[c.block_size - 1] for c in cycles) / costs[0]
            rows.append({"suite": suite, "prompt_id": prompt.id, "tokens": len(result.tokens),
                         "lookup_verifies": len(looked),
                         "lookup_tokens": sum(c.committed for c in looked),
                         "lookup_verified": sum(c.block_size for c in looked),
                         "cost_with_lookup_plain_steps": round(cost, 1),
                         # without the lookup: one plain step per token after the first
                         "cost_plain_steps_only": len(result.tokens) - 1,
                         "plain_only_over_with_lookup": round((len(result.tokens) - 1) / cost,
                                                              3)})
            print(rows[-1], file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    report = {"command": "python " + shlex.join(sys.argv), "what": __doc__, "commit": commit,
              "date": time.strftime("%Y-%m-%d %H:%M"), "load_average": os.getloadavg(),
              "verify_costs_ms": costs, "rows": rows,
              "plain_only_over_with_lookup_min": min(r["plain_only_over_with_lookup"]
                                                     for r in rows)}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
