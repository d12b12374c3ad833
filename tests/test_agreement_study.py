"""scripts/agreement_by_confidence.py: the draft's first-slot agreement per bucket of the
target's confidence."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from script_modules import load_script

from engine import DFlashRuntime
from engine.train.dataset import Dataset

study = load_script("agreement_by_confidence")


def test_buckets_hold_their_lower_edge():
    c = np.array([0.0, 0.29, 0.3, 0.5, 0.95, 0.99, 0.999, 1.0])
    assert study.buckets(c).tolist() == [0, 0, 1, 2, 4, 5, 5, 5]


def test_novelty_says_where_the_context_holds_the_pair_to_copy():
    # prompt 1 2 3 | reply 9 1 2 9 4 9 4: tokens after the first reply token, each with the
    # anchor before it: (9,1) new, (1,2) in the prompt, (2,9) new, (9,4) new, (4,9) new,
    # (9,4) earlier in the reply
    seq, prompt_len = [1, 2, 3, 9, 1, 2, 9, 4, 9, 4], 3
    assert study.novelty(seq, prompt_len).tolist() == [0, 1, 0, 0, 0, 2]


def test_cycles_start_one_past_each_run_and_are_bucketed_by_their_anchor_token():
    runs = np.array([2, 0, 0, 1, 5, 0, 3])  # cycles from 0 (commits 3), 3 (2), 5 (1), 6
    assert study.walk_starts(runs).tolist() == [0, 3, 5, 6]
    c = np.array([0.1, 0.95, 0.4, 0.999, 0.2, 0.6])  # anchor i's token: c[i - 1]
    row = study.by_anchor([c], [runs])
    assert row["anchors"] == 6 and row["walk_starts"] == 3  # starts 3, 5, 6: c 0.4, 0.2, 0.6
    assert row["share_walk"] == [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0, 0.0]
    assert abs(sum(row["share_all"]) - 1) < 1e-9
    assert row["mean_run"][0] == 0.0 and row["agree"][0] == 0.0  # anchors 1 and 5
    assert row["mean_run"][5] == 5.0 and row["agree"][5] == 1.0  # anchor 4 (c[3] = 0.999)
    assert row["mean_run"][3] is None  # no anchor token in [0.7, 0.9)


def test_confidence_is_the_one_for_the_token_the_first_slot_predicts(tiny_pairs):
    target, draft = tiny_pairs("llama")
    model = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft)).model
    seq, prompt_len = list(range(3, 23)), 6
    confidence = study.target_confidence(model, seq, prompt_len)
    assert len(confidence) == len(seq) - 1 - prompt_len  # anchors prompt_len .. len - 2
    for i in (0, 5, len(confidence) - 1):  # token prompt_len + 1 + i, from the prefix before
        logits = model(mx.array(seq[: prompt_len + 1 + i])[None])[0, -1].astype(mx.float32)
        assert abs(mx.softmax(logits).max().item() - confidence[i]) < 1e-5


def test_report_on_a_tiny_pair(tiny_pairs, tmp_path):
    target, draft = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    prompt = [5, 9, 14, 2, 7]
    reply = list(rt.generate(prompt, max_tokens=24, no_eos=True).tokens)
    walk = tmp_path / "walk.json"
    walk.write_text(json.dumps({"drafts": {str(draft): {"mt-bench": {"runs": [
        {"prompt_tokens": prompt, "reply": reply}]}}}}))
    out = tmp_path / "agree.json"
    assert study.main([str(walk), "--model", str(target), "--draft", str(draft),
                       "--json", str(out)]) == 0
    row = json.loads(out.read_text())["sets"]["mt-bench"]
    assert row["tokens"] == len(reply) - 1
    assert abs(sum(row["bucket_share"]) - 1) < 1e-9
    d = row["drafts"][str(draft)]
    by = [(s, a) for s, a in zip(row["bucket_share"], d["agree_by_bucket"]) if s > 0]
    assert all(a is not None and 0 <= a <= 1 for _, a in by)
    assert abs(sum(s * a for s, a in by) - d["agree"]) < 1e-9  # buckets add up to the whole
    assert abs(sum(row["novelty_share"].values()) - 1) < 1e-9
    assert set(d["agree_sure_by_novelty"]) == {"new", "in_prompt", "in_reply"}
    anchors = d["by_anchor_confidence"]
    assert anchors["anchors"] == len(reply) - 2 and anchors["walk_starts"] >= 1
    assert abs(sum(anchors["share_walk"]) - 1) < 1e-9
    heldout = tmp_path / "heldout.npz"
    Dataset([prompt + reply, prompt[:3] + reply[:10], prompt + reply[:12]], [5, 3, 5],
            {"ids": ["sharegpt-7", "pycode-2", "sharegpt-9"]}).save(heldout)
    assert study.main([str(walk), "--model", str(target), "--draft", str(draft), "--heldout",
                       str(heldout), "--by-source", "--json", str(out)]) == 0
    sets = json.loads(out.read_text())["sets"]
    assert sets["heldout:sharegpt"]["tokens"] == len(reply) - 1 + 12 - 1
    assert sets["heldout:pycode"]["tokens"] == 10 - 1
    assert study.main(["--model", str(target), "--draft", str(draft), "--heldout",
                       str(heldout), "--source", "pycode", "--json", str(out)]) == 0
    assert list(json.loads(out.read_text())["sets"]) == ["heldout"]  # no walk: no suites
    assert json.loads(out.read_text())["sets"]["heldout"]["tokens"] == 10 - 1
    with pytest.raises(SystemExit, match="nothing to measure"):
        study.main(["--model", str(target), "--draft", str(draft)])
    walk.write_text(json.dumps({"drafts": {"d": {"mt-bench": {"runs": [{"tokens": 3}]}}}}))
    with pytest.raises(SystemExit, match="make it with --walk"):
        study.main([str(walk), "--model", str(target), "--draft", str(draft)])
