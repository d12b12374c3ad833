"""A verify forward's Linear products on a CPU: cpu_linear.c, for a few rows at a time.

A 16-token verify multiplies 16 rows by every weight of the target. A BLAS packs each weight
into panels on every call, so such a product costs far more than its arithmetic; the kernel
reads each weight row once and multiplies it with all the rows in registers. Products that
read the same input (q, k and v; gate and up) go in one call.

The kernel's sums run in another order than the BLAS's, so its products differ from MLX's in
the last bits (checked within a tolerance at load). A BLAS's own 1-row and 16-row products
already differ that way: greedy output stays the target's argmax as the verify forward
computes it, and the benchmarks count any divergence from plain decoding with its top-1 minus
top-2 gap. Building, the switch (DFLASH_CPU_KERNELS) and the check: cpu_native.py.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .. import blas
from ..device import current
from .cpu_native import Kernel, mode

SOURCE = Path(__file__).with_name("cpu_linear.c")
FLAGS = ("-O3", "-funroll-loops", "-shared", "-fPIC", "-pthread")
# At most this many rows: a verify block, a draft block or a short context append. Longer
# inputs (prefill chunks) are the BLAS's packed GEMM's home ground.
MAX_ROWS = 32
MAX_PARTS = 4
# A product is split over at most this many threads (weights of a few hundred rows each).
MAX_THREADS = 8
# Smaller weights stay with MLX (a test fixture's): the kernel's graph break (an eval of x, a
# copy back) costs about what it saves below SmolLM2's smallest projection (576 x 192).
MIN_WEIGHT = 1 << 16
# The check at load: relative to the largest product, float32 sums of 1,536 terms in another
# order stay far below this.
TOLERANCE = 1e-4


def _setup(lib: ctypes.CDLL) -> None:
    lib.dflash_linear_supported.restype = lib.dflash_linear_avx512.restype = ctypes.c_int
    lib.dflash_linear_init.restype = ctypes.c_int
    lib.dflash_linear_init.argtypes = [ctypes.c_int]
    lib.dflash_linear.restype = None
    lib.dflash_linear.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    if not lib.dflash_linear_supported():
        raise RuntimeError("this CPU lacks AVX-512, and AVX2 or FMA")
    lib.dflash_linear_init(min(MAX_THREADS, max(1, len(os.sched_getaffinity(0)))))


KERNEL = Kernel(SOURCE, FLAGS, _setup, lambda lib: _agrees(lib), "matmul")
library, status = KERNEL.library, KERNEL.status


def products(lib: ctypes.CDLL, x: np.ndarray, weights: Sequence[np.ndarray],
             use512: bool = True) -> list[np.ndarray]:
    """x [m, k] @ w.T for each w [n, k] (row-contiguous float32) -> new arrays [m, n]."""
    m, k = x.shape
    outs = [np.empty((m, w.shape[0]), np.float32) for w in weights]
    count = len(weights)
    ws = (ctypes.c_void_p * count)(*(w.ctypes.data for w in weights))
    ys = (ctypes.c_void_p * count)(*(y.ctypes.data for y in outs))
    ns = (ctypes.c_int64 * count)(*(w.shape[0] for w in weights))
    lib.dflash_linear(x.ctypes.data, m, k, count, ws, ys, ns, int(use512))
    return outs


def _agrees(lib: ctypes.CDLL) -> bool:
    """Both instruction sets' products against MLX's on shapes with every tile remainder."""
    rng = np.random.default_rng(0)
    for m, k, ns in ((1, 64, (7,)), (5, 200, (3, 13)), (16, 576, (576, 192, 193)),
                     (32, 1536, (10,))):
        x = rng.standard_normal((m, k), dtype=np.float32)
        ws = [rng.standard_normal((n, k), dtype=np.float32) for n in ns]
        for use512 in (True, False):
            for w, got in zip(ws, products(lib, x, ws, use512)):
                want = np.asarray(mx.array(x) @ mx.array(w).T)
                if not np.abs(got - want).max() <= TOLERANCE * max(np.abs(want).max(), 1.0):
                    return False
    return True


def fits(x: mx.array, weight: mx.array) -> bool:
    """Whether x @ weight.T goes to the kernel: on the CPU device, float32, at most MAX_ROWS
    rows, a plain 2-D weight (a quantized layer's is packed integers), the kernel loaded and
    not switched off; by default (`auto`) only where it pays: weights of MIN_WEIGHT elements
    or more, on a CPU with AVX-512. Its AVX2 tiles measured no faster than OpenBLAS on the
    2-core Xeon (benchmarks/cpu-linear-forward-{kernel,avx2,blas}-cpu.json), so CPUs without
    AVX-512 keep the BLAS unless DFLASH_CPU_KERNELS=on (every size, AVX2 too)."""
    on = mode()
    if (on == "off" or current() != "cpu" or x.dtype != mx.float32 or weight.dtype != mx.float32
            or weight.ndim != 2 or x.shape[-1] != weight.shape[1]
            or not 0 < x.size // x.shape[-1] <= MAX_ROWS):
        return False
    lib = library()
    return lib is not None and (on == "on" or (weight.size >= MIN_WEIGHT
                                               and bool(lib.dflash_linear_avx512())))


def blas_aside(weight: mx.array | None) -> blas.Threads | None:
    """OpenBLAS's thread controls for a model whose products of a few rows the kernel takes
    (`fits` for its `weight`); None for any other. Its forwards of up to MAX_ROWS rows then
    run OpenBLAS's own calls (the attention's matmuls) on one thread: OpenBLAS's workers spin
    after each multithreaded call and take the cores the kernel's pool needs, more so as the
    context grows (benchmarks/stage33/cpu-forward-ctx-*-cpu.json)."""
    if weight is None or not fits(mx.zeros((1, weight.shape[-1]), mx.float32), weight):
        return None
    return blas.openblas_threads()


def linears(x: mx.array, layers: Sequence[nn.Module]) -> list[mx.array]:
    """[layer(x) for layer in layers]: plain nn.Linear layers (biases added after) through
    the kernel in one call where it fits, else the layers themselves."""
    if (len(layers) > MAX_PARTS or any(type(layer) is not nn.Linear for layer in layers)
            or not all(fits(x, layer.weight) for layer in layers)):
        return [layer(x) for layer in layers]
    return [_with_bias(y, layer)
            for y, layer in zip(_run(x, [layer.weight for layer in layers]), layers)]


def linear(x: mx.array, layer: nn.Module) -> mx.array:
    """layer(x), through the kernel where it fits (`linears`)."""
    return linears(x, [layer])[0]


def project(x: mx.array, weight: mx.array) -> mx.array:
    """x @ weight.T (a tied embedding's output head), through the kernel where it fits."""
    return _run(x, [weight])[0] if fits(x, weight) else x @ weight.T


def _run(x: mx.array, weights: Sequence[mx.array]) -> list[mx.array]:
    """x @ w.T for each weight by the kernel, in one call: x is evaluated (a sync), the kernel
    reads its buffer and the weights', and the products come back as new arrays."""
    mx.eval(x)
    flat = np.ascontiguousarray(np.asarray(x).reshape(-1, x.shape[-1]))
    outs = products(library(), flat, [_host(w) for w in weights])
    return [mx.array(y).reshape(*x.shape[:-1], y.shape[1]) for y in outs]


def _host(weight: mx.array) -> np.ndarray:
    """The weight's own buffer as a row-contiguous numpy array (no copy for a loaded one)."""
    return np.ascontiguousarray(np.asarray(weight))


def _with_bias(y: mx.array, layer: nn.Module) -> mx.array:
    return y + layer.bias if "bias" in layer else y
