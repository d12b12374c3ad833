"""Merged input projections (engine/targets/merged.py): one matmul for projections that read
the same input, the modules left reading views of the stacked weights."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from tiny_qwen35 import make_tiny_qwen3_next, make_tiny_qwen35

from engine.targets.base import text_model
from engine.targets.gated_delta import GatedDeltaAdapter
from engine.targets.merged import MERGE_ENV, MergedProjection

WIDTHS = (96, 64, 4, 4)  # a GatedDeltaNet layer's qkv, z, b, a: two of them a head count wide


def linears(dtype: mx.Dtype, widths=WIDTHS, bias: bool = False) -> list[nn.Linear]:
    mx.random.seed(0)
    mods = [nn.Linear(64, n, bias=bias) for n in widths]
    for m in mods:
        m.set_dtype(dtype)
    mx.eval([m.parameters() for m in mods])
    return mods


def quantized(scale_dtype: mx.Dtype, bits: int = 4) -> list[nn.QuantizedLinear]:
    mods = [nn.QuantizedLinear.from_linear(m, group_size=32, bits=bits)
            for m in linears(scale_dtype, widths=(96, 64, 8, 8))]
    mx.eval([m.parameters() for m in mods])
    return mods


@pytest.mark.parametrize("make", [lambda: linears(mx.bfloat16), lambda: quantized(mx.float16)],
                         ids=["bf16", "q4-fp16-scales"])
def test_merged_outputs_are_the_modules_outputs_and_the_modules_read_views(make):
    mods = make()
    x = mx.random.normal((1, 16, 64)).astype(mx.bfloat16)
    want = [m(x) for m in mods]
    mx.eval(want)
    merged = MergedProjection.of(mods)
    assert merged is not None
    got = merged(x)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        assert mx.allclose(g.astype(mx.float32), w.astype(mx.float32), atol=1e-2).item()
    # the modules still compute what they did, from views into the stacked rows
    for m, w in zip(mods, want, strict=True):
        assert mx.array_equal(m(x), w).item()
    stacked = merged.weights["weight"]
    start = 0
    for m in mods:
        n = m.weight.shape[0]
        assert mx.array_equal(m.weight, stacked[start:start + n]).item()
        start += n
    assert start == stacked.shape[0]


def test_merging_adds_no_memory():
    mods = linears(mx.bfloat16, widths=(4096, 2048, 64, 64))
    mx.synchronize()
    mx.clear_cache()
    before = mx.get_active_memory()
    merged = MergedProjection.of(mods)
    mx.synchronize()
    mx.clear_cache()
    stacked_bytes = merged.weights["weight"].nbytes
    assert mx.get_active_memory() - before < stacked_bytes // 4


@pytest.mark.parametrize("mods", [
    lambda: linears(mx.float32),  # float32 keeps plain decoding's bits
    lambda: quantized(mx.float32),
    lambda: linears(mx.bfloat16, bias=True),
    lambda: linears(mx.bfloat16)[:1],
    lambda: [*linears(mx.bfloat16)[:2], *quantized(mx.bfloat16)[:1]],
    lambda: [*quantized(mx.float16)[:1], *quantized(mx.float16, bits=8)[:1]],
], ids=["float32", "q4-float32-scales", "bias", "one", "mixed-kinds", "mixed-bits"])
def test_what_does_not_merge(mods):
    assert MergedProjection.of(mods()) is None


def half_model(make):
    """The model with its GatedDeltaNet input projections in bf16 (what merges; the rest
    stays float32: a CPU has no bf16 MoE matmul)."""
    model = make()
    for layer in text_model(model).layers:
        if layer.is_linear:
            for name, module in layer.linear_attn.children().items():
                if name.startswith("in_proj"):
                    module.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("make", [lambda: make_tiny_qwen35(seed=0),
                                  lambda: make_tiny_qwen3_next(seed=0)],
                         ids=["qwen3_5", "qwen3_next"])
def test_a_gpu_verify_merges_each_linear_layer_and_computes_the_same(make, monkeypatch):
    monkeypatch.delenv(MERGE_ENV, raising=False)
    model = half_model(make)
    mx.random.seed(1)
    tokens = mx.random.randint(0, 256, (1, 24))
    prompt, block = tokens[:, :8], tokens[:, 8:]

    def verify(on_cpu: bool) -> tuple[GatedDeltaAdapter, mx.array]:
        adapter = GatedDeltaAdapter(model, kernels="portable")
        adapter.on_cpu = on_cpu  # as on a GPU, where adapters merge
        cache = adapter.make_cache()
        adapter.forward(prompt, cache, [], last_only=True)
        adapter.begin_verify(cache)
        logits, _ = adapter.forward(block, cache, [0])
        adapter.rollback(cache, keep=5, verified=block.shape[1])
        return adapter, logits.astype(mx.float32)

    separate, want = verify(on_cpu=True)
    assert set(separate._merged.values()) == {None}
    merged, got = verify(on_cpu=False)
    linear = [i for i, layer in enumerate(merged.layers) if layer.is_linear]
    assert sorted(merged._merged) == linear
    assert all(merged._merged[i] is not None for i in linear)
    assert mx.allclose(got, want, atol=0.1).item()
    assert (mx.argmax(got, -1) == mx.argmax(want, -1)).mean().item() > 0.9


def test_merging_switched_off(monkeypatch):
    monkeypatch.setenv(MERGE_ENV, "0")
    model = half_model(lambda: make_tiny_qwen35(seed=0))
    adapter = GatedDeltaAdapter(model, kernels="portable")
    adapter.on_cpu = False
    cache = adapter.make_cache()
    adapter.forward(mx.array([[1, 2, 3]]), cache, [], last_only=True)
    adapter.begin_verify(cache)
    mx.eval(adapter.forward(mx.array([[4, 5]]), cache, [0]))
    assert set(adapter._merged.values()) == {None}
