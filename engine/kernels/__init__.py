"""GatedDeltaNet verify/replay kernels, picked once per backend.

Only the portable pure-MLX implementation exists today. Native CUDA/Metal kernels are a
separate issue: they register in `NATIVE` under their backend name, and `select` in
"auto" mode prefers them. Nothing is registered until a real kernel exists.
"""

from __future__ import annotations

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

# Slot for native kernels, keyed by backend ("cuda", "metal"). Empty on purpose.
NATIVE: dict[str, GatedDeltaKernels] = {}


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


__all__ = [
    "NATIVE",
    "PORTABLE",
    "GatedDeltaKernels",
    "Tape",
    "current_backend",
    "gated_delta_verify",
    "select",
    "tape_replay",
]
