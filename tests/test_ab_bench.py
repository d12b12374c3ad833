"""scripts/ab_bench.py on a tiny pair: two settings of one checkout, side by side."""

from __future__ import annotations

import json
from pathlib import Path

from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_engine_args_set_one_sides_engine(tiny_pairs, tmp_path):
    """--engine-args gives a side its own engine flags: the same folder serves both sides, the
    report records each side's flags and engine, and greedy tokens agree."""
    target, draft = tiny_pairs("llama")
    ab_bench = load_script("ab_bench")
    report = tmp_path / "ab.json"
    code = ab_bench.main(["--checkout", f"auto={ROOT}", "--checkout", f"nolookup={ROOT}",
                          "--engine-args", "nolookup=--lookup off --pause off",
                          "--model", str(target), "--draft", str(draft), "--suite", "gsm8k",
                          "--limit", "1", "--max-tokens", "12", "--no-baseline",
                          "--json", str(report)])
    assert code == 0
    sides = json.loads(report.read_text())["checkouts"]
    assert sides["auto"]["engine_args"] == "" and sides["auto"]["model"]["lookup_min_match"]
    assert sides["nolookup"]["engine_args"] == "--lookup off --pause off"
    assert sides["nolookup"]["model"]["lookup_min_match"] is None


def test_a_copy_inside_another_repository_records_no_commit():
    """A side that is a copy unpacked inside another repository (say `git archive` into an
    ignored folder) must not report that repository's commit as its own."""
    ab_bench = load_script("ab_bench")
    assert ab_bench.commit_of(ROOT / "engine").startswith("not a git checkout")
