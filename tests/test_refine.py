"""A second draft pass (--refine): the block again with the draft's confident leading drafts
in place of their masks, the later slots predicted anew; the target verifies it all."""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np
import pytest
from test_cycle_sync import load, reads_per_cycle
from test_sampling import SAMPLES, MarkovDraft, V, chi_square_pvalue, sample_replies
from tiny_pairs import plain_greedy

from engine import DFlashConfig
from engine.config import add_engine_args, config_from_args
from engine.cycle import (
    DraftProposer,
    confident_run,
    draft_head_logits,
    refined_logits,
    speculative_decode,
    top_probability,
)
from engine.draft_head import DraftHead
from engine.errors import ConfigError


def with_context(rt, prompt: list[int], refine: float | None = None) -> DraftProposer:
    proposer = DraftProposer(rt.target, rt.draft, refine=refine)
    _, taps = rt.target.forward(mx.array([prompt]), rt.target.make_cache(), proposer.tap_ids)
    proposer.append_context(taps)
    return proposer


def test_confident_slots_keep_their_drafts_and_the_rest_see_them(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    prompt, staged, mask = rt.encode("Hello world"), 5, rt.draft.args.mask_token_id
    first = with_context(rt, prompt).draft_logits(staged, 16)
    probs = top_probability(first)
    tau = probs[0].item()  # the first slot is kept; the tiny draft is less sure further on
    keep = confident_run(probs, tau).item()
    assert 0 < keep < 15, "the fixture should keep some slots and redraft others"

    got = with_context(rt, prompt, refine=tau).draft_logits(staged, 16)
    drafted = mx.argmax(first[0], axis=-1).tolist()
    shown = [staged] + drafted[:keep] + [mask] * (15 - keep)
    plain = with_context(rt, prompt)
    hidden = rt.draft(rt.target.embed(mx.array([shown])), plain.cache)
    second = draft_head_logits(plain.output_head, hidden)
    assert mx.array_equal(got[:, :keep], first[:, :keep]).item()
    assert mx.allclose(got[:, keep:], second[:, keep:], atol=1e-5).item()
    assert not mx.allclose(got[:, keep:], first[:, keep:], atol=1e-3).item()  # it saw them
    # nothing kept (tau above every slot) or everything kept: the first pass's logits
    for none_or_all in (1.0, 1e-9):
        same = with_context(rt, prompt, refine=none_or_all).draft_logits(staged, 16)
        if none_or_all == 1.0:
            mask_block = [staged] + [mask] * 15
            again = draft_head_logits(plain.output_head, rt.draft(
                rt.target.embed(mx.array([mask_block])), plain.cache))
            assert mx.allclose(same, again, atol=1e-5).item()
        else:
            assert mx.array_equal(same, first).item()


def test_a_subset_head_shows_token_ids_not_indices():
    """Over a token subset the drafts are the subset's token ids (not its row indices)."""
    ids = mx.array([3, 7, 11], dtype=mx.int32)
    head = DraftHead(None, ids, mx.eye(3))  # type: ignore[arg-type]
    first = mx.log(mx.array([[[0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]]))
    seen = []

    def run(block):
        seen.append(block.tolist())
        return mx.zeros((1, 3, 3))

    refined_logits(mx.array([[9, 0, 0]], dtype=mx.int32), first, head, run, 0.7)
    assert seen == [[[9, 7, 0]]]  # slot 0's top row 1 is token 7; slot 1 (0.6) stays masked


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@pytest.mark.parametrize("refine", [0.017, 0.5])
def test_refined_cycles_stay_plain_greedy_and_read_once(tiny_pairs, family, refine):
    rt = load(tiny_pairs, family, refine=refine)
    assert rt.describe()["refine"] == refine
    ids = rt.encode("one two three one two three one")
    assert rt.generate(ids, max_tokens=60, no_eos=True).tokens == plain_greedy(rt.model, ids, 60)
    for prefetching in (False, True):
        proposer = DraftProposer(rt.target, rt.draft, refine=refine, prefetching=prefetching)
        per_cycle, tokens = reads_per_cycle(speculative_decode(rt.target, proposer, ids, 40,
                                                               16, 512))
        assert tokens == plain_greedy(rt.model, ids, 40)
        assert len(per_cycle) > 3 and set(per_cycle) == {1}  # the commit's read alone


class RefinedMarkovDraft(MarkovDraft):
    """test_sampling's Markov draft with a second pass whose slot i depends on the token shown
    before it (the staged token, a kept draft, or the mask)."""

    def __init__(self, table, second: np.ndarray, refine: float):
        super().__init__(table, ids=list(range(1, V)), min_confidence=0.3)
        self.second = mx.array(second, dtype=mx.float32)  # [V + 1, B - 1, K]
        self.head = DraftHead(None, self.ids, mx.eye(V - 1))  # type: ignore[arg-type]
        self.refine = refine

    def draft_logits(self, staged, size, chained=True):  # no token chain: `chained` changes nothing
        first = self.table[staged, : size - 1][None]
        block = mx.array([[staged] + [V] * (size - 1)], dtype=mx.int32)  # V: the mask token

        def run(shown):  # hidden states [1, size, K]; the head is the identity
            before = shown[0, :-1]
            rows = self.second[before, mx.arange(size - 1)]
            return mx.concatenate([mx.zeros((1, 1, V - 1)), rows[None]], axis=1)

        return refined_logits(block, first, self.head, run, self.refine)


def test_refined_sampling_keeps_the_target_distribution():
    from test_sampling import MarkovTarget, exact_distribution, tables

    target_table, draft_table = tables()
    second = np.random.default_rng(5).normal(0, 1.5, (V + 1, 3, V - 1))
    draft = RefinedMarkovDraft(draft_table, second, refine=0.5)
    changed = sum(not mx.array_equal(draft.draft_logits(s, 4), draft.table[s][None]).item()
                  for s in range(V))
    assert 0 < changed < V  # the second pass changes the q of some blocks, not all
    replies, _ = sample_replies(MarkovTarget(target_table), draft, SAMPLES // 2, seed=3)
    assert chi_square_pvalue(replies, exact_distribution(target_table, first=2)) > 1e-3


def test_the_refine_setting_is_checked_and_has_a_flag():
    for bad in (0, 1.5, True, "0.7"):
        with pytest.raises(ConfigError, match="refine"):
            DFlashConfig(refine=bad)
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert config_from_args(p.parse_args([])).refine is None
    assert config_from_args(p.parse_args(["--refine", "0.7"])).refine == 0.7
    assert config_from_args(p.parse_args(["--refine", "off"])).refine is None
    with pytest.raises(SystemExit):
        p.parse_args(["--refine", "2"])
