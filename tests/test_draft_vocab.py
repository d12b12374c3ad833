"""A draft proposing from a token subset: head rows equal the target's logits."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

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
