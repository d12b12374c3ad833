"""The CPU softmax kernel and the target attention built on it equal MLX's own bit for bit,
and the engine stays lossless with it (issue 14). CPU only; no timing."""

from __future__ import annotations

import platform
import shutil
import sys

import mlx.core as mx
import numpy as np
import pytest
from tiny_pairs import CORPUS, plain_greedy

from engine import DFlashConfig, DFlashRuntime
from engine.kernels import cpu_linear, cpu_native, cpu_softmax
from engine.targets import cpu_attention

BUILDS_HERE = (sys.platform.startswith("linux") and platform.machine() == "x86_64"
               and shutil.which("cc") is not None)


@pytest.fixture
def kernel():
    lib = cpu_softmax.library()
    if lib is None:
        if BUILDS_HERE:  # x86-64 Linux with a compiler: it must build and pass its check
            pytest.fail(f"the kernel did not load: {cpu_softmax.status().reason}")
        pytest.skip(f"no kernel here: {cpu_softmax.status().reason}")
    return lib


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit; NaN equals NaN (MLX leaves NaN payloads to the compiler)."""
    return bool(((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all())


def rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Scores of every magnitude, with masked entries (-inf and finfo.min), whole masked
    rows, ties, and differences past exp's +-88 cut-offs."""
    x = rng.standard_normal(shape) * rng.choice([1e-3, 0.1, 1.0, 10.0, 200.0],
                                                (*shape[:-1], 1))
    x = x.astype(np.float32)
    x[rng.random(shape) < 0.2] = -np.inf
    x[rng.random(shape) < 0.05] = np.finfo(np.float32).min
    x[rng.random(shape) < 0.05] = 3.0
    flat = x.reshape(-1, shape[-1])
    flat[rng.random(len(flat)) < 0.05] = -np.inf
    return x


@pytest.mark.parametrize("shape", [(16, 49152), (15, 8192), (3, 7001)])
def test_softmax_through_the_kernel_equals_mlx_and_leaves_its_input(kernel, shape):
    """cpu_softmax.softmax (the sampler's and the draft heuristics' softmax, at vocabulary
    sizes): x minus its row max through the kernel, the same bits as MLX's, x untouched."""
    assert np.prod(shape) >= cpu_softmax.MIN_ELEMENTS
    x = mx.array(rows(np.random.default_rng(shape[0]), shape))
    view = x[1:]  # a view of another array's buffer: it must stay as it was too
    mx.eval(x, view)
    before = np.array(x)
    want = np.array(mx.softmax(view, axis=-1, precise=True, stream=mx.cpu))
    got = cpu_softmax.softmax(view)
    assert same_bits(np.array(got), want) and same_bits(np.array(x), before)


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 1000, 4001])
def test_kernel_equals_mlx_softmax(kernel, n):
    rng = np.random.default_rng(n)
    for shape in [(n,), (3, n), (2, 5, n), (1, 3, 19, n)]:
        x = rows(rng, shape)
        want = np.array(mx.softmax(mx.array(x), axis=-1, precise=True, stream=mx.cpu))
        a = mx.array(x)
        mx.eval(a)
        assert cpu_softmax.softmax_(a)  # in place, threads as in use
        assert same_bits(np.array(a), want), shape
        for threads in (1, 2, 3, 7):  # any split of the rows gives the same bits
            out = np.empty_like(x)
            kernel.dflash_softmax(x.ctypes.data, out.ctypes.data, x.size // n, n, 0, 0, threads)
            assert same_bits(out, want), (shape, threads)


@pytest.mark.parametrize("L,history", [(1, 0), (1, 9), (5, 0), (7, 30), (16, 113), (33, 4)])
def test_kernel_with_the_causal_mask_equals_where_then_softmax(kernel, L, history):
    """The kernel's own causal mask gives MLX's fallback's values: where(q >= k, s, min)."""
    rng = np.random.default_rng(L * 1000 + history)
    S = L + history
    x = rows(rng, (2, 3, L, S))
    x[0, 0] = -np.inf  # all visible keys masked: the finfo.min entries decide the row
    allowed = mx.arange(history, S)[:, None] >= mx.arange(0, S)[None]
    masked = mx.where(allowed, mx.array(x), mx.array(np.finfo(np.float32).min, mx.float32))
    want = np.array(mx.softmax(masked, axis=-1, precise=True))
    a = mx.array(x)
    mx.eval(a)
    assert cpu_softmax.softmax_(a, causal_offset=history)
    assert same_bits(np.array(a), want)


def test_kernel_propagates_nan_and_leaves_other_arrays_alone(kernel):
    x = np.array([[1.0, np.nan, 2.0], [0.0, 1.0, 2.0]], np.float32)
    a = mx.array(x)
    mx.eval(a)
    assert cpu_softmax.softmax_(a)
    got = np.array(a)
    assert np.isnan(got[0]).all()
    assert same_bits(got[1], np.array(mx.softmax(mx.array(x[1]), precise=True)))
    for other in (mx.array([1, 2], mx.int32), mx.array([1.0, 2.0], mx.bfloat16),
                  mx.zeros((4, 4))[:, 1:3]):
        mx.eval(other)
        before = np.array(other.astype(mx.float32))
        assert not cpu_softmax.softmax_(other)
        assert np.array_equal(np.array(other.astype(mx.float32)), before)


@pytest.mark.parametrize("n_kv,repeats", [(1, 1), (2, 1), (1, 4), (2, 3), (3, 3)])
def test_attention_equals_mlx_sdpa(kernel, n_kv, repeats):
    rng = np.random.default_rng(10 * n_kv + repeats)
    for L, history, D in [(1, 0, 16), (1, 37, 64), (5, 0, 16), (16, 113, 64), (33, 300, 80),
                          (64, 1000, 64)]:
        S = L + history
        q, k, v = (mx.array(rng.standard_normal((1, h, n, D)).astype(np.float32))
                   for h, n in ((n_kv * repeats, L), (n_kv, S), (n_kv, S)))
        for mask in (None, "causal"):
            want = mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)
            got = cpu_attention.sdpa(q, k, v, D**-0.5, mask)
            assert mx.array_equal(got, want).item(), (L, S, D, mask)


def test_draft_block_attention_equals_mlx_sdpa(kernel, monkeypatch):
    """The draft's block attention (unmasked, its context and the block) through the kernel:
    MLX's bits, so the draft proposes exactly what it did through MLX's attention."""
    from engine.draft import block_attention

    monkeypatch.setenv(cpu_native.ENV, "on")
    rng = np.random.default_rng(5)
    for history in (0, 40, 316):
        q = mx.array(rng.standard_normal((1, 9, 16, 64)).astype(np.float32))
        k, v = (mx.array(rng.standard_normal((1, 3, history + 16, 64)).astype(np.float32))
                for _ in range(2))
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125)
        assert mx.array_equal(block_attention(q, k, v, 0.125, cpu=True), want).item()
    monkeypatch.setenv(cpu_native.ENV, "off")  # the kernels' switch turns this one off too
    monkeypatch.setattr(cpu_attention, "sdpa", lambda *a: pytest.fail("kernel used"))
    assert mx.array_equal(block_attention(q, k, v, 0.125, cpu=True), want).item()


def test_eligible_only_for_float32_cpu_attention_without_extras(kernel, monkeypatch):
    q, kv = mx.zeros((1, 4, 2, 16)), mx.zeros((1, 2, 8, 16))
    monkeypatch.setenv(cpu_native.ENV, "on")
    assert cpu_attention.eligible(q, kv, kv, "causal", None, None)
    assert cpu_attention.eligible(q, kv, kv, None, None, None)
    assert not cpu_attention.eligible(q, kv, kv, mx.ones((2, 8), mx.bool_), None, None)
    assert not cpu_attention.eligible(q, kv, kv, mx.zeros((2, 8)), None, None)  # additive
    assert not cpu_attention.eligible(q, kv, kv, "causal", None, mx.zeros((4,)))
    half = q.astype(mx.bfloat16)
    assert not cpu_attention.eligible(half, kv, kv, "causal", None, None)
    monkeypatch.setenv(cpu_native.ENV, "auto")  # tiny: not worth a sync
    assert not cpu_attention.eligible(q, kv, kv, "causal", None, None)
    big = mx.zeros((1, 2, cpu_softmax.MIN_ELEMENTS // 64, 16))  # 4 heads x 16 queries
    assert cpu_attention.eligible(mx.zeros((1, 4, 16, 16)), big, big, "causal", None, None)
    monkeypatch.setenv(cpu_native.ENV, "off")  # the switch: never, however big
    assert not cpu_attention.eligible(mx.zeros((1, 4, 16, 16)), big, big, "causal", None, None)


def long_prompt(rt) -> list[int]:
    return rt.encode(" ".join(CORPUS * 6))


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_5"])
def test_engine_with_the_kernel_forced_on_equals_mlx_lm_greedy(tiny_pairs, kernel, monkeypatch,
                                                                family):
    monkeypatch.setenv(cpu_native.ENV, "on")
    calls = []
    original = cpu_softmax.softmax_
    monkeypatch.setattr(cpu_softmax, "softmax_",
                        lambda x, *a: calls.append(x.shape) or original(x, *a))
    target, draft = tiny_pairs(family)
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft), config=DFlashConfig(
        dtype="float32", min_draft_confidence=None))
    rt.prefill_chunk = 100
    assert any(a is not None for a in rt.target._attend)
    ids = long_prompt(rt)
    assert len(ids) > 250
    result = rt.generate(ids, max_tokens=60, no_eos=True)
    assert result.speculative and result.cycles > 0
    assert len(calls) > result.cycles  # prefill chunks and verifies ran through the kernel
    assert max(shape[-1] for shape in calls) >= len(ids)  # the whole prompt as keys
    want = plain_greedy(rt.model, ids, 60)
    assert result.tokens == want


def test_missing_compiler_falls_back_to_mlx(tiny_pairs, monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(cpu_native.ENV, "on")
    monkeypatch.setattr(cpu_softmax.KERNEL, "_status", None)  # build again, in this empty cache
    monkeypatch.setattr(cpu_softmax.KERNEL, "_lib", None)
    assert cpu_softmax.library() is None
    assert cpu_softmax.status().library is None and cpu_softmax.status().reason
    q = mx.ones((1, 2, 4, 16))
    assert not cpu_attention.eligible(q, q, q, "causal", None, None)
    target, draft = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft), config=DFlashConfig(
        dtype="float32", min_draft_confidence=None))
    ids = rt.encode("The quick brown fox jumps over the lazy dog.")
    want = plain_greedy(rt.model, ids, 30)
    assert rt.generate(ids, max_tokens=30, no_eos=True).tokens == want


def test_off_leaves_the_models_own_layers(tiny_pairs, monkeypatch):
    monkeypatch.setenv(cpu_native.ENV, "off")
    target, draft = tiny_pairs("qwen3_5")
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                       config=DFlashConfig(dtype="float32"))
    assert all(a is None for a in rt.target._attend)


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_5"])
def test_forward_with_the_kernel_equals_the_models_own_layers(tiny_pairs, kernel, monkeypatch,
                                                              family):
    """Prefill over a long prompt, then a verify: logits and taps equal bit for bit."""
    monkeypatch.setenv(cpu_native.ENV, "on")
    # this kernel alone: cpu_linear.c's products differ from the BLAS's in the last bits
    monkeypatch.setattr(cpu_linear, "fits", lambda x, weight: False)
    target, draft = tiny_pairs(family)
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                       config=DFlashConfig(dtype="float32"))
    adapter, tap_ids = rt.target, rt.draft.args.target_layer_ids
    fast = adapter._attend
    prompt, ids = mx.array([long_prompt(rt)]), mx.array([[5, 9, 2, 7, 11, 4, 8, 6, 3]])
    outs = []
    for attend in (fast, [None] * len(fast)):
        adapter._attend = attend
        cache = adapter.make_cache()
        outs.append(adapter.forward(prompt, cache, tap_ids))
        adapter.begin_verify(cache)
        outs.append(adapter.forward(ids, cache, tap_ids))
        mx.eval(outs)
        adapter.rollback(cache, keep=4, verified=9)
        outs.append(adapter.forward(ids[:, :1], cache, tap_ids))
    for got, want in zip(outs[:3], outs[3:]):
        assert all(mx.array_equal(a, b).item() for a, b in zip(got, want))
