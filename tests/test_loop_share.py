"""scripts/loop_share.py: how much of a training set's answers repeats earlier text, and what
those slots weigh in a draft's training loss."""

from __future__ import annotations

import json

import numpy as np
from script_modules import load_script

from engine.train.dataset import Dataset

study = load_script("loop_share")


def test_shares_count_the_reply_tokens_that_end_a_repeated_4gram():
    # prompt 1 2 3 4 5 | reply 9 x 6: the 4-gram 9 9 9 9 ends at positions 8, 9 and 10 of the
    # sequence, and is a repeat at 9 and 10: 2 of the reply's 6 tokens; the metric counts the
    # reply's own 4-grams, (9 9 9 9) three times, two of them repeats
    row = study.shares(Dataset([[1, 2, 3, 4, 5] + [9] * 6], [5]), limit=10)
    assert row["answers"] == 1 and row["mean_reply_tokens"] == 6
    assert row["repeated_token_share"] == 2 / 6
    assert row["repeat4_share_token_weighted"] == 2 / 3


def test_the_loss_split_covers_every_slot(tiny_pairs, tmp_path, capsys):
    target, draft = tiny_pairs("llama")
    rng = np.random.default_rng(0)
    fresh = [rng.integers(4, 200, size=20).tolist() for _ in range(4)]
    data = tmp_path / "data.npz"
    Dataset([[1, 2, 3] + f + f for f in fresh], [3] * 4).save(data)
    split = study.loss_split(Dataset.load(data), *study.load_pair(str(target), str(draft)),
                             sample=4)
    assert split["answers"] == 4
    parts = split["repeated"], split["novel"]
    assert abs(sum(p["loss_share"] for p in parts) - 1) < 1e-6
    assert abs(sum(p["weight_share"] for p in parts) - 1) < 1e-6
    assert all(0 < p["weight_share"] < 1 and 0 <= p["slot_accuracy"] <= 1 for p in parts)

    out = tmp_path / "out.json"
    study.main([str(data), "--draft", str(draft), "--model", str(target), "--sample", "2",
                "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["sets"]["data.npz"]["loss_split"]["answers"] == 2
    assert "repeated slots" in capsys.readouterr().out
