"""Print the README's benchmark table from the JSON files in benchmarks/ (never typed in).

    python scripts/bench_table.py benchmarks/smollm2-*-cpu.json benchmarks/smollm2-*-h200.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(path: Path) -> str:
    report = json.loads(path.read_text())
    s = report["summary"]
    machine = report["machine"].get("gpu") or report["machine"].get("processor") or "?"
    cores = report["machine"].get("cpu_count")
    extra = f", {cores} cores" if report["backend"] == "cpu" else ""
    where = f"{report['backend']} ({machine}{extra})"
    suite = path.stem.split("-", 1)[1].rsplit("-", 1)[0]  # smollm2-<suite...>-<machine>
    return (f"| {suite} ({path.name}) | {where}, {report['dtype']} | {s['runs']} | "
            f"{report['settings']['max_tokens']} | {s['baseline_tokens_per_second_median']:.1f} | "
            f"{s['dflash_tokens_per_second_median']:.1f} | {s['speedup_median']:.2f}x | "
            f"{s['acceptance_rate_mean']:.1%} | {s['tokens_per_cycle_mean']:.2f} | "
            f"{s['tokens_per_cycle_nonloop_mean']:.2f} | {s['repeat4_share_mean']:.2f} | "
            f"{'yes' if s['token_match'] else 'NO'} |")


def main(paths: list[str]) -> None:
    print("| run | backend, dtype | prompts | max tokens | mlx_lm tok/s | DFlash tok/s | "
          "speed-up | acceptance | tokens/cycle | tokens/cycle non-loop | repeated 4-grams | "
          "token match |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in paths:
        print(row(Path(p)))


if __name__ == "__main__":
    main(sys.argv[1:])
