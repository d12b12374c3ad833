"""A draft that peeks at its anchor (DraftArgs.anchor_peek): before each draft forward the
target's first layers run on the staged token alone, and the draft sees those taps as one
more context entry. Proposals only: every committed token stays the target's own."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pytest
from test_cycle_sync import load
from tiny_pairs import plain_greedy

from engine import DFlashConfig, DFlashRuntime
from engine.cycle import DraftProposer, speculative_decode
from engine.errors import PairingError


def test_peek_taps_equal_a_full_forwards_and_leave_the_caches_as_they_were(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    taps = rt.draft.args.target_layer_ids
    prompt, token = list(range(3, 20)), 42
    cache = rt.target.make_cache()
    rt.target.forward(mx.array([prompt]), cache, [])
    before = [(c.offset, c.keys[..., :c.offset, :]) for c in cache]
    seen = rt.target.peek(token, cache, taps[:1])
    assert [c.offset for c in cache] == [o for o, _ in before]
    _, full = rt.target.forward(mx.array([[token]]), cache, taps)
    H = seen.shape[-1]
    assert mx.allclose(seen, full[..., :H], atol=1e-5).item()
    for c, (offset, keys) in zip(cache, before):  # the forward wrote after the old entries
        assert mx.array_equal(c.keys[..., :offset, :], keys).item()


@pytest.mark.parametrize("cut", [None, 0.4])
def test_decoding_with_a_peeking_draft_is_plain_greedy(tiny_pairs, cut):
    rt = load(tiny_pairs, "llama", min_draft_confidence=cut)
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 40)
    rt.draft.args.anchor_peek = 2
    try:
        assert not rt.draft.can_prefetch  # the peek needs the settled target caches
        proposer = DraftProposer(rt.target, rt.draft, min_confidence=cut, prefetching=True)
        assert not proposer.prefetching
        peeks = []
        original = rt.target.peek
        rt.target.peek = lambda *a: (peeks.append(a[0]), original(*a))[1]
        commits = list(speculative_decode(rt.target, proposer, ids, 40, 16, 512))
    finally:
        rt.draft.args.anchor_peek = 0
        del rt.target.peek
    tokens = [t for c in commits for t in c.tokens]
    assert tokens == want  # plain greedy decoding, bit for bit
    staged = iter(c.tokens[-1] for c in commits)  # cycles the lookup proposes run no draft
    assert len(peeks) > 3 and all(p in staged for p in peeks)  # staged tokens, in order
    assert proposer.cache[0].offset == len(ids) + len(tokens) - 1  # the peek entry is gone


def test_the_peek_changes_the_proposal(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    ids = list(range(3, 20))
    proposer = DraftProposer(rt.target, rt.draft)
    proposer.target_cache = rt.target.make_cache()
    _, taps = rt.target.forward(mx.array([ids]), proposer.target_cache, proposer.tap_ids)
    proposer.append_context(taps)
    plain = proposer.draft_logits(7, 16)
    rt.draft.args.anchor_peek = 1
    try:
        peeked = proposer.draft_logits(7, 16)
    finally:
        rt.draft.args.anchor_peek = 0
    assert not mx.allclose(plain, peeked, atol=1e-4).item()
    assert proposer.cache[0].offset == len(ids)


def test_a_peeking_draft_needs_a_target_that_can_peek(tiny_pairs, tmp_path):
    target, draft = tiny_pairs("qwen3_5")
    peeking = tmp_path / "draft"
    shutil.copytree(draft, peeking)
    config = json.loads((peeking / "config.json").read_text())
    config.setdefault("dflash_config", {})["anchor_peek"] = 1
    (peeking / "config.json").write_text(json.dumps(config))
    with pytest.raises(PairingError, match="anchor_peek 1"):
        DFlashRuntime.from_pretrained(model=str(target), draft=str(peeking),
                                      config=DFlashConfig())
    config["dflash_config"]["anchor_peek"] = 9
    (peeking / "config.json").write_text(json.dumps(config))
    with pytest.raises(PairingError, match="anchor_peek 9"):
        DFlashRuntime.from_pretrained(model=str(target), draft=str(peeking),
                                      config=DFlashConfig())
