"""DFlash speculative decoding on MLX: a block-diffusion draft proposes, the target verifies.

`engine.config`, `engine.events`, `engine.errors` and `engine.registry` load no MLX, so a UI
can import them freely (tests/test_layout.py holds it); the runtime (and MLX) loads on first
use of `DFlashRuntime`.
"""

from __future__ import annotations

import os
from typing import Any

# Verify runs 16-row float32 GEMMs where plain decoding runs 1-row GEMVs. MLX may compute the
# former in TF32 (its default on CUDA and M5 GPUs), which flips near-ties and breaks the
# token-for-token equality with greedy decoding. Full fp32 unless the user chose otherwise.
os.environ.setdefault("MLX_ENABLE_TF32", "0")
# CUDA, bf16/fp16: MLX builds a cuDNN attention plan for each exact (query, key) shape. A
# cycle attends a block of queries over a KV length that grows every cycle, so every draft and
# verify forward paid a fresh plan build (benchmarks/stage6/bf16-profile-*-h200.json), and MLX
# aborts a process after 512 plan-cache misses. Its own attention ops have no per-shape cost.
os.environ.setdefault("MLX_CUDA_USE_CUDNN_SDPA", "0")
os.environ.setdefault("MLX_CUDA_USE_CUDNN_SPDA", "0")  # the same switch, older MLX spelling

from .blas import load as _load_blas
from .errors import DFlashError
from .events import CycleStats, Finished, GenerationResult, RunningStats, Span

# Linux CPU: a fast BLAS must be in the process before anything imports mlx.core, which binds
# its BLAS symbols at import (engine/blas.py). Here, it covers the CLI, the TUI and the API.
_load_blas()

__version__ = "0.1.0"
__all__ = [
    "CycleStats", "DFlashConfig", "DFlashError", "DFlashRuntime", "Finished",
    "GenerationResult", "RunningStats", "Span",
]


def __getattr__(name: str) -> Any:
    if name == "DFlashRuntime":
        from .runtime import DFlashRuntime

        return DFlashRuntime
    if name == "DFlashConfig":
        from .config import DFlashConfig

        return DFlashConfig
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
