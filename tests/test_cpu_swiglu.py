"""The CPU SwiGLU kernel (engine/kernels/cpu_swiglu.py) computes mlx-lm's swiglu bit for bit, the
engine's output with it stays plain greedy decoding, and a missing compiler falls back."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.activations import swiglu
from tiny_pairs import plain_greedy

from engine import DFlashConfig, DFlashRuntime
from engine.cycle import DraftProposer, speculative_decode
from engine.kernels import cpu_native, cpu_swiglu

# NaNs with payloads and signs, infinities, the exp cut-offs at +-88 and their neighbours,
# subnormals, signed zeros, values near round-half points of x * log2(e).
SPECIAL = np.array(
    [0x7FC00001, 0xFFC00002, 0x7F800003, 0xFF800004, 0x7F800000, 0xFF800000, 0x0, 0x80000000,
     0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF],
    dtype=np.uint32).view(np.float32)
EDGES = np.array([88.0, -88.0, np.nextafter(88.0, 99.0), np.nextafter(-88.0, -99.0),
                  np.nextafter(88.0, 0.0), 0.5 / 1.442695, np.nextafter(0.5 / 1.442695, 0.0),
                  1.5 / 1.442695, 17.0, -17.0, 1e-30, -1e-30], dtype=np.float32)


def kernel():
    lib = cpu_swiglu.library()
    if lib is None:
        pytest.skip(cpu_swiglu.status().reason)
    return lib


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def test_the_kernel_is_mlx_lm_swiglu_bit_for_bit():
    lib = kernel()
    rng = np.random.default_rng(0)
    specials = np.concatenate([SPECIAL, EDGES, -EDGES])
    for n in (*range(1, 40), 63, 64, 65, 1000, 4099):
        for scale in (1e-3, 1.0, 8.0, 60.0, 1e3):
            g = (rng.standard_normal(n) * scale).astype(np.float32)
            u = (rng.standard_normal(n) * scale).astype(np.float32)
            # sprinkle special values into both operands, at every lane position
            g[rng.random(n) < 0.2] = rng.choice(specials, size=1)
            u[rng.random(n) < 0.05] = rng.choice(specials, size=1)
            want = swiglu(mx.array(g), mx.array(u))
            assert (bits(cpu_swiglu.run(lib, g, u)) == bits(want)).all(), (n, scale)
    # every float32 pattern is as likely: all exponents, NaNs, subnormals, odd lengths
    g, u = (rng.integers(0, 2**32, 2**18 + 5, dtype=np.uint32).view(np.float32) for _ in "gu")
    want = swiglu(mx.array(g), mx.array(u))
    assert (bits(cpu_swiglu.run(lib, g, u)) == bits(want)).all()
    grid = np.stack(np.meshgrid(specials, specials)).reshape(2, -1)  # every pair of them
    g, u = np.ascontiguousarray(grid[0]), np.ascontiguousarray(grid[1])
    assert (bits(cpu_swiglu.run(lib, g, u)) == bits(swiglu(mx.array(g), mx.array(u)))).all()


def count_kernel_calls(monkeypatch) -> list[int]:
    """Kernel runs (the list grows by one per run) while the test lasts."""
    calls: list[int] = []
    original = cpu_swiglu.run

    def counted(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(cpu_swiglu, "run", counted)
    return calls


def test_swiglu_uses_the_kernel_where_it_pays(monkeypatch):
    kernel()
    calls = count_kernel_calls(monkeypatch)
    rng = np.random.default_rng(1)
    g = mx.array(rng.standard_normal((3, 5, 1500)).astype(np.float32)) * 9
    u = mx.array(rng.standard_normal((3, 5, 1500)).astype(np.float32))
    out = cpu_swiglu.swiglu(g, u)
    assert calls and out.shape == g.shape and out.dtype == mx.float32
    assert (bits(out) == bits(swiglu(g, u))).all()
    calls.clear()
    small, half, strided = g[:, :1, :100], g.astype(mx.float16), g[:, ::2]
    assert (bits(cpu_swiglu.swiglu(small, small)) == bits(swiglu(small, small))).all()
    assert cpu_swiglu.swiglu(half, half).dtype == mx.float16
    assert (bits(cpu_swiglu.swiglu(strided, strided)) == bits(swiglu(strided, strided))).all()
    assert not calls  # too small, not float32, not contiguous: MLX's own ops


def load(tiny_pairs, family):
    target, draft = tiny_pairs(family)
    return DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                         config=DFlashConfig(min_draft_confidence=None))


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_5"])
def test_speculative_decoding_with_the_kernel_is_plain_greedy(tiny_pairs, family, monkeypatch):
    kernel()
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 60)
    monkeypatch.setenv(cpu_native.ENV, "on")  # the tiny models' MLPs are small
    calls = count_kernel_calls(monkeypatch)
    assert rt.target.cpu_mlp
    proposer = DraftProposer(rt.target, rt.draft)
    tokens = [t for c in speculative_decode(rt.target, proposer, ids, 60, 16, 512)
              for t in c.tokens]
    assert calls and tokens == want


def fresh(monkeypatch) -> None:
    """Forget the loaded kernel for the rest of this test."""
    monkeypatch.setattr(cpu_swiglu.KERNEL, "_status", None)
    monkeypatch.setattr(cpu_swiglu.KERNEL, "_lib", None)


def test_without_a_compiler_mlx_computes_it(monkeypatch, tmp_path):
    fresh(monkeypatch)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv(cpu_native.ENV, "on")
    g = mx.array(np.linspace(-100, 100, 9999, dtype=np.float32))
    assert (bits(cpu_swiglu.swiglu(g, g)) == bits(swiglu(g, g))).all()
    assert cpu_swiglu.library() is None and cpu_swiglu.status().reason
    assert not list(tmp_path.rglob("*.so"))


def test_a_kernel_that_differs_from_mlx_is_not_used(monkeypatch, tmp_path):
    kernel()
    fresh(monkeypatch)
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    # the shared exp written into the source, one constant of its polynomial changed
    exp = (cpu_native.INCLUDE / "mlx_exp_avx2.h").read_text()
    assert exp.count("2.402264791363012e-1f") == 1
    broken = tmp_path / "cpu_swiglu.c"
    broken.write_text(cpu_swiglu.SOURCE.read_text().replace(
        '#include "mlx_exp_avx2.h"', exp.replace("2.402264791363012e-1f", "2.40226e-1f")))
    monkeypatch.setattr(cpu_swiglu.KERNEL, "source", broken)
    assert cpu_swiglu.library() is None and "differs" in cpu_swiglu.status().reason


def test_off_means_mlx(monkeypatch):
    fresh(monkeypatch)
    monkeypatch.setenv(cpu_native.ENV, "off")
    assert cpu_swiglu.library() is None and "off" in cpu_swiglu.status().reason
