"""GatedDeltaNet verify/replay kernels, picked once per backend.

The portable pure-MLX implementation runs anywhere. Fused CUDA/Metal kernels register in
`NATIVE` under their backend name, only when that backend is present AND they are enabled.
CUDA: on by default since scripts/gpu_checks.py passed on an H200 (benchmarks/gpu_checks-h200
.json); DFLASH_CUDA_KERNELS=0 turns them off. Metal: never run yet, so off unless
DFLASH_METAL_KERNELS=1. `select` in "auto" mode prefers them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import mlx.core as mx

from .portable import Tape, gated_delta_verify, tape_replay


@dataclass(frozen=True)
class GatedDeltaKernels:
    name: str
    # (q, k, v, g, beta, state) -> (y, final_state, tape)
    verify: Callable[..., tuple[mx.array, mx.array, Tape]]
    # (state, tape, keep) -> state after the first `keep` steps
    replay: Callable[[mx.array, Tape, int], mx.array]


PORTABLE = GatedDeltaKernels("portable", gated_delta_verify, tape_replay)

# Native kernels, keyed by backend ("cuda", "metal"); filled by `register_native`.
NATIVE: dict[str, GatedDeltaKernels] = {}
ENABLE_ENV = {"cuda": "DFLASH_CUDA_KERNELS", "metal": "DFLASH_METAL_KERNELS"}
PROVEN = {"cuda": "1", "metal": "0"}  # default of each flag: "1" once proven on hardware


def native_enabled(backend: str) -> bool:
    return os.environ.get(ENABLE_ENV[backend], PROVEN[backend]) == "1"


def native_kernels(backend: str) -> GatedDeltaKernels:
    """The fused kernels for `backend`, whether or not enabled or runnable here."""
    if backend == "cuda":
        from . import cuda as mod
    elif backend == "metal":
        from . import metal as mod
    else:
        raise ValueError(f"no native kernels for backend {backend!r}")
    return GatedDeltaKernels(backend, mod.gated_delta_verify, mod.tape_replay)


def backend_present(backend: str) -> bool:
    if backend == "metal":
        return mx.metal.is_available()
    return backend == "cuda" and hasattr(mx, "cuda") and mx.cuda.is_available()


def register_native() -> None:
    """(Re)build NATIVE from the backends present here and the enabling env flags."""
    NATIVE.clear()
    for backend in ENABLE_ENV:
        if backend_present(backend) and native_enabled(backend):
            NATIVE[backend] = native_kernels(backend)


def current_backend() -> str:
    if mx.default_device() == mx.cpu:
        return "cpu"
    if mx.metal.is_available():
        return "metal"
    if hasattr(mx, "cuda") and mx.cuda.is_available():
        return "cuda"
    return "cpu"


def select(
    backend: str | None = None, mode: Literal["auto", "portable"] = "auto"
) -> GatedDeltaKernels:
    """The kernels for `backend` (default: the current device's)."""
    if mode == "portable":
        return PORTABLE
    if mode != "auto":
        raise ValueError(f"unknown kernel mode {mode!r}; expected 'auto' or 'portable'")
    return NATIVE.get(backend or current_backend(), PORTABLE)


register_native()

__all__ = [
    "ENABLE_ENV",
    "NATIVE",
    "PORTABLE",
    "GatedDeltaKernels",
    "Tape",
    "current_backend",
    "gated_delta_verify",
    "native_enabled",
    "native_kernels",
    "register_native",
    "select",
    "tape_replay",
]
