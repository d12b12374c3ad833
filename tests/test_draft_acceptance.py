"""scripts/draft_acceptance.py: the per-suite means and their standard errors."""

from __future__ import annotations

import json
import math

from script_modules import load_script

acceptance = load_script("draft_acceptance")


def test_the_standard_error_is_the_spread_of_the_mean_over_the_runs_it_counts():
    runs = [{"tokens_per_cycle": 2.0}, {"tokens_per_cycle": 4.0},
            {"tokens_per_cycle": 6.0}, {"tokens_per_cycle": None}]
    assert acceptance.mean(runs, "tokens_per_cycle") == 4.0
    # sample standard deviation 2 over three runs (the None one not counted)
    assert math.isclose(acceptance.standard_error(runs, "tokens_per_cycle"), 2 / math.sqrt(3))
    assert acceptance.standard_error(runs[:1], "tokens_per_cycle") is None


def test_check_plain_records_each_reply_identical_and_fails_on_a_difference(
        tiny_pairs, tmp_path, monkeypatch):
    target, draft = tiny_pairs("llama")
    args = ["--model", str(target), "--draft", str(draft), "--suite", "gsm8k", "--limit", "2",
            "--max-tokens", "12", "--check-plain"]
    report = tmp_path / "same.json"
    assert acceptance.main([*args, "--json", str(report)]) == 0
    rows = json.loads(report.read_text())["drafts"][str(draft)]["gsm8k"]
    assert rows["token_match"] is True
    assert [r["first_mismatch"] for r in rows["runs"]] == [None, None]

    plain = acceptance.run_baseline

    def one_token_off(*a, **k):
        side = plain(*a, **k)
        side.tokens[3] += 1
        return side

    monkeypatch.setattr(acceptance, "run_baseline", one_token_off)
    report = tmp_path / "differs.json"
    assert acceptance.main([*args, "--json", str(report)]) == 1
    rows = json.loads(report.read_text())["drafts"][str(draft)]["gsm8k"]
    assert rows["token_match"] is False
    assert [r["first_mismatch"] for r in rows["runs"]] == [3, 3]


def test_every_cycle_speculates_where_the_engine_would_pause(tiny_pairs, tmp_path, monkeypatch):
    """Tokens/cycle measures the draft: cycles the engine would pause (plain steps timed as
    nearly free, so no cycle pays) still speculate."""
    import engine.runtime

    monkeypatch.setattr(engine.runtime, "plain_step_s", lambda *a, **k: 1e-9)
    target, draft = tiny_pairs("llama")
    report = tmp_path / "acceptance.json"
    assert acceptance.main(["--model", str(target), "--draft", str(draft), "--suite", "gsm8k",
                            "--limit", "1", "--max-tokens", "60", "--json", str(report)]) == 0
    runs = json.loads(report.read_text())["drafts"][str(draft)]["gsm8k"]["runs"]
    assert [r["pauses"] for r in runs] == [0]


def test_the_report_keeps_lists_of_numbers_on_one_line():
    """Per-anchor runs would put one number on each line: the same JSON, a fraction of the
    lines."""
    report = {"command": "x [1, 2]", "drafts": {"d": {"runs": [
        {"anchor_runs": [0, 3, 15], "walk": -1.5e-3, "reply": "a\n[b]"}]}}}
    text = acceptance.report_text(report)
    assert json.loads(text) == report
    assert '"anchor_runs": [0, 3, 15]' in text and len(text.splitlines()) < 20
