"""The documentation stays readable and true to its sources: README.md short, no table cell
that runs on, links that lead somewhere, and the README's results table exactly what
scripts/results_table.py makes from the benchmark reports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
MAX_README_LINES = 300
MAX_CELL = 300


def markdown_files() -> list[Path]:
    """Every .md file git tracks or would (every .md outside hidden folders without git)."""
    try:
        names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
                                "--exclude-standard", "*.md"], check=True,
                               capture_output=True, text=True).stdout.split()
        return [ROOT / n for n in names if (ROOT / n).exists()]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*.md")
                if not any(part.startswith(".") or "venv" in part
                           for part in p.relative_to(ROOT).parts)]


def table_cells(text: str) -> list[tuple[int, str]]:
    """(line number, cell) for every cell of every Markdown table row in `text`."""
    cells = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line.startswith("|") and line.endswith("|") and len(line) > 1:
            cells += [(number, c.strip()) for c in re.split(r"(?<!\\)\|", line[1:-1])]
    return cells


def test_table_cells_split_on_unescaped_bars():
    text = "intro | not a row\n| a | b \\| c |\n|---|---|\n"
    assert table_cells(text) == [(2, "a"), (2, "b \\| c"), (3, "---"), (3, "---")]


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move depth to docs/"


def test_no_table_cell_runs_over_300_characters():
    files = markdown_files()
    assert ROOT / "README.md" in files and len(files) > 5
    long = [f"{p.relative_to(ROOT)}:{n}: {len(c)} characters"
            for p in files for n, c in table_cells(p.read_text()) if len(c) > MAX_CELL]
    assert long == []


def test_relative_links_in_readme_and_docs_lead_to_files():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 10
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)|src=\"([^\"]+)\"", page.read_text()):
            link = next(t for t in target if t).split("#")[0]
            if link and "://" not in link and not (page.parent / link).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {link}")
    assert broken == []


def test_readme_results_table_is_what_the_script_makes_from_the_reports():
    results = load_script("results_table")
    table = results.table()
    assert [p.relative_to(ROOT).as_posix() for p in results.PAGES] == [
        "README.md", "benchmarks/README.md"]
    for page in results.PAGES:
        text = page.read_text()
        assert text.count(results.START) == text.count(results.END) == 1
        assert results.embed(text, table) == text, (
            f"{page.name}'s results table is not the reports': run python "
            "scripts/results_table.py --write")


def test_results_table_has_three_rows_per_suite_and_says_what_is_pending(tiny_pairs, tmp_path):
    from engine.bench.compare import benchmark_main

    results = load_script("results_table")
    target, draft = tiny_pairs("llama")
    out = tmp_path / "cpu-gsm8k.json"
    assert benchmark_main(["--model", str(target), "--draft", str(draft), "--prompt", "Hi",
                           "--max-tokens", "8", "--plain-engine", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    text = results.table(tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[1] for r in rows[1:]] == [
        "mlx-lm", "dflash, speculation off", "**DFlash**"]
    assert rows[1].startswith("| GSM8K | mlx-lm |")
    s = report["summary"]
    assert f"**{s['speedup_median']:.2f}x**" in rows[3]
    assert f"{s['tokens_per_cycle_nonloop_mean']:.2f}" in rows[3]
    heading = text.split("\n")[0]
    assert report["timestamp"][:10] in heading and "1 prompts per suite" in heading
    assert "load average" in heading  # a busy machine's timings say so
    if report["git"]:
        assert report["git"]["commit"][:7] in heading
    assert "**H100 / H200**: pending re-measurement at this code" in text
    assert "MT-Bench, HumanEval: not measured at this code on this device yet." in text
    # A report without the speculation-off side cannot fill the table.
    del report["summary"]["plain_engine_tokens_per_second_median"]
    out.write_text(json.dumps(report))
    try:
        results.table(tmp_path)
    except SystemExit as exc:
        assert "--plain-engine" in str(exc)
    else:
        raise AssertionError("a report without --plain-engine made a table")


def test_embed_replaces_only_the_text_between_the_markers():
    results = load_script("results_table")
    readme = f"top\n{results.START}\nold\n{results.END}\nbottom\n"
    assert results.embed(readme, "new") == f"top\n{results.START}\nnew\n{results.END}\nbottom\n"
