"""Pipelined greedy cycles (issue 13, engine/pipeline.py): each cycle is queued before the
last one's commit is read; the caches keep rejected positions behind a mask until they are
compacted."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from test_cycle_sync import load, reads_per_cycle
from tiny_pairs import plain_greedy

from engine import DFlashConfig
from engine.cycle import DraftProposer, prefill, speculative_decode
from engine.errors import ConfigError
from engine.lookup import SuffixLookup
from engine.pipeline import DRAIN_EVERY, looked_up, pipeline_applies, pipelined_decode
from engine.runtime import DFlashRuntime


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_pipelined_cycles_are_greedy_and_leave_the_caches_of_plain_cycles(tiny_pairs, family):
    """The same tokens as plain greedy decoding, one read per cycle, and afterwards the
    target's and the draft's caches hold the committed positions only, as after plain
    speculative cycles (equal up to rounding: the masked attention rows are longer)."""
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    n = 3 * DRAIN_EVERY  # drains twice on the way
    want = plain_greedy(rt.model, ids, n)
    proposer = DraftProposer(rt.target, rt.draft)
    cache = rt.target.make_cache()
    assert pipeline_applies(rt.target, rt.draft, [*cache, *proposer.cache], None)
    per_cycle, tokens = reads_per_cycle(pipelined_decode(rt.target, proposer, ids, n, 16, 512,
                                                         cache=cache))
    assert tokens == want
    assert len(per_cycle) > 2 * DRAIN_EVERY
    # a drain compacts the caches before the next cycle is queued and read
    drains = {i for i in range(1, len(per_cycle)) if i % DRAIN_EVERY == 0}
    assert {r for i, r in enumerate(per_cycle) if i not in drains} == {1}  # the commit only

    reference = DraftProposer(rt.target, rt.draft)
    ref_cache = rt.target.make_cache()
    assert [t for c in speculative_decode(rt.target, reference, ids, n, 16, 512,
                                          cache=ref_cache) for t in c.tokens] == want
    assert rt.target.cache_length(cache) == len(ids) + len(want) - 1  # the last token unfed
    for got, ref in ((cache, ref_cache), (proposer.cache, reference.cache)):
        for c, r in zip(got, ref):
            assert c.offset == r.offset
            for a, b in zip(c.keys_and_values(), r.keys_and_values()):
                assert mx.allclose(a, b, atol=1e-4).item()


def test_a_stop_token_ends_the_reply_and_is_not_fed(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 40)
    stop = want[23]
    end = want.index(stop)
    proposer = DraftProposer(rt.target, rt.draft)
    cache = rt.target.make_cache()
    tokens = [t for c in pipelined_decode(rt.target, proposer, ids, 40, 16, 512, cache=cache,
                                          stop_ids={stop}) for t in c.tokens]
    assert tokens == want[:end + 1]
    assert rt.target.cache_length(cache) == proposer.cache[0].offset == len(ids) + end


@pytest.mark.parametrize("n", [1, 2, 17])
def test_max_tokens_is_exact(tiny_pairs, n):
    rt = load(tiny_pairs, "llama")
    ids = rt.encode("Hi")
    proposer = DraftProposer(rt.target, rt.draft)
    cache = rt.target.make_cache()
    tokens = [t for c in pipelined_decode(rt.target, proposer, ids, n, 16, 512, cache=cache)
              for t in c.tokens]
    assert tokens == plain_greedy(rt.model, ids, n)
    assert rt.target.cache_length(cache) == proposer.cache[0].offset == len(ids) + n - 1


def test_a_pipelined_verify_sees_only_the_visible_entries(tiny_pairs):
    """forward_at on a cache holding rejected entries, hidden, gives the logits of a plain
    verify on the cache without them."""
    rt = load(tiny_pairs, "llama")
    target, tap_ids = rt.target, DraftProposer(rt.target, rt.draft).tap_ids
    prompt, junk, block = list(range(3, 20)), [40, 41, 42], [7, 8, 9, 10]
    clean = target.make_cache()
    prefill(target, clean, prompt, 512)
    want, want_taps = target.forward(mx.array([block]), clean, tap_ids)
    held = target.make_cache()
    prefill(target, held, prompt + junk, 512)
    visible = mx.array([True] * len(prompt) + [False] * len(junk))
    got, got_taps = target.forward_at(mx.array([block]), held, tap_ids,
                                      mx.array(len(prompt)), visible)
    assert mx.allclose(got, want, atol=1e-4).item()
    assert mx.allclose(got_taps, want_taps, atol=1e-4).item()


def test_the_runtime_pipelines_greedy_whole_blocks_only(tiny_pairs):
    rt = load(tiny_pairs, "llama", pipeline=True)
    assert rt.describe()["pipeline"] is True
    result = rt.generate("Hello world", max_tokens=30, no_eos=True)
    assert result.tokens == plain_greedy(rt.model, rt.encode("Hello world"), 30)
    # sampled replies and the sharded or recurrent targets keep the plain cycles
    sampled = rt.generate("Hello world", max_tokens=8, temperature=0.7, seed=1)
    assert len(sampled.tokens) == 8
    assert load(tiny_pairs, "qwen3_5", pipeline=True).describe()["pipeline"] is False
    assert load(tiny_pairs, "llama", pipeline=True,
                min_draft_confidence=0.4).describe()["pipeline"] is False
    with pytest.raises(ConfigError, match="pipeline"):
        DFlashConfig(pipeline="yes")


def test_the_device_lookup_proposes_what_the_host_lookup_does():
    """looked_up against SuffixLookup.propose: the same place (the longest match among the
    recent ones) and the same tokens, through the match's period where they reach the
    present; on contexts with no repeat, one, and many (a small vocabulary, a loop)."""
    rng = np.random.default_rng(0)
    found_some = 0
    for trial in range(60):
        vocab = (400, 400, 12, 5)[trial % 4]  # small vocabularies: many earlier places
        head = [int(t) for t in rng.integers(10, 10 + vocab, size=int(rng.integers(8, 90)))]
        if trial % 3 == 0:
            tokens = head
        else:  # the last tokens repeat an earlier stretch, a few or many tokens back
            start = int(rng.integers(0, len(head) - 6))
            tokens = head + head[start:start + int(rng.integers(5, len(head) - start + 1))]
        for n in (5, 2):  # the lookup's long and short matches
            host = SuffixLookup(min_match=n, short_match=n)
            host.extend(tokens)
            length, want = host.propose(15)
            found, got = looked_up(mx.array(tokens + [0] * 40, dtype=mx.int32),
                                   mx.array(len(tokens)), n, 15)
            assert bool(found) == bool(length)
            if length:
                assert got.tolist() == want
                found_some += 1
    assert found_some >= 60


def test_pipelined_cycles_propose_repeats_from_the_device_lookup(tiny_pairs):
    """With the suffix lookup (the runtime's default) on a target whose replies repeat: some
    cycles propose the lookup's tokens, more tokens a cycle than without it, and the output
    is still plain greedy decoding's."""
    from tiny_pairs import REPEATING

    target, draft = tiny_pairs("llama", REPEATING)
    ids, n = list(range(3, 20)), 120
    runs = {}
    for lookup in (5, None):
        rt = DFlashRuntime.from_pretrained(str(target), str(draft), DFlashConfig(
            min_draft_confidence=None, lookup_min_match=lookup, pipeline=True))
        commits = list(rt._speculative(ids, n, 16, False, None, []))
        assert [t for c in commits for t in c.tokens] == plain_greedy(rt.model, ids, n)
        cycles = [c.cycle for c in commits if c.cycle is not None]
        runs[lookup] = (sum(c.looked_up for c in cycles), (n - 1) / len(cycles))
    assert runs[5][0] > 0 and runs[None][0] == 0
    assert runs[5][1] > runs[None][1]


def test_a_reply_closed_early_leaves_compacted_caches(tiny_pairs):
    """A caller that stops mid-reply (a cancel) closes the generator while a cycle is queued
    ahead and rejected positions are in the caches: both are compacted on the way out."""
    rt = load(tiny_pairs, "llama")
    ids = rt.encode("Hello world")
    proposer = DraftProposer(rt.target, rt.draft)
    cache = rt.target.make_cache()
    commits = pipelined_decode(rt.target, proposer, ids, 60, 16, 512, cache=cache)
    got = [t for _ in range(5) for t in next(commits).tokens]
    commits.close()
    assert got == plain_greedy(rt.model, ids, len(got))
    assert rt.target.cache_length(cache) == proposer.cache[0].offset == len(ids) + len(got) - 1


def test_the_lookups_repeats_are_chosen_as_on_the_host(tiny_pairs):
    """propose_queued with the lookup's repeats: a long match's repeat is the proposal; a
    short match's only where the draft expects it to run (its own tokens: yes; its least
    likely ones: no), else the draft's own tokens."""
    rt = load(tiny_pairs, "llama")
    proposer = DraftProposer(rt.target, rt.draft)  # the full head, as on GPUs
    prompt = list(range(3, 20))
    prefill(rt.target, rt.target.make_cache(), prompt, 512, proposer)
    staged, position = mx.array([7]), mx.array(len(prompt))
    visible = mx.ones((len(prompt),), dtype=mx.bool_)
    own, took = proposer.propose_queued(staged, position, visible, 16)
    assert took is False and own[0, 0].item() == 7
    unlikely = mx.argmin(proposer.draft_logits(7, 16)[0], axis=-1).astype(mx.int32)
    yes, no = mx.array(True), mx.array(False)

    def proposal(*repeats):
        got, took = proposer.propose_queued(staged, position, visible, 16, list(repeats))
        return got[0, 1:].tolist(), bool(took)

    assert proposal((no, unlikely), (yes, own[0, 1:])) == (own[0, 1:].tolist(), True)
    assert proposal((no, unlikely), (yes, unlikely)) == (own[0, 1:].tolist(), False)
    assert proposal((yes, unlikely), (no, own[0, 1:])) == (unlikely.tolist(), True)
