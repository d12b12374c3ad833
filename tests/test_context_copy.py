"""Copying inside a draft's block (--copy-odds): slot by slot, the token that followed the
longest earlier n-gram the context and the block so far end with replaces the draft's top token
where the draft gives it enough of that token's probability; the target verifies it all."""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import pytest
from test_cycle_sync import load, reads_per_cycle
from tiny_pairs import plain_greedy

from engine import DFlashConfig
from engine.config import CPU_COPY_ODDS, add_engine_args, config_from_args
from engine.cycle import DraftProposer, copied_proposal, speculative_decode
from engine.draft_head import DraftHead
from engine.errors import ConfigError
from engine.lookup import ContextCopy
from engine.plan import Plan, make_plan


def copy_of(tokens: list[int]) -> ContextCopy:
    copy = ContextCopy()
    copy.extend(tokens)
    return copy


def test_the_candidate_follows_the_longest_earlier_ngram():
    copy = copy_of([1, 2, 3, 9, 5, 2, 3, 7, 2])
    assert copy.candidate([]) == 3  # "2" ends the context: 3 followed it last (index 6)
    assert copy.candidate([3]) == 7  # "2 3" last at index 6, followed by 7
    copy = copy_of([1, 2, 3, 9, 5, 2, 3, 7, 1, 2])
    assert copy.candidate([3]) == 9  # "1 2 3" (at 0-2, then 9) outranks the later "2 3" (7)
    copy = copy_of([2, 3, 9, 8, 2, 3, 7, 1, 2])
    assert copy.candidate([3]) == 7  # "2 3" twice: the latest occurrence's follower


def test_no_earlier_occurrence_gives_no_candidate():
    assert copy_of([]).candidate([]) == -1
    assert copy_of([1, 2, 3]).candidate([]) == -1  # 3 only ends the context: nothing after it
    assert copy_of([1, 2, 3]).candidate([4]) == -1
    pieces = ContextCopy()
    pieces.extend([1, 2])
    pieces.extend([3, 1])
    assert pieces.candidate([]) == copy_of([1, 2, 3, 1]).candidate([]) == 2


def test_a_candidate_replaces_the_top_token_where_the_draft_gives_it_the_odds():
    # context ... 5 6 5: after 5 came 6, after 6 came 5. Head over tokens 0..7.
    copy = copy_of([5, 6, 5])
    head = DraftHead(target=None, ids=mx.arange(8))  # type: ignore[arg-type]
    probs = [[0.10, 0.70, 0, 0, 0, 0, 0.20, 0],  # slot 0: top 1; candidate 6 at 0.2/0.7
             [0.10, 0.10, 0, 0, 0, 0.05, 0, 0.75]]  # slot 1: top 7; candidate after 6 is 5
    logits = mx.log(mx.array([probs]) + 1e-9)
    # odds 0.3: slot 0 keeps 1 (0.2 < 0.3 * 0.7); after 1 nothing followed: 7 stays
    assert copied_proposal(5, logits, head, copy, 0.3)[0].tolist() == [[5, 1, 7]]
    # odds 0.2: slot 0 takes 6, then the candidate after "5 6" is 5 (0.05 < 0.2 * 0.75)
    assert copied_proposal(5, logits, head, copy, 0.2)[0].tolist() == [[5, 6, 7]]
    assert copied_proposal(5, logits, head, copy, 0.05)[0].tolist() == [[5, 6, 5]]
    # the verify cut reads the chosen tokens' probabilities: 6 at 0.2 stops after itself
    assert copied_proposal(5, logits, head, copy, 0.2, min_confidence=0.5)[0].tolist() == [[5, 6]]
    assert copied_proposal(5, logits, head, copy, 0.3,
                           min_confidence=0.5)[0].tolist() == [[5, 1, 7]]


def test_a_short_matchs_repeat_is_taken_where_the_draft_expects_it_to_run_further():
    copy = copy_of([5, 6, 5])
    head = DraftHead(target=None, ids=mx.arange(8))  # type: ignore[arg-type]
    probs = [[0.10, 0.70, 0, 0, 0, 0, 0.20, 0], [0.10, 0.10, 0, 0, 0, 0.05, 0, 0.75]]
    logits = mx.log(mx.array([probs]) + 1e-9)
    # the copy row [1, 7] expects 0.7 + 0.7 * 0.75; the repeat [0, 1] 0.1 + 0.1 * 0.1
    proposal, took = copied_proposal(5, logits, head, copy, 0.3, repeat=[0, 1])
    assert proposal.tolist() == [[5, 1, 7]] and not took
    proposal, took = copied_proposal(5, logits, head, copy, 0.3, repeat=[1, 7, 3])
    assert proposal.tolist() == [[5, 1, 7]] and took  # as far as the row: the repeat, whole


def test_a_candidate_outside_the_heads_subset_is_not_proposed():
    copy = copy_of([5, 9, 5])
    head = DraftHead(target=None, ids=mx.array([1, 5, 7]))  # type: ignore[arg-type]
    logits = mx.log(mx.array([[[0.5, 0.2, 0.3]]]))
    assert copied_proposal(5, logits, head, copy, 0.01)[0].tolist() == [[5, 1]]  # 9 not in it


def test_a_bfloat16_drafts_distributions_reach_the_host():
    """numpy has no bfloat16: the copy reads a bf16 draft's distributions as float32."""
    copy = copy_of([5, 9, 5])
    head = DraftHead(target=None, ids=mx.array([1, 5, 9]))  # type: ignore[arg-type]
    logits = mx.log(mx.array([[[0.5, 0.2, 0.3]]])).astype(mx.bfloat16)
    assert copied_proposal(5, logits, head, copy, 0.5)[0].tolist() == [[5, 9]]  # 0.3 >= 0.25


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_copying_stays_plain_greedy(tiny_pairs, family):
    rt = load(tiny_pairs, family, copy_odds=0.05)
    assert rt.describe()["copy_odds"] == 0.05
    for prompt in ("Hello world", "one two three one two three one"):
        ids = rt.encode(prompt)
        assert rt.generate(ids, max_tokens=80, no_eos=True).tokens == plain_greedy(
            rt.model, ids, 80)


def test_copying_reads_the_device_as_the_verify_cut_does(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    ids = rt.encode("Hello world")
    proposer = DraftProposer(rt.target, rt.draft, plan=Plan(copy_odds=0.1), context=ids)
    per_cycle, tokens = reads_per_cycle(speculative_decode(rt.target, proposer, ids, 40, 16,
                                                           512))
    assert tokens == plain_greedy(rt.model, ids, 40)
    # one read of the draft's distributions, one of the commit (the last cycle may draft
    # nothing)
    assert len(per_cycle) > 3 and set(per_cycle[:-1]) == {2} and per_cycle[-1] in (1, 2)


def test_the_copy_setting_is_checked_and_has_a_flag():
    for bad in (0, 1.5, True, "0.1"):
        with pytest.raises(ConfigError, match="copy_odds"):
            DFlashConfig(copy_odds=bad)
    import argparse

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert config_from_args(p.parse_args([])).copy_odds == "auto"
    assert config_from_args(p.parse_args(["--copy-odds", "0.1"])).copy_odds == 0.1
    assert config_from_args(p.parse_args(["--copy-odds", "off"])).copy_odds is None
    with pytest.raises(SystemExit):
        p.parse_args(["--copy-odds", "often"])


def test_auto_copies_where_the_cut_already_reads_the_draft():
    """'auto' turns the copy on only where it adds no host sync: a CPU with the verify cut
    on (its default); whole blocks and GPUs keep one read per cycle."""
    auto = DFlashConfig()
    assert auto.copy_odds == "auto"
    assert make_plan(auto, "cpu").copy_odds == CPU_COPY_ODDS
    assert make_plan(replace(auto, min_draft_confidence=None), "cpu").copy_odds is None
    assert make_plan(auto, "cuda").copy_odds is None
    assert make_plan(replace(auto, min_draft_confidence=0.4), "cuda").copy_odds is None
    assert make_plan(DFlashConfig(copy_odds=0.3, min_draft_confidence=None),
                     "cuda").copy_odds == 0.3
    assert make_plan(DFlashConfig(copy_odds=None), "cpu").copy_odds is None


def test_the_cpu_default_copies_and_stays_plain_greedy(tiny_pairs):
    rt = load(tiny_pairs, "llama", min_draft_confidence="auto")
    assert rt.describe()["copy_odds"] == CPU_COPY_ODDS  # the tests run on a CPU
    ids = rt.encode("one two three one two three one")
    assert rt.generate(ids, max_tokens=60, no_eos=True).tokens == plain_greedy(rt.model, ids,
                                                                                60)
    whole = load(tiny_pairs, "llama", min_draft_confidence=None)
    assert whole.describe()["copy_odds"] is None
