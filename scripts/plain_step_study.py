"""Would plain steps after a poor cycle pay on the GPU? A simulation on recorded benchmark runs.

Each run's `cycle_tokens` (tokens committed per cycle) and its timings give a cycle's cost in
plain steps (C = cycle time / mlx-lm's time per token). The policy: after a cycle that
committed at most `m` tokens, decode the next `k` tokens with plain steps (cost `plain` each),
then speculate again. A cycle that starts inside a recorded cycle's agreeing run is taken to
commit the rest of that run (the draft cannot know more). The oracle bound spends
min(C, t) on every recorded cycle of t tokens (it knows each outcome beforehand).

    python scripts/plain_step_study.py \
        benchmarks/smollm2-{mt-bench-writing,humaneval,gsm8k}-h200.json \
        --json benchmarks/stage16/plain-step-study-h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

POLICIES = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4)]  # (m, k)


def simulated_cost(cycle_tokens: list[int], cycle_cost: float, plain: float, m: int, k: int
                   ) -> float:
    """Plain-step units to commit the run's tokens under the (m, k) policy."""
    run_end = [start + t for start, t in zip(running_starts(cycle_tokens), cycle_tokens)
               for _ in range(t)]
    pos, cost, last = 0, 0.0, None
    while pos < len(run_end):
        if last is not None and last <= m:
            steps = min(k, len(run_end) - pos)
            cost, pos, last = cost + plain * steps, pos + steps, None
            continue
        last = run_end[pos] - pos
        cost, pos = cost + cycle_cost, pos + last
    return cost


def running_starts(cycle_tokens: list[int]) -> list[int]:
    starts, total = [], 0
    for t in cycle_tokens:
        starts.append(total)
        total += t
    return starts


def study(path: Path, plain: float) -> dict:
    report = json.loads(path.read_text())
    runs = []
    for run in report["runs"]:
        dflash, base = run["dflash"], run["baseline"]
        tokens = dflash["cycle_tokens"]
        cycle_s = dflash["generated_tokens"] / dflash["decode_tokens_per_second"] / len(tokens)
        cost = cycle_s * base["decode_tokens_per_second"]  # in plain steps
        row = {"prompt_id": run["prompt_id"], "cycle_cost_steps": cost,
               "speculative": sum(tokens) / (cost * len(tokens)),
               "oracle_bound": sum(tokens) / sum(min(cost, t) for t in tokens)}
        for m, k in POLICIES:
            row[f"m{m}_k{k}"] = sum(tokens) / simulated_cost(tokens, cost, plain, m, k)
        runs.append(row)
    keys = [k for k in runs[0] if k != "prompt_id"]
    return {"file": str(path), "medians": {k: statistics.median(r[k] for r in runs) for k in keys},
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="dflash benchmark JSON reports")
    p.add_argument("--plain", type=float, default=1.0,
                   help="a plain step's cost in mlx-lm steps (default 1)")
    p.add_argument("--json", help="write the study here")
    args = p.parse_args(argv)
    out = {"command": "python " + " ".join(sys.argv), "plain_step_cost": args.plain,
           "policies": "after a cycle of <= m tokens, k plain steps; speed-ups vs mlx-lm",
           "studies": [study(Path(f), args.plain) for f in args.files]}
    for s in out["studies"]:
        print(Path(s["file"]).name, " ".join(f"{k} {v:.2f}" for k, v in s["medians"].items()
                                              if k != "cycle_cost_steps"))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
