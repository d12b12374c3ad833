"""scripts/chain_study.py: the draft alone with and without its token chain, simulated."""

import sys

import mlx.core as mx
import numpy as np
from script_modules import SCRIPTS, load_script
from tiny_pairs import make_tiny_pair

from engine.loading import load_draft_folder, load_target
from engine.targets import adapter_for
from engine.train.loop import add_chain
from engine.train.objective import anchor_runs

sys.path.insert(0, str(SCRIPTS))  # chain_study imports choice_study and peek_study, as when run
study = load_script("chain_study")


def test_each_variant_is_the_training_walk_of_that_draft(tmp_path):
    target_dir, draft_dir = make_tiny_pair(tmp_path)
    model, _, _ = load_target(str(target_dir), "float32")
    target = adapter_for(model)
    plain = load_draft_folder(draft_dir, mx.float32)
    seq = [int(t) for t in np.random.default_rng(0).integers(3, 60, 50)]
    want_plain = anchor_runs(plain, target, seq, 10)
    draft = add_chain(plain, 16, 4)
    mx.random.seed(1)
    draft.chain.out.weight = mx.random.normal(draft.chain.out.weight.shape)
    want = {k: anchor_runs(draft, target, seq, 10) for k in (4,)}
    rows = study.variant_rows([0, 4, 2])(draft, target, seq, 10)
    assert [r["candidates"] for r in rows] == [0, 4, 2]
    assert rows[0]["runs"].tolist() == want_plain.tolist()  # the chain off: the draft alone
    assert rows[1]["runs"].tolist() == want[4].tolist()
    assert draft.chain is not None and draft.args.chain_candidates == 4  # restored
    assert all(r["n"] == 40 and r["slots"].sum() > 0 for r in rows)
