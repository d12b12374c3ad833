"""Prefetching the next draft forward (issue 13): a greedy whole-block cycle queues the next
cycle's draft before its one host sync, on a context that still holds the verify's rejected
positions, masked, and trims them after the sync."""

from __future__ import annotations

import copy
from dataclasses import replace

import mlx.core as mx
import pytest
from test_cycle_sync import load, reads_per_cycle
from tiny_pairs import plain_greedy

from engine import DFlashConfig
from engine.cycle import DraftProposer, speculative_decode
from engine.errors import ConfigError
from engine.pause import Pacer
from engine.plan import Plan, make_plan
from engine.sampling import Sampler, SamplingParams


def verified(rt, prompt: list[int], block: list[int]):
    """A proposer whose context holds `prompt`, and a verify of `block` after it -> (proposer,
    the verify's taps)."""
    proposer = DraftProposer(rt.target, rt.draft)
    cache = rt.target.make_cache()
    _, taps = rt.target.forward(mx.array([prompt]), cache, proposer.tap_ids)
    proposer.append_context(taps)
    rt.target.begin_verify(cache)
    _, taps = rt.target.forward(mx.array([block]), cache, proposer.tap_ids)
    mx.eval(taps, proposer.cache[0].keys)
    return proposer, taps


@pytest.mark.parametrize("accepted", [0, 3, 7])
def test_a_prefetched_draft_equals_the_draft_run_after_the_sync(tiny_pairs, accepted):
    rt = load(tiny_pairs, "llama")
    prompt, block = list(range(3, 30)), [5, 9, 2, 7, 11, 4, 8, 6]
    keep, following = accepted + 1, 13
    proposer, taps = verified(rt, prompt, block)
    settled = copy.deepcopy(proposer)
    settled.append_context(taps[:, :keep])
    want = settled.draft_logits(following, 16)

    proposer.prefetch(taps, mx.array(accepted), mx.array(following), 16)
    got = proposer._prefetched
    proposer.settle(keep)
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-5).item()
    assert mx.array_equal(mx.argmax(got, axis=-1), mx.argmax(want, axis=-1)).item()
    # The settled context is the one the draft would have built: the kept positions only.
    for c, ref in zip(proposer.cache, settled.cache):
        assert c.offset == ref.offset == len(prompt) + keep
        for a, b in zip(c.keys_and_values(), ref.keys_and_values()):
            assert mx.allclose(a, b, atol=1e-6).item()
    # The next proposal is the prefetched one, then the proposer drafts on its own again.
    proposer._prefetched = got
    first = proposer.draft_proposal(following, 16)
    assert first[0, 0].item() == following and proposer._prefetched is None
    assert first[0, 1:].tolist() == mx.argmax(want, axis=-1)[0].tolist()


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_prefetching_cycles_read_once_and_stay_greedy(tiny_pairs, family):
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 60)
    proposer = DraftProposer(rt.target, rt.draft, plan=Plan(prefetch=True))
    prefetches = []
    original = proposer.prefetch
    proposer.prefetch = lambda *a: (prefetches.append(a[0].shape[1]), original(*a))[1]
    per_cycle, tokens = reads_per_cycle(speculative_decode(rt.target, proposer, ids, 60, 16,
                                                           512))
    assert len(per_cycle) > 3 and set(per_cycle) == {1}
    assert len(prefetches) == len(per_cycle)  # every cycle queued the next draft
    assert tokens == want  # plain greedy decoding, bit for bit
    assert proposer.cache[0].offset == len(ids) + len(tokens) - 1  # the last token unfed


def test_prefetching_needs_whole_blocks_and_full_attention(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    on = DFlashConfig(prefetch_draft=True, min_draft_confidence=None)
    assert make_plan(on, "cpu", rt.draft).prefetch  # asked for, whole blocks: on
    assert not make_plan(replace(on, min_draft_confidence=0.4), "cpu", rt.draft).prefetch
    rt.draft.layers[0].self_attn.window = 4  # a sliding-window layer
    try:
        assert not rt.draft.can_prefetch
        assert not make_plan(on, "cpu", rt.draft).prefetch
    finally:
        rt.draft.layers[0].self_attn.window = None


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_prefetching_sampled_reply_draws_what_drafting_after_each_sync_draws(tiny_pairs,
                                                                              family):
    """Sampled, the prefetched forward's logits are the draft's after the sync (up to
    rounding), so a seed draws the same drafts and commits the same reply; each cycle still
    reads the device once."""
    rt = load(tiny_pairs, family, prefetch_draft=True, pause_speculation=False)
    ids = rt.encode("What is 12 times 7?")
    assert rt.describe()["prefetch_draft"]
    replies = {}
    for prefetch in (True, False):
        proposer = DraftProposer(rt.target, rt.draft, plan=Plan(prefetch=prefetch))
        queued = []
        original = proposer.prefetch
        proposer.prefetch = lambda *a, _o=original, _q=queued: (_q.append(1), _o(*a))[1]
        sampler = Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=7))
        per_cycle, tokens = reads_per_cycle(speculative_decode(rt.target, proposer, ids, 48,
                                                               16, 512, sampler=sampler))
        assert len(queued) == (len(per_cycle) if prefetch else 0) and set(per_cycle) == {1}
        replies[prefetch] = tokens
    # up to the reply's last block, which is cut to what is left to emit (a prefetched one is
    # the whole block's first slots: other logits, other draws)
    assert len(replies[True]) == 48 and replies[True][:32] == replies[False][:32]
    _, tokens, _ = proposals(rt, ids, True, Sampler(SamplingParams(0.8, seed=3)))
    _, want_tokens, _ = proposals(rt, ids, False, Sampler(SamplingParams(0.8, seed=3)))
    assert tokens[:44] == want_tokens[:44]  # and with a pause between


def test_prefetch_is_an_option_checked_once(tiny_pairs):
    assert DFlashConfig().prefetch_draft == "auto"
    draft = load(tiny_pairs, "llama").draft
    assert not make_plan(DFlashConfig(), "cpu", draft).prefetch  # nothing to overlap on a CPU
    assert make_plan(DFlashConfig(), "cuda", draft).prefetch  # measured on the H200
    assert not make_plan(DFlashConfig(), "metal", draft).prefetch  # not measured on a Mac yet
    assert not make_plan(DFlashConfig(prefetch_draft=False), "cuda", draft).prefetch
    assert not load(tiny_pairs, "llama").describe()["prefetch_draft"]
    assert not load(tiny_pairs, "llama", prefetch_draft=True,
                    min_draft_confidence=0.4).describe()["prefetch_draft"]  # the cut reads first
    with pytest.raises(ConfigError, match="prefetch_draft"):
        DFlashConfig(prefetch_draft="yes")


class PauseOnce(Pacer):
    """Pauses speculation once, for `tokens` tokens, after `after` speculative cycles."""

    def __init__(self, after: int, tokens: int) -> None:
        super().__init__(step_s=1.0)
        self.after, self.tokens, self.speculated = after, tokens, 0

    def end(self, tokens, plain, verified=0, verify_s=0.0) -> None:
        if self.paused:
            self.left = max(self.left - tokens, 0)
            return
        self.speculated += 1
        if self.speculated == self.after:
            self.left = self.tokens


def proposals(rt, ids: list[int], prefetch: bool, sampler=None, lookup: int | None = None
              ) -> tuple[list, list[int], int]:
    """A reply with one pause after 3 cycles -> (each cycle's verify input, the tokens, the
    cycles the lookup proposed)."""
    plan = Plan(prefetch=prefetch, lookup_min_match=lookup)
    proposer = DraftProposer(rt.target, rt.draft, plan=plan, context=ids)
    made = []
    for name in ("propose", "propose_sampled"):
        original = getattr(proposer, name)

        def record(*args, _original=original):
            out = _original(*args)
            made.append((out if isinstance(out, mx.array) else out[0]).tolist())
            return out

        setattr(proposer, name, record)
    tokens, looked_up = [], 0
    for commit in speculative_decode(rt.target, proposer, ids, 60, 16, 512, sampler=sampler,
                                     pacer=PauseOnce(after=3, tokens=5)):
        tokens += commit.tokens
        looked_up += commit.cycle is not None and commit.cycle.looked_up
    return made, tokens, looked_up


@pytest.mark.parametrize(("family", "lookup"), [("llama", None), ("qwen3_5", None),
                                                ("llama", 2)])
def test_a_pause_discards_the_prefetched_draft(tiny_pairs, family, lookup):
    """The forward queued before a cycle that turns out paused was staged on that cycle's
    token: after the target's plain steps, the draft runs again on the settled context. The
    same after cycles the suffix lookup proposes (no draft forward)."""
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    made, tokens, looked_up = proposals(rt, ids, True, lookup=lookup)
    want, want_tokens, _ = proposals(rt, ids, False, lookup=lookup)
    assert (looked_up > 2) == bool(lookup)
    assert tokens == want_tokens == plain_greedy(rt.model, ids, 60)
    # the same proposals, the first after the pause too (near the reply's end a block is
    # cut to what is left to emit, and a prefetched one is the whole block's first slots)
    whole = [i for i, row in enumerate(want) if len(row[0]) == 16]
    assert len(whole) > 5 and [made[i] for i in whole] == [want[i] for i in whole]
