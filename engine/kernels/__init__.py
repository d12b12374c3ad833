"""GatedDeltaNet verify/replay kernels: the portable MLX implementation, or fused ones.

The portable pure-MLX implementation runs anywhere. Fused CUDA and Metal twins
(`cuda.py`, `metal.py`) compute the same thing in one kernel launch. `select` picks per
adapter, by mode:
  "auto"      the fused kernels of the current backend when they are proven on hardware
              (CUDA: scripts/gpu_checks.py passes, benchmarks/gpu_checks-h200.json), else
              portable. Metal has never run on a Mac, so "auto" never picks it.
  "portable"  never fused: the one off-switch.
  "native"    the current backend's fused kernels even when unproven (Metal testers).
The mode is an adapter option (`adapter_for(model, kernels=...)`); its default comes from
$DFLASH_KERNELS, so a CLI or TUI user turns the fused kernels off with DFLASH_KERNELS=portable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from .. import device
from ..errors import ConfigError
from .portable import Tape, conv_rows, gated_delta_verify, tape_replay


@dataclass(frozen=True)
class GatedDeltaKernels:
    name: str
    # (q, k, v, g, beta, state) -> (y, final_state, tape)
    verify: Callable[..., tuple[mx.array, mx.array, Tape]]
    # (state, tape, keep) -> state after the first `keep` steps
    replay: Callable[[mx.array, Tape, int], mx.array]
    # (state, tape, keep, conv_state, qkv) -> both states after the first `keep` steps in
    # one launch; None: `replay` and `conv_rows`
    rollback: Callable[..., tuple[mx.array, mx.array]] | None = None

    def roll_back(self, state: mx.array, tape: Tape, keep: int, conv_state: mx.array,
                  qkv: mx.array) -> tuple[mx.array, mx.array]:
        """A linear layer's recurrent and conv states after the first `keep` of a verify's
        steps, from the states before it, its tape and its conv inputs `qkv`."""
        if self.rollback is not None:
            return self.rollback(state, tape, keep, conv_state, qkv)
        return self.replay(state, tape, keep), conv_rows(conv_state, qkv, keep)


PORTABLE = GatedDeltaKernels("portable", gated_delta_verify, tape_replay)
MODE_ENV = "DFLASH_KERNELS"
MODES = ("auto", "portable", "native")
PROVEN = {"cuda": True, "metal": False}  # fused kernels checked on that hardware
# A rollback's replay and conv rows in one CUDA launch per layer instead of several (checked
# bitwise against them on an H200 by scripts/gpu_checks.py); "0" goes back to the separate ones
FUSED_ROLLBACK_ENV = "DFLASH_FUSED_ROLLBACK"


def native_kernels(backend: str) -> GatedDeltaKernels:
    """The fused kernels for `backend`, whether or not runnable here."""
    if backend == "cuda":
        from . import cuda as mod
    elif backend == "metal":
        from . import metal as mod
    else:
        raise ValueError(f"no native kernels for backend {backend!r}")
    fused = backend == "cuda" and os.environ.get(FUSED_ROLLBACK_ENV) != "0"
    return GatedDeltaKernels(backend, mod.gated_delta_verify, mod.tape_replay,
                             mod.fused_rollback if fused else None)


def default_mode() -> str:
    """$DFLASH_KERNELS, or "auto"."""
    return os.environ.get(MODE_ENV) or "auto"


def select(backend: str | None = None, mode: str | None = None) -> GatedDeltaKernels:
    """The kernels for `backend` (default: the current device's) in `mode` (default:
    $DFLASH_KERNELS or "auto"; see the module docstring)."""
    mode = mode or default_mode()
    if mode not in MODES:
        raise ConfigError(f"kernels mode {mode!r} (from {MODE_ENV} or the kernels option) is "
                          f"unknown. Fix: use one of {', '.join(MODES)}.")
    backend = backend or device.current()
    if mode == "portable" or backend not in PROVEN or not device.present(backend):
        return PORTABLE
    if mode == "auto" and not PROVEN[backend]:
        return PORTABLE
    return native_kernels(backend)


__all__ = [
    "FUSED_ROLLBACK_ENV",
    "MODES",
    "MODE_ENV",
    "PORTABLE",
    "PROVEN",
    "GatedDeltaKernels",
    "Tape",
    "gated_delta_verify",
    "native_kernels",
    "select",
    "tape_replay",
]
