"""scripts/refine_study.py: the second pass over a draft's confident first tokens, simulated."""

import sys

import mlx.core as mx
import numpy as np
import pytest
from script_modules import SCRIPTS, load_script
from tiny_pairs import make_tiny_pair

from engine.loading import load_draft_folder, load_target
from engine.targets import adapter_for
from engine.train.objective import anchor_runs, walk_cycles

sys.path.insert(0, str(SCRIPTS))  # refine_study imports choice_study, as when run
study = load_script("refine_study")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, draft_dir = make_tiny_pair(tmp_path_factory.mktemp("refine"))
    model, _, _ = load_target(str(target_dir), "float32")
    return adapter_for(model), load_draft_folder(draft_dir, mx.float32)


def test_the_first_pass_is_the_training_forwards_run_and_the_extremes_change_nothing(pair):
    target, draft = pair
    seq = [int(t) for t in np.random.default_rng(0).integers(3, 60, 50)]
    out = study.reply_study(draft, target, seq, 10, taus=(0.0, 2.0, 0.5))
    first = out["runs"]["pass1"]
    assert first.tolist() == anchor_runs(draft, target, seq, 10).tolist()
    # tau 0 keeps every first-pass token, tau 2 none: either way the first pass's tokens
    assert out["runs"]["tau0.0"].tolist() == first.tolist()
    assert out["runs"]["tau2.0"].tolist() == first.tolist()
    assert len(out["runs"]["tau0.5"]) == len(first)
    anchors = np.arange(10, len(seq) - 1)
    for j, (shown_right, first_right, n) in out["shown"].items():
        # anchors whose first j tokens the first pass got right, with a label at slot j + 1
        assert n == int(((first >= j) & (anchors + j + 1 < len(seq))).sum())
        assert 0 <= shown_right <= n and first_right == int(
            ((first >= j + 1) & (anchors + j + 1 < len(seq))).sum())


def test_summaries_walk_as_a_decode_walks(pair):
    target, draft = pair
    seq = [int(t) for t in np.random.default_rng(1).integers(3, 60, 40)]
    one = study.reply_study(draft, target, seq, 8, taus=(0.5,))
    row = study.summarise([one], [len(seq) - 8])
    cycles = walk_cycles(one["runs"]["pass1"], len(seq) - 8)
    assert row["walk"]["pass1"] == sum(cycles) / len(cycles)
    assert set(row["shown"]) == {"1", "2", "3"}
