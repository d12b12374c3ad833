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


def test_the_lookup_run_is_how_far_the_reply_repeats_what_followed_last_time():
    # prompt [1, 2, 3, 4]; the reply repeats it: from the anchor at 5 (token 1 again) a
    # 1-token match proposes what followed the last 1: 2, 3, 4, 1, ...
    seq = [1, 2, 3, 4, 9, 1, 2, 3, 4, 7]
    runs = study.lookup_runs(seq, prompt_len=4, count=3, min_match=1)
    # anchors 4..8: after 9 nothing (no earlier 9); after 1 -> 2 3 4 (the reply's 2 3 4: 3);
    # after 2 -> 3 4 9 against 3 4 7 (2); after 3 -> 4 9 1 against 4 7 (1); after 4 -> 9
    # against 7 (0)
    assert runs.tolist() == [0, 3, 2, 1, 0]
    # with the engine's min match of 5, a 2-token match is still proposed (the lookup's
    # short match, an alternative to the draft): (1, 2) at anchor 6, (2, 3) at 7, (3, 4) at 8
    assert study.lookup_runs(seq, 4, 3, min_match=5).tolist() == [0, 0, 2, 1, 0]


def test_the_reply_mean_weighs_each_reply_once():
    short = (np.array([4, 0, 0, 0]), 5)  # after token 0, one cycle of 4 tokens
    long = (np.zeros(9, np.int64), 10)  # after token 0, nine cycles of one
    assert study.mean_reply_tokens_per_cycle([short, long]) == (4 + 1) / 2
    assert study.walk_tokens_per_cycle([short, long]) == 13 / 10  # pooled: by tokens
