"""scripts/block_size_bound.py: a larger block's figure from a walk report's anchor runs."""

from __future__ import annotations

import json

import pytest
from script_modules import load_script

bound = load_script("block_size_bound")


def test_only_full_runs_are_stretched():
    assert bound.stretched_runs([15, 3, 0, 14, 15], 16, 32) == [31, 3, 0, 14, 31]


def test_a_reply_drafted_whole_needs_fewer_cycles_with_larger_blocks():
    n = 65  # 64 anchors, each with a full run of a 16-token block
    row = bound.suite_bound([{"anchor_runs": [15] * (n - 1)}], 16, [32, 64])
    assert row["full_run_share"] == 1.0
    assert row["walk"] == {"16": 16.0, "32": 32.0, "64": 64.0}


def test_a_reply_without_full_runs_reads_the_same_at_every_size():
    runs = [2, 0, 5, 1, 14, 3, 0, 0, 7]
    row = bound.suite_bound([{"anchor_runs": runs}], 16, [32])
    assert row["full_run_share"] == 0.0
    assert row["walk"]["16"] == row["walk"]["32"] > 1.0


def test_a_report_without_anchor_runs_is_refused(tmp_path, capsys):
    report = tmp_path / "walk.json"
    report.write_text(json.dumps({"drafts": {"D": {"gsm8k": {"runs": [{"tokens": 9}]}}}}))
    with pytest.raises(SystemExit):
        bound.main([str(report), "--block", "32"])
    assert "--walk" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bound.main([str(report), "--draft", "E", "--block", "32"])
    assert "no draft 'E'" in capsys.readouterr().err
