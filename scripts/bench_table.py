"""Print the README's benchmark tables from the JSON files in benchmarks/ (never typed in).

    python scripts/bench_table.py benchmarks/smollm2-*-cpu.json benchmarks/smollm2-*-h200.json
    python scripts/bench_table.py benchmarks/smollm2-{mt-bench,humaneval,gsm8k}-t0.7-cpu.json
    python scripts/bench_table.py --synthetic benchmarks/synthetic-*.json

A file named but not there yet gets a "not measured yet" row, so a table can be printed before
its runs and printed again after them by the same command. Sampled runs (--temperature > 0)
have no token match (outputs differ by design): "n/a (sampled)". A bf16/fp16 run whose every
divergence from the baseline is a near-tie says so, with the largest logit gap.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def match(summary: dict) -> str:
    """`yes`, or for bf16/fp16 runs whose divergences were all near-ties, how many runs
    diverged and the largest top-1 minus top-2 gap (the README's lossless rule)."""
    value = summary["token_match"]
    if value is None:
        return "n/a (sampled)"
    if value:
        return "yes"
    if summary.get("divergences_all_near_ties"):
        return (f"near-ties only ({summary['divergences']} of {summary['runs']} runs, "
                f"gap <= {summary['near_tie_gap_max']:.3f})")
    return "NO"


def row(path: Path) -> str:
    suite = path.stem.split("-", 1)[1].rsplit("-", 1)[0]  # smollm2-<suite...>-<machine>
    if not path.exists():
        return f"| {suite} ({path.name}) | not measured yet |" + " |" * 10
    report = json.loads(path.read_text())
    s = report["summary"]
    machine = report["machine"].get("gpu") or report["machine"].get("processor") or "?"
    cores = report["machine"].get("cpu_count")
    extra = f", {cores} cores" if report["backend"] == "cpu" else ""
    where = f"{report['backend']} ({machine}{extra})"
    return (f"| {suite} ({path.name}) | {where}, {report['dtype']} | {s['runs']} | "
            f"{report['settings']['max_tokens']} | {s['baseline_tokens_per_second_median']:.1f} | "
            f"{s['dflash_tokens_per_second_median']:.1f} | {s['speedup_median']:.2f}x | "
            f"{s['acceptance_rate_mean']:.1%} | {s['tokens_per_cycle_mean']:.2f} | "
            f"{s['tokens_per_cycle_nonloop_mean']:.2f} | {s['repeat4_share_mean']:.2f} | "
            f"{match(s)} |")


def _median(report: dict, key: str) -> str:
    """" (median of N: ...)" where the run timed N pairs (--repeat), else nothing."""
    if "repeats" not in report:
        return ""
    return f" (median of {len(report['repeats'])}: {report[key + '_median']:.2f}x)"


def synthetic_row(path: Path) -> str:
    r = json.loads(path.read_text())
    f, d, b = r["forward"], r["dflash"], r["baseline"]
    return (f"| {r['model']} ({path.name}) | {r['backend']}, {r['dtype']}, kernels "
            f"{r['kernels']} | {f['ctx']} | {f['t_ar_s'] * 1e3:.1f} | "
            f"{f['verify16_over_ar']:.2f} | {d['tokens_per_cycle']:.2f} | "
            f"{b['decode_tokens_per_second']:.1f} | {d['decode_tokens_per_second']:.1f} | "
            f"{r['decode_speedup']:.2f}x{_median(r, 'decode_speedup')} | {r['speedup']:.2f}x"
            f"{_median(r, 'speedup')} | "
            f"{'yes' if r['token_match'] else 'NO'} |")


def main(paths: list[str]) -> None:
    if paths and paths[0] == "--synthetic":
        print("| SYNTHETIC run | backend, dtype | ctx | T_ar ms | T_verify16 / T_ar | "
              "tokens/cycle (oracle) | mlx_lm decode tok/s | DFlash decode tok/s | "
              "decode speed-up | end-to-end speed-up | token match |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for p in paths[1:]:
            print(synthetic_row(Path(p)))
        return
    print("| run | backend, dtype | prompts | max tokens | mlx_lm tok/s | DFlash tok/s | "
          "speed-up | acceptance | tokens/cycle | tokens/cycle non-loop | repeated 4-grams | "
          "token match |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in paths:
        print(row(Path(p)))


if __name__ == "__main__":
    main(sys.argv[1:])
