"""scripts/sure_miss_study.py: the walk with the target's sure tokens made right, and the
short look back's rows."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from script_modules import SCRIPTS, load_script

sys.path.insert(0, str(SCRIPTS))  # sure_miss_study imports two other scripts, as when run

study = load_script("sure_miss_study")


def test_only_valid_slots_the_target_is_sure_of_become_right():
    hits = np.array([[True, False, False], [False, False, False]])
    valid = np.array([[True, True, True], [True, True, False]])
    # prompt of 2 tokens; confidence[p] is the target's probability of the token at p + 1
    confidence = np.array([0.1, 0.2, 0.5, 0.95, 0.3, 0.99])
    made = study.sure_hits(hits, valid, confidence, prompt_len=2, sure=0.9)
    # row 0: slots predict tokens 3, 4, 5 (confidence[2], [3], [4]); row 1: tokens 4, 5, 6
    assert made.tolist() == [[True, True, False], [True, False, False]]
    assert study.sure_hits(hits, valid, confidence, 2, 0.0).tolist() == valid.tolist()


def test_the_walk_counts_one_cycle_per_run_and_miss():
    n = 6  # reply tokens: anchors 0..4
    none = np.zeros((n - 1, 3), bool)
    valid = np.ones((n - 1, 3), bool)
    walk = study.walk_tokens_per_cycle
    assert walk([(study.hit_runs(none, valid), n)]) == 5 / 5
    assert walk([(study.hit_runs(valid, valid), n)]) == 5 / 2  # 4 tokens, then the last one


def test_windows_end_at_their_anchor_and_clamp_at_the_start():
    seq = [7, 8, 9, 10]
    assert study.windows(seq, np.array([0, 2, 3]), 3).tolist() == [[7, 7, 7], [7, 8, 9],
                                                                   [8, 9, 10]]


def test_a_report_without_replies_is_refused(tmp_path, capsys):
    report = tmp_path / "walk.json"
    report.write_text(json.dumps({"drafts": {"D": {"gsm8k": {"runs": [{"tokens": 9}]}}}}))
    with pytest.raises(SystemExit):
        study.main([str(report)])
    assert "--walk" in capsys.readouterr().err
