"""mlx-lm's float32 swiglu on a CPU, bit for bit and vectorized: cpu_swiglu.c.

MLX's x86 CPU build runs exp-based ops one element at a time: a SwiGLU is a sizeable
share of a 16-token SmolLM2-135M verify. cpu_swiglu.c does the same IEEE
operations in the same order, eight lanes at a time with AVX2+FMA, so its output equals
`swiglu(gate, up)` exactly (tests/test_cpu_swiglu.py). Building, checking and the
DFLASH_CPU_KERNELS switch: cpu_native.py.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.activations import swiglu as mlx_swiglu

from .cpu_native import Kernel, mode

SOURCE = Path(__file__).with_name("cpu_swiglu.c")
FLAGS = ("-O2", "-shared", "-fPIC", "-ffp-contract=off")
# Below this many elements (rows x intermediate) the kernel's graph break (an eval of gate
# and up, a copy back) costs about what it saves: SmolLM2-135M's 1-token step (1536) is
# below, a 16-token verify (24576) far above.
MIN_SIZE = 4096


def _setup(lib: ctypes.CDLL) -> None:
    lib.dflash_swiglu_f32.restype = None
    lib.dflash_swiglu_f32.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t]
    if not lib.dflash_swiglu_supported():
        raise RuntimeError("this CPU lacks AVX2 or FMA")


KERNEL = Kernel(SOURCE, FLAGS, _setup, lambda lib: _agrees(lib), "swiglu")
library, status = KERNEL.library, KERNEL.status


def _agrees(lib: ctypes.CDLL) -> bool:
    """The kernel against mlx-lm's swiglu on random values of many scales and every float32
    class (NaNs, infinities, subnormals, +-88 where exp saturates): equal bits."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal(4099) * rng.choice([1e-3, 1.0, 10.0, 100.0], 4099)
    edges = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 88.0, -88.0, 88.00001, 3e38]
    g = np.concatenate([g, edges]).astype(np.float32)
    u = rng.standard_normal(g.size).astype(np.float32)
    want = np.asarray(mlx_swiglu(mx.array(g), mx.array(u)))
    return bool((run(lib, g, u).view(np.uint32) == want.view(np.uint32)).all())


def run(lib: ctypes.CDLL, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The kernel on row-contiguous float32 arrays of one shape -> a new array."""
    out = np.empty_like(g)
    lib.dflash_swiglu_f32(g.ctypes.data, u.ctypes.data, out.ctypes.data, g.size)
    return out


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """mlx-lm's swiglu(gate, up); by the kernel where it is loaded and pays (float32, one
    shape, MIN_SIZE elements or more, or DFLASH_CPU_KERNELS=on): gate and up are evaluated
    (a sync), the kernel reads their buffers, and its output comes back as a new array."""
    if (gate.dtype != mx.float32 or up.dtype != mx.float32 or gate.shape != up.shape
            or (gate.size < MIN_SIZE and mode() != "on")):
        return mlx_swiglu(gate, up)
    lib = library()
    if lib is None:
        return mlx_swiglu(gate, up)
    mx.eval(gate, up)
    g, u = np.asarray(gate), np.asarray(up)  # views of MLX's buffers (with their strides)
    if not (g.flags.c_contiguous and u.flags.c_contiguous):
        return mlx_swiglu(gate, up)
    return mx.array(run(lib, g, u))
