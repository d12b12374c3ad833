"""A draft proposing from a token subset: head rows equal the target's logits, proposals stay
inside the subset, and the output is still the target's own greedy output."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from engine import DFlashConfig, DFlashRuntime
from engine.cycle import prefill, propose, speculative_decode
from engine.draft_head import DraftHead, build_draft_head
from engine.loading import load_target
from engine.targets import adapter_for

FAMILIES = ["llama", "qwen3", "qwen3_5"]  # tied head, untied head, hybrid with untied head


def adapter(tiny_pairs, family, quantized=False):
    target_dir, _ = tiny_pairs(family)
    model, _, _ = load_target(str(target_dir))
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    return adapter_for(model)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_head_rows_equal_the_heads_logits(tiny_pairs, family, quantized):
    target = adapter(tiny_pairs, family, quantized)
    head, tied = target._head()
    assert tied == (family == "llama")
    kind = {True: nn.QuantizedEmbedding if tied else nn.QuantizedLinear,
            False: nn.Embedding if tied else nn.Linear}[quantized]
    assert type(head) is kind  # each head type is really exercised
    ids = mx.array([0, 3, 17, 100, 200, target.vocab_size - 1], dtype=mx.int32)
    hidden = mx.random.normal((2, 5, target.hidden_size), key=mx.random.key(1))
    rows = target.head_rows(ids)
    assert rows.shape == (6, target.hidden_size)
    want = target.lm_head(hidden)[..., ids]
    assert mx.allclose(hidden @ rows.T, want, atol=1e-5, rtol=1e-5).item()
    # an input-embedding multiplier (Granite-style) scales embed(), never the head
    target.args.embedding_multiplier = 3.0
    assert mx.array_equal(target.head_rows(ids), rows).item()


def test_head_rows_refuse_heads_that_are_more_than_a_projection(tiny_pairs):
    target = adapter(tiny_pairs, "qwen3")
    ids = mx.array([1, 2], dtype=mx.int32)
    target.args.logits_scaling = 4.0  # Granite-style logits / scale
    assert target.head_rows(ids) is None
    del target.args.logits_scaling
    target.model.lm_head = nn.Linear(target.hidden_size, target.vocab_size, bias=True)
    assert target.head_rows(ids) is None  # rows alone would drop the bias
    target.model.lm_head = nn.Sequential(nn.Linear(target.hidden_size, target.vocab_size))
    assert target.head_rows(ids) is None  # an unknown module
    assert build_draft_head(target, list(range(50)), 256).ids is None  # -> the full head


def test_build_draft_head_is_top_k_plus_the_prompt(tiny_pairs):
    target = adapter(tiny_pairs, "llama")
    ranking = list(range(300, 0, -1))
    head = build_draft_head(target, ranking, 256, prompt=[3, 5, 299, 10_000])
    ids = head.ids.tolist()
    assert ids == sorted(set(range(45, 301)) | {3, 5})  # out-of-vocab prompt ids are dropped
    assert head.size == len(ids) and head.weight.shape == (len(ids), target.hidden_size)
    assert mx.array_equal(head.weight, target.inner.embed_tokens.weight[head.ids]).item()
    assert head.token_ids(mx.array([0, 2])).tolist() == [3, 45]
    for full in (build_draft_head(target, None, 256), build_draft_head(target, ranking, None),
                 build_draft_head(target, list(range(target.vocab_size)), 8192)):
        assert full.ids is None and full.size == target.vocab_size
        assert full.token_ids(mx.array([7])).tolist() == [7]


def greedy(target, ids, n):
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in generate_step(mx.array(ids), target.model, max_tokens=n)]


def small_subset(target, truth):
    """A subset holding only every third token the target writes: most proposals miss."""
    seen = sorted(set(truth))
    keep = sorted(set(seen[::3]) | set(range(0, target.vocab_size, 7)))
    subset = mx.array(keep, dtype=mx.int32)
    return DraftHead(target, subset, target.head_rows(subset)), set(keep)


@pytest.mark.parametrize("family", FAMILIES)
def test_subset_head_is_lossless_and_proposes_only_subset_tokens(tiny_pairs, family):
    rt = DFlashRuntime.from_pretrained(model=str(tiny_pairs(family)[0]),
                                       draft=str(tiny_pairs(family)[1]),
                                       config=DFlashConfig(min_draft_confidence=None))
    target, draft = rt.target, rt.draft
    ids = rt.encode("What is 12 times 7?")
    want = greedy(target, ids, 80)
    head, keep = small_subset(target, want)
    outside = [t for t in want if t not in keep]
    assert len(outside) > len(want) // 3  # the target often writes tokens the draft cannot
    for cut in (None, 0.3):
        commits = list(speculative_decode(target, draft, ids, 80, 16, 512, min_confidence=cut,
                                          head=head))
        assert [t for c in commits for t in c.tokens] == want, cut

    # Every proposal lies in the subset; the full head does propose tokens outside it.
    cache, dcache = target.make_cache(), draft.make_cache()
    prefill(target, cache, ids, 512, draft, dcache)
    drafted, full = set(), set()
    for staged in range(0, target.vocab_size, 11):
        drafted |= set(propose(target, draft, dcache, staged, 16, head=head)[0, 1:].tolist())
        full |= set(propose(target, draft, dcache, staged, 16)[0, 1:].tolist())
    assert drafted <= keep
    assert full - keep


def test_subset_indices_map_back_to_token_ids(tiny_pairs):
    """The tiny llama answers this prompt with two token ids only: a head over exactly those
    two proposes them, so long runs land (indices 0/1 instead of the ids would land none)."""
    target_dir, draft_dir = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(model=str(target_dir), draft=str(draft_dir),
                                       config=DFlashConfig(min_draft_confidence=None))
    ids = rt.encode("What is 12 times 7?")
    want = greedy(rt.target, ids, 80)
    subset = mx.array(sorted(set(want)), dtype=mx.int32)
    assert subset.size == 2 and subset.tolist() != [0, 1]
    head = DraftHead(rt.target, subset, rt.target.head_rows(subset))
    commits = list(speculative_decode(rt.target, rt.draft, ids, 80, 16, 512, head=head))
    assert [t for c in commits for t in c.tokens] == want
    assert sum(c.n_draft for c in commits) > 40
