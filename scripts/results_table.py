"""The README's results table, made from the benchmark reports in benchmarks/results/.

    python scripts/results_table.py            # print it
    python scripts/results_table.py --write    # put it into README.md and benchmarks/README.md

Per device, per suite, three rows timed in one run of `dflash benchmark --plain-engine`:
mlx-lm's own decoding, this engine with speculation off, DFlash. The reports are made by

    for S in mt-bench humaneval gsm8k; do
      python -m engine.cli benchmark --suite $S --limit 8 --plain-engine \\
          --json benchmarks/results/cpu-$S.json          # gpu-$S.json on an H100 / H200
    done

Each device's heading names the machine, the date and the commit the reports record. A
device with no reports says so, and where the last measurement of it lives in git history.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = (ROOT / "README.md", ROOT / "benchmarks" / "README.md")  # each holds the markers
START = "<!-- results-table: made by scripts/results_table.py from benchmarks/results/ -->"
END = "<!-- results-table end -->"
SUITES = (("mt-bench", "MT-Bench"), ("humaneval", "HumanEval"), ("gsm8k", "GSM8K"))
# (file prefix, heading, where its last measurement lives when there is none at this code)
DEVICES = (
    ("cpu", "2-core CPU", "the last CPU suite rows (2-core Intel Xeon, 2026-12-05, stage 41, an "
                          "older engine) are in git history: `git show 790e14c:benchmarks/"
                          "stage41/smollm2-mt-bench-8-cpu.json` and its neighbours"),
    ("gpu", "H100 / H200", "the last GPU suite rows (one H200, 2026-12-04, stage 36, an older "
                           "engine) are in git history: `git show 5f62070:benchmarks/stage36/"
                           "h200-run1/smollm2-mt-bench-shipped-h200.json` and its neighbours"),
)
HEADER = ("| suite | decoding | tok/s | vs mlx-lm | tokens/cycle | non-loop | repeated 4-grams "
          "| same tokens as mlx-lm |\n|---|---|---|---|---|---|---|---|")


def _match(value: bool | None, summary: dict | None = None) -> str:
    if value is None:
        return "n/a (sampled)"
    if value:
        return "yes"
    if summary and summary.get("divergences_all_near_ties"):
        return f"near-ties only (gap <= {summary['near_tie_gap_max']:.3f})"
    return "NO"


def suite_rows(name: str, report: dict) -> list[str]:
    s = report["summary"]
    if "plain_engine_tokens_per_second_median" not in s:
        raise SystemExit(f"{name}: no speculation-off side; run it with --plain-engine")
    return [
        f"| {name} | mlx-lm | {s['baseline_tokens_per_second_median']:.1f} | 1.00x | | | | |",
        f"| | dflash, speculation off | {s['plain_engine_tokens_per_second_median']:.1f} | "
        f"{s['plain_engine_speedup_median']:.2f}x | | | | "
        f"{_match(s['plain_engine_token_match'])} |",
        f"| | **DFlash** | {s['dflash_tokens_per_second_median']:.1f} | "
        f"**{s['speedup_median']:.2f}x** | {s['tokens_per_cycle_mean']:.2f} | "
        f"{s['tokens_per_cycle_nonloop_mean']:.2f} | {s['repeat4_share_mean']:.2f} | "
        f"{_match(s['token_match'], s)} |",
    ]


def where(reports: list[dict]) -> str:
    """Machine, dtype, prompts, dates and commits of one device's reports."""
    first = reports[0]
    m = first["machine"]
    machine = m.get("gpu") or f"{m.get('processor') or '?'}, {m.get('cpu_count')} cores"
    dates = sorted({r["timestamp"][:10] for r in reports})
    commits = sorted({(r.get("git") or {}).get("commit", "?")[:7]
                      + ("+changes" if (r.get("git") or {}).get("dirty") else "")
                      for r in reports})
    prompts = sorted({str(r["summary"]["runs"]) for r in reports})
    loads = [x[0] for r in reports for x in (r.get("load_average_before"),
                                             r["machine"].get("load_average")) if x]
    load = f", load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    return (f"{machine}, {first['backend']} {first['dtype']}; {'/'.join(prompts)} prompts per "
            f"suite, replies of up to {first['settings']['max_tokens']} tokens, "
            f"{'greedy' if first['settings']['greedy'] else 'sampled'}; measured "
            f"{', '.join(dates)} at commit {', '.join(commits)}{load}")


def table(results: Path = RESULTS) -> str:
    parts = []
    for prefix, heading, history in DEVICES:
        found = [(title, results / f"{prefix}-{suite}.json") for suite, title in SUITES]
        found = [(title, json.loads(p.read_text())) for title, p in found if p.exists()]
        if not found:
            parts.append(f"**{heading}**: pending re-measurement at this code; {history}.")
            continue
        parts.append(f"**{heading}** ({where([r for _, r in found])}):\n\n{HEADER}")
        parts[-1] += "".join("\n" + row for title, r in found for row in suite_rows(title, r))
        measured = {title for title, _ in found}
        missing = [title for _, title in SUITES if title not in measured]
        if missing:
            parts[-1] += f"\n\n{', '.join(missing)}: not measured at this code on this device yet."
    return "\n\n".join(parts)


def embed(readme: str, text: str) -> str:
    """`readme` with `text` between the markers (each on a line of its own)."""
    head, start, rest = readme.partition(START + "\n")
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"no markers {START!r} ... {END!r} to write the table between")
    return f"{head}{start}{text}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true",
                    help="rewrite the table in README.md and benchmarks/README.md")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the reports' folder")
    args = ap.parse_args(argv)
    text = table(args.results)
    if args.write:
        for page in PAGES:
            page.write_text(embed(page.read_text(), text))
            print(f"wrote the results table into {page.relative_to(ROOT)}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
