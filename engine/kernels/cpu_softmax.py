"""MLX's float32 CPU softmax, bit for bit and vectorized: cpu_softmax.c.

MLX's x86 CPU build computes softmax one element at a time, which
dominates attention over a long cached history (benchmarks/smollm2-multiturn-cpu.json,
history_cost). cpu_softmax.c does the same IEEE operations in the same order per element and
per row sum, vectorized with AVX2 over elements and threaded over rows, so its output equals
`mx.softmax(x, -1, precise=True)` exactly (tests/test_cpu_softmax.py). Building, checking and
the DFLASH_CPU_KERNELS switch: cpu_native.py.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import mlx.core as mx
import numpy as np

from .cpu_native import Kernel, mode  # noqa: F401  (mode: callers read the switch here)

SOURCE = Path(__file__).with_name("cpu_softmax.c")
FLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-ffp-contract=off")
PER_THREAD = 1 << 18  # elements: a smaller share costs more to start than it saves
# Elements (rows x columns) from which the kernel pays for the sync it needs (`auto`); `on`
# uses it at every size (tests)
MIN_ELEMENTS = 1 << 14


def _setup(lib: ctypes.CDLL) -> None:
    lib.dflash_softmax.restype = ctypes.c_int
    lib.dflash_softmax.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    if not lib.dflash_softmax_supported():
        raise RuntimeError("this CPU lacks AVX2 or FMA")


KERNEL = Kernel(SOURCE, FLAGS, _setup, lambda lib: _agrees(lib), "softmax")
library, status = KERNEL.library, KERNEL.status


def softmax_(x: mx.array, causal_offset: int | None = None) -> bool:
    """Softmax over the last axis of an evaluated, row-contiguous float32 `x`, written into
    x's own buffer: only for an array nothing else holds. With `causal_offset`, x holds
    attention scores [..., L, keys] of queries at positions causal_offset + i, and each
    row's later keys are first set to finfo.min, as MLX's causal `where` does. -> False (x
    untouched) where the kernel is unavailable or x is not such an array."""
    lib = library()
    if lib is None or x.dtype != mx.float32 or x.ndim == 0 or x.size == 0:
        return False
    view = memoryview(x)
    if not view.c_contiguous or view.readonly:
        return False
    buf = np.asarray(view)
    n = x.shape[-1]
    threads = max(1, min(len(os.sched_getaffinity(0)), x.size // PER_THREAD))
    qlen = 0 if causal_offset is None else x.shape[-2]
    lib.dflash_softmax(buf.ctypes.data, buf.ctypes.data, x.size // n, n, qlen,
                       causal_offset or 0, threads)
    return True


def softmax(x: mx.array) -> mx.array:
    """`mx.softmax(x, axis=-1, precise=True)`, the same bits: through the kernel where it pays
    (`_through_kernel`)."""
    y = _through_kernel(x)
    return y if y is not None else mx.softmax(x, axis=-1, precise=True)


def distribution(x: mx.array) -> mx.array:
    """Softmax over the last axis as a probability distribution (sampling's). On a CPU each
    row is then rescaled by its float64 sum: MLX's and the kernel's float32 row sums add one
    element after another, which over a vocabulary is off by up to 1e-4 (every token's share
    alike); a GPU's reductions are not. A kernel result is evaluated and ours: rescaled in
    place (numpy); otherwise in the graph."""
    y = _through_kernel(x)
    if y is not None:
        buf = np.asarray(memoryview(y))
        sums = buf.sum(axis=-1, keepdims=True, dtype=np.float64)
        np.multiply(buf, (1.0 / sums).astype(np.float32), out=buf)
        return y
    y = mx.softmax(x, axis=-1, precise=True)
    if mx.default_device() != mx.cpu:
        return y
    return (y / mx.sum(y.astype(mx.float64), axis=-1, keepdims=True)).astype(mx.float32)


def _through_kernel(x: mx.array) -> mx.array | None:
    """On a CPU with the kernel on, for a float32 `x` big enough to pay: x minus its row max (a
    fresh array: x stays as it was; the kernel's own max is then 0, and its exponentials the
    same), evaluated now and turned into MLX's softmax in place, without MLX's
    one-element-at-a-time exponentials. None where it does not apply."""
    on = mode() == "on" or (mode() == "auto" and x.size >= MIN_ELEMENTS)
    on = on and x.dtype == mx.float32 and mx.default_device() == mx.cpu
    if on and library() is not None:
        shifted = x - mx.max(x, axis=-1, keepdims=True)
        mx.eval(shifted)
        if softmax_(shifted):
            return shifted
    return None


def _agrees(lib: ctypes.CDLL) -> bool:
    """The kernel against MLX's softmax on rows of many lengths and scales, masked entries,
    whole masked rows: equal bits (any NaN equals any NaN)."""
    rng = np.random.default_rng(0)
    for rows, n in ((3, 1), (9, 7), (17, 64), (5, 301)):
        x = (rng.standard_normal((rows, n)) * rng.choice([0.01, 1.0, 30.0], (rows, 1)))
        x = x.astype(np.float32)
        x[rng.random((rows, n)) < 0.2] = -np.inf
        x[-1] = -np.inf
        want = np.array(mx.softmax(mx.array(x), axis=-1, precise=True, stream=mx.cpu))
        got = np.empty_like(x)
        lib.dflash_softmax(x.ctypes.data, got.ctypes.data, rows, n, 0, 0, 2)
        same = (want.view(np.uint32) == got.view(np.uint32)) | (np.isnan(want) & np.isnan(got))
        if not same.all():
            return False
    return True
