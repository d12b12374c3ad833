"""The draft's token chain (TokenChain): each slot's top candidates rescored knowing the
token proposed before it. Proposals only: every committed token stays the target's own, and
training's teacher-forced simulation walks the cycles a real decode runs."""

from __future__ import annotations

import argparse
import json

import mlx.core as mx
import numpy as np
import pytest
from test_cycle_sync import load
from tiny_pairs import check_walk_is_the_decode, make_tiny_pair, plain_greedy

from engine import DFlashConfig, DFlashRuntime
from engine.config import ConfigError, add_engine_args, config_from_args
from engine.cycle import (
    DraftProposer,
    chained_logits,
    draft_head_logits,
    propose,
    single_threaded,
    speculative_decode,
)
from engine.draft_head import DraftHead
from engine.loading import load_draft_folder, load_target
from engine.train.dataset import Dataset
from engine.train.loop import TrainConfig, add_chain, build_parser, train, train_draft_main
from engine.train.objective import (
    make_batch,
    previous_tokens,
)


def chained(rt: DFlashRuntime, units: int = 16, candidates: int = 4, seed: int = 0
            ) -> DFlashRuntime:
    """`rt` with its draft given a chain; a `seed` gives its output projection random
    weights (a fresh chain's is zero)."""
    rt.draft = add_chain(rt.draft, units, candidates)
    if seed:
        mx.random.seed(seed)
        out = rt.draft.chain.out
        out.weight = mx.random.normal(out.weight.shape) * 0.5
    return rt


def primed(rt: DFlashRuntime, ids: list[int]) -> DraftProposer:
    proposer = DraftProposer(rt.target, rt.draft)
    _, taps = rt.target.forward(mx.array([ids]), rt.target.make_cache(), proposer.tap_ids)
    proposer.append_context(taps)
    return proposer


def test_a_fresh_chain_proposes_what_the_draft_does(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    ids = list(range(3, 20))
    plain = primed(rt, ids).draft_logits(7, 16)
    rt = chained(rt)
    logits = primed(rt, ids).draft_logits(7, 16)
    assert mx.array_equal(mx.argmax(logits, -1), mx.argmax(plain, -1)).item()
    # a chain that adds nothing leaves the draft's distributions as they were
    assert mx.allclose(logits, plain, atol=1e-4).item()


def test_the_chains_pick_holds_the_top_logit_of_its_own_distribution(tiny_pairs):
    rt = chained(load(tiny_pairs, "llama"), seed=3)
    proposer = primed(rt, list(range(3, 20)))
    hidden = rt.draft(rt.target.embed(proposer.staged_block(mx.array(7), 16)), proposer.cache)
    head = proposer.output_head
    base = draft_head_logits(head, hidden)
    logits = chained_logits(rt.draft.chain, hidden, base, mx.array([7]), head, rt.target.embed,
                            4)
    picks = mx.argmax(logits[0], -1)
    # every pick is among the draft's top 4 of its slot, and the walk chose it
    top4 = mx.argsort(-base[0], axis=-1)[:, :4]
    assert (top4 == picks[:, None]).any(-1).all().item()
    # the rest of each row is the chain's own distribution given the picks before it
    prev = mx.concatenate([mx.array([7]), picks[:-1]])
    own = head(rt.draft.chain(hidden[0, 1:], rt.target.embed(prev)))
    same = mx.sort(logits[0], axis=-1)
    assert mx.allclose(same, mx.sort(own, axis=-1), atol=1e-4).item()


def test_a_trained_chain_changes_proposals_and_sampling_ignores_it(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    ids = list(range(3, 20))
    plain = primed(rt, ids).draft_logits(7, 16)
    rt = chained(rt, seed=3)
    proposer = primed(rt, ids)
    assert not mx.array_equal(mx.argmax(proposer.draft_logits(7, 16), -1),
                              mx.argmax(plain, -1)).item()
    # the module-level `propose` chains its proposals too
    chained_tokens = mx.argmax(proposer.draft_logits(7, 16), -1)
    assert mx.array_equal(propose(rt.target, rt.draft, proposer.cache, 7, 16)[:, 1:],
                          chained_tokens).item()
    # sampled proposals draw from the draft's own distributions
    assert mx.allclose(proposer.draft_logits(7, 16, chained=False), plain, atol=1e-5).item()


@pytest.mark.parametrize("cut", [None, 0.4])
def test_decoding_with_a_chain_is_plain_greedy(tiny_pairs, cut):
    rt = chained(load(tiny_pairs, "llama", min_draft_confidence=cut), seed=5)
    ids = rt.encode("Hello world")
    proposer = DraftProposer(rt.target, rt.draft, min_confidence=cut, prefetching=True)
    tokens = [t for c in speculative_decode(rt.target, proposer, ids, 40, 16, 512)
              for t in c.tokens]
    assert tokens == plain_greedy(rt.model, ids, 40)  # bit for bit


def test_the_chain_is_off_unless_asked_and_a_flag_sets_it(tiny_pairs):
    assert DFlashConfig().token_chain is False
    with pytest.raises(ConfigError, match="token_chain='yes'"):
        DFlashConfig(token_chain="yes")
    with pytest.raises(ConfigError, match="token_chain='auto'"):
        DFlashConfig(token_chain="auto")
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert config_from_args(parser.parse_args([])).token_chain is False
    for flag, value in (("on", True), ("off", False)):
        args = parser.parse_args(["--token-chain", flag])
        assert config_from_args(args).token_chain == value
    base = chained(load(tiny_pairs, "llama"), seed=3)
    ids = list(range(3, 20))
    for setting, on in ((True, True), (False, False)):
        rt = DFlashRuntime(base.model, base.tokenizer, base.draft,
                           DFlashConfig(min_draft_confidence=None, token_chain=setting),
                           target=base.target)
        assert rt.describe()["token_chain"] is on
        proposer = rt.make_proposer(DraftHead(rt.target), [], ids)
        _, taps = rt.target.forward(mx.array([ids]), rt.target.make_cache(), proposer.tap_ids)
        proposer.append_context(taps)
        expected = proposer.draft_logits(7, 16, chained=on)
        assert mx.array_equal(proposer.draft_logits(7, 16), expected).item()


def test_a_graft_keeps_the_bases_weights_and_adds_the_chain(tmp_path):
    from mlx.utils import tree_flatten
    from script_modules import load_script
    from tiny_pairs import save_draft

    graft = load_script("graft_chain").graft_chain
    _, base_dir = make_tiny_pair(tmp_path)
    draft = add_chain(load_draft_folder(base_dir), 16, 4)
    mx.random.seed(4)
    draft.chain.out.weight = mx.random.normal(draft.chain.out.weight.shape)
    first = draft.layers[0].mlp.down_proj
    first.weight = first.weight + 0.01  # a checkpoint's copy of the base drifts (requantized)
    chained_dir = save_draft(draft, tmp_path / "chained")
    assert graft(chained_dir, base_dir, tmp_path / "grafted")["chain_tensors"] == 4
    grafted = load_draft_folder(tmp_path / "grafted")
    base = dict(tree_flatten(load_draft_folder(base_dir).parameters()))
    got = dict(tree_flatten(grafted.parameters()))
    assert grafted.args.chain_units == 16 and grafted.args.chain_candidates == 4
    assert all(mx.array_equal(got[k], v).item() for k, v in base.items())  # the base's bytes
    assert mx.array_equal(got["chain.out.weight"], draft.chain.out.weight).item()
    with pytest.raises(SystemExit, match="has no token chain"):
        graft(base_dir, base_dir, tmp_path / "none")
    config = json.loads((chained_dir / "config.json").read_text())
    config["dflash_config"]["target_layer_ids"] = [0]
    (chained_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit, match="differ in target_layer_ids"):
        graft(chained_dir, base_dir, tmp_path / "other")


class CountedThreads:
    """OpenBLAS's thread controls (blas.Threads) as a test double: a count that records."""

    def __init__(self, count):
        self.count, self.seen = count, []

    def get(self):
        return self.count

    def set(self, count):
        self.count = count

    def single_thread(self):
        count, self.count = self.count, 1
        return count if count > 1 else 0


def test_a_chain_is_built_and_evaluated_on_one_blas_thread_then_the_count_is_restored():
    class Target:
        blas_aside = CountedThreads(2)

    target = Target()

    def build():
        target.blas_aside.seen.append(target.blas_aside.get())
        return mx.arange(3) * 2

    out = single_threaded(target, build)
    assert target.blas_aside.seen == [1] and target.blas_aside.count == 2
    assert out.tolist() == [0, 2, 4]
    target.blas_aside = None  # GPUs, other BLASes: built as it is, lazily
    assert single_threaded(target, lambda: mx.arange(2)).tolist() == [0, 1]


def test_previous_tokens_are_the_anchor_then_the_labels():
    rng = np.random.default_rng(0)
    data = Dataset([list(range(10, 40))], [4])
    batch = make_batch(data, [0], 3, 4, 0, rng)
    prev = np.array(previous_tokens(batch))[0]
    for a, anchor in enumerate(np.array(batch.anchors)[0]):
        assert prev[a].tolist() == list(range(10 + anchor, 10 + anchor + 3))


def test_the_training_walk_is_the_real_decode_with_a_chain(tmp_path):
    """Teacher forcing is exact for a run: the simulation's chained runs walk the cycles a
    whole-block decode with the chain runs."""
    target_dir, draft_dir = make_tiny_pair(tmp_path)
    model, tokenizer, _ = load_target(str(target_dir), "float32")
    draft = add_chain(load_draft_folder(draft_dir), 32, 4)
    check_walk_is_the_decode(model, tokenizer, draft)
    assert float(mx.abs(draft.chain.out.weight).max()) > 0  # the chain trained


def test_chain_only_trains_the_chain_and_saves_it(tmp_path):
    target_dir, draft_dir = make_tiny_pair(tmp_path)
    data = tmp_path / "data.npz"
    Dataset([[1, 10 + i % 5, 3, 4, 5, 6, 7, 8] for i in range(12)], [2] * 12).save(data)
    argv = ["--model", str(target_dir), "--out", str(tmp_path / "d"), "--init", str(draft_dir),
            "--data", str(data), "--steps", "3", "--batch", "2", "--anchors", "2",
            "--val-size", "2", "--no-progress", "--lr", "1e-2"]
    said: list[str] = []
    train(TrainConfig(**vars(build_parser().parse_args(
        [*argv, "--chain", "8", "--chain-candidates", "3", "--chain-only"]))), say=said.append)
    assert any("chain added" in m for m in said) and any("frozen" in m for m in said)
    config = json.loads((tmp_path / "d" / "config.json").read_text())["dflash_config"]
    assert (config["chain_units"], config["chain_candidates"]) == (8, 3)
    before, after = load_draft_folder(draft_dir), load_draft_folder(tmp_path / "d")
    assert after.chain is not None and float(mx.abs(after.chain.out.weight).max()) > 0
    for name in ("fc", "norm"):  # the draft itself stayed as it was (up to the saved dtype)
        assert mx.allclose(getattr(after, name).weight.astype(mx.float32),
                           getattr(before, name).weight.astype(mx.float32), atol=1e-2).item()
    # a chain cannot train alone on a draft that has none
    assert train_draft_main([*argv, "--chain-only"]) == 2
