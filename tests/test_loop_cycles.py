"""scripts/loop_cycles.py: a decode's cycles split at the reply's loop."""

from __future__ import annotations

import json

import pytest
from script_modules import load_script

study = load_script("loop_cycles")

FRESH = list(range(100, 180))  # 80 distinct tokens: no repeated 4-gram
LOOP = [1, 2, 3, 4, 5, 6, 7, 8] * 12  # the same 8 tokens over and over


def test_cycles_reaching_into_the_loop_count_as_the_loops():
    reply = FRESH + LOOP
    start = study.loop_start(reply)
    assert start == 121  # where the trailing 64 tokens turn more than half repeats
    # token 0 from prefill, 80 tokens in 2s, then 15s: 81-95 and 96-110 end before 121,
    # 111-125 reaches into the loop
    cycles = [2] * 40 + [15] * 6
    before, inside = study.split_cycles(reply, cycles)
    assert before == [2] * 40 + [15] * 2 and inside == [15] * 4
    assert study.split_cycles(FRESH, [3] * 5) == ([3] * 5, [])  # no loop: all before


def test_the_report_pools_each_side_per_suite(tmp_path, capsys):
    walk = tmp_path / "walk.json"
    runs = [{"reply": FRESH + LOOP, "real_cycles": [2] * 40 + [15] * 6},
            {"reply": FRESH, "real_cycles": [1] * 79}]
    walk.write_text(json.dumps({"drafts": {"D": {"gsm8k": {"runs": runs}}}}))
    out = tmp_path / "loops.json"
    assert study.main([str(walk), "--json", str(out)]) == 0
    row = json.loads(out.read_text())["sets"]["gsm8k"]
    assert row["before_loop"] == {"cycles": 121, "tokens": 189, "tokens_per_cycle": 189 / 121}
    assert row["in_loop"] == {"cycles": 4, "tokens": 60, "tokens_per_cycle": 15.0}
    assert row["looping_replies"] == 1 and row["replies"] == 2
    assert "in the loop 15.00" in capsys.readouterr().out


def test_a_report_without_replies_is_refused(tmp_path, capsys):
    walk = tmp_path / "walk.json"
    walk.write_text(json.dumps({"drafts": {"D": {"gsm8k": {"runs": [{"tokens": 9}]}}}}))
    with pytest.raises(SystemExit):
        study.main([str(walk)])
    assert "--walk" in capsys.readouterr().err
