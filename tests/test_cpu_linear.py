"""The CPU small-batch matmul (engine/kernels/cpu_linear.py): its products match MLX's within
float32 rounding for every tile remainder and both instruction sets, layers fall back to MLX
where it does not fit, and the engine's output with it stays the target's greedy decoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from tiny_pairs import plain_greedy

from engine import DFlashConfig, DFlashRuntime
from engine.cycle import DraftProposer, speculative_decode
from engine.kernels import cpu_linear, cpu_native


def kernel():
    lib = cpu_linear.library()
    if lib is None:
        pytest.skip(cpu_linear.status().reason)
    return lib


def close(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal up to float32 sums taken in another order."""
    return bool(np.abs(got - want).max() <= 1e-5 * max(np.abs(want).max(), 1.0))


@pytest.mark.parametrize("use512", [True, False])
def test_products_match_mlx_for_every_tile_remainder(use512):
    lib = kernel()
    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 4, 5, 7, 16, 17, 32):
        for k in (1, 7, 8, 15, 16, 17, 63, 576):
            ns = (1, 2, 3, 4, 5, 13)  # tiles of 3 (AVX2) and 4 (AVX-512) rows, and parts
            x = rng.standard_normal((m, k), dtype=np.float32)
            ws = [rng.standard_normal((n, k), dtype=np.float32) for n in ns[:4]]
            for w, got in zip(ws, cpu_linear.products(lib, x, ws, use512)):
                assert got.shape == (m, w.shape[0])
                assert close(got, np.asarray(mx.array(x) @ mx.array(w).T)), (m, k, w.shape)


def count_kernel_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = cpu_linear.products

    def counted(*args, **kwargs):
        calls.append(len(args[2]))  # the weights in this call
        return original(*args, **kwargs)

    monkeypatch.setattr(cpu_linear, "products", counted)
    return calls


def test_layers_go_to_the_kernel_only_where_it_fits(monkeypatch):
    kernel()
    calls = count_kernel_calls(monkeypatch)
    mx.random.seed(0)
    q, k = nn.Linear(576, 576, bias=False), nn.Linear(576, 192, bias=True)
    x = mx.random.normal((1, 16, 576))
    got_q, got_k = cpu_linear.linears(x, [q, k])
    assert calls == [2]  # one call for both
    assert close(np.asarray(got_q), np.asarray(q(x))) and close(np.asarray(got_k),
                                                                  np.asarray(k(x)))
    calls.clear()
    long_input = mx.random.normal((1, cpu_linear.MAX_ROWS + 1, 576))  # a prefill chunk
    small = nn.Linear(32, 32)  # below MIN_WEIGHT
    quantized = nn.QuantizedLinear(576, 576, bias=False)
    assert mx.array_equal(cpu_linear.linear(long_input, q), q(long_input))
    assert mx.array_equal(cpu_linear.linear(x[..., :32], small), small(x[..., :32]))
    assert mx.array_equal(cpu_linear.linear(x, quantized), quantized(x))
    assert mx.array_equal(cpu_linear.linear(x.astype(mx.float16), q),
                          q(x.astype(mx.float16)))
    assert not calls
    monkeypatch.setenv(cpu_native.ENV, "on")  # any size
    assert close(np.asarray(cpu_linear.linear(x[..., :32], small)),
                 np.asarray(small(x[..., :32]))) and calls == [1]
    monkeypatch.setenv(cpu_native.ENV, "off")
    calls.clear()
    assert mx.array_equal(cpu_linear.linear(x, q), q(x)) and not calls


def load(tiny_pairs, family):
    target, draft = tiny_pairs(family)
    return DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                         config=DFlashConfig(min_draft_confidence=None))


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_5"])
def test_speculative_decoding_with_the_kernel_is_greedy_decoding(tiny_pairs, family,
                                                                  monkeypatch):
    kernel()
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 60)
    monkeypatch.setenv(cpu_native.ENV, "on")  # the tiny models' weights are small
    calls = count_kernel_calls(monkeypatch)
    proposer = DraftProposer(rt.target, rt.draft)
    tokens = [t for c in speculative_decode(rt.target, proposer, ids, 60, 16, 512)
              for t in c.tokens]
    assert calls and tokens == want
    if family != "qwen3_5":  # attention layers: q, k and v in one call
        assert 3 in calls


def fresh(monkeypatch) -> None:
    """Forget the loaded kernel for the rest of this test."""
    monkeypatch.setattr(cpu_linear.KERNEL, "_status", None)
    monkeypatch.setattr(cpu_linear.KERNEL, "_lib", None)


def test_a_kernel_that_computes_wrong_products_is_not_used(monkeypatch, tmp_path):
    kernel()
    fresh(monkeypatch)
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path))
    broken = tmp_path / "cpu_linear.c"
    source = cpu_linear.SOURCE.read_text()
    # both instruction sets' sums scaled by 1.001: wrong in the fourth digit
    assert source.count("= sums[4 * j + r];") == 1
    assert source.count("y[(i + j) * ldy + r] = s;") == 1
    broken.write_text(source.replace("= sums[4 * j + r];", "= 1.001f * sums[4 * j + r];")
                      .replace("y[(i + j) * ldy + r] = s;", "y[(i + j) * ldy + r] = 1.001f * s;"))
    monkeypatch.setattr(cpu_linear.KERNEL, "source", broken)
    assert cpu_linear.library() is None and "differs" in cpu_linear.status().reason
    x = mx.random.normal((1, 16, 576))
    q = nn.Linear(576, 576, bias=False)
    assert mx.array_equal(cpu_linear.linear(x, q), q(x))



ONE_THREAD_CHECK = """
import json, sys
import engine  # first: the OpenBLAS copy goes into the process before MLX
import mlx.core as mx
from engine import DFlashConfig, DFlashRuntime, blas
from engine.kernels import cpu_linear
threads = blas.openblas_threads()
before = threads.get() if threads else 0
rt = DFlashRuntime.from_pretrained(model=sys.argv[1], draft=sys.argv[2],
                                   config=DFlashConfig(min_draft_confidence=None))
seen = []
products = cpu_linear.products
def spy(*args, **kwargs):
    seen.append(threads.get())
    return products(*args, **kwargs)
cpu_linear.products = spy
report = {"before": before, "aside": rt.target.blas_aside is not None}
target, draft = rt.target, rt.draft
cache = target.make_cache()
for name, run in (("prefill", lambda: target.forward(mx.array([list(range(3, 43))]), cache, [])),
                  ("verify", lambda: target.forward(mx.array([list(range(3, 19))]), cache, [])),
                  ("draft", lambda: draft(target.embed(mx.array([list(range(3, 19))])),
                                          draft.make_cache()))):
    seen.clear()
    mx.eval(run())
    report[name] = sorted(set(seen))
    report[name + "_after"] = threads.get()
print(json.dumps(report))
"""


def test_forwards_through_the_kernel_run_openblas_on_one_thread(tiny_pairs):
    """OpenBLAS's workers spin after each multithreaded call and would take the kernel's
    cores: the target's and the draft's forwards of a few rows set it to one thread while they
    run and restore its count after; prefill-sized forwards keep it. In a fresh process, where
    the engine loads its OpenBLAS before MLX (with two threads, as on a 2-core machine)."""
    kernel()
    target, draft = tiny_pairs("llama")
    env = {**os.environ, cpu_native.ENV: "on", "OPENBLAS_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", ONE_THREAD_CHECK, str(target), str(draft)],
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["before"] == 2 and report["aside"]
    assert report["prefill"] == [] and report["prefill_after"] == 2  # the BLAS's own GEMMs
    assert report["verify"] == [1] and report["verify_after"] == 2
    assert report["draft"] == [1] and report["draft_after"] == 2
    env[cpu_native.ENV] = "off"
    out = subprocess.run([sys.executable, "-c", ONE_THREAD_CHECK, str(target), str(draft)],
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert not report["aside"] and report["verify"] == [] and report["verify_after"] == 2
