"""Which MLX backend runs here: the one probe the engine and its tools ask.

"cpu", "cuda" or "metal". MLX exposes `mx.cuda` only in CUDA builds, hence the getattr.
"""

from __future__ import annotations

import platform
from pathlib import Path

import mlx.core as mx

GPU_BACKENDS = ("cuda", "metal")


def present(backend: str) -> bool:
    """True when this MLX build can run on `backend` on this machine."""
    if backend == "cpu":
        return True
    module = getattr(mx, backend, None) if backend in GPU_BACKENDS else None
    return bool(module is not None and module.is_available())


def gpu_present() -> bool:
    """True when MLX can run on a GPU here (CUDA or Metal)."""
    return any(present(b) for b in GPU_BACKENDS)


def current() -> str:
    """The backend of MLX's default device: "cpu" when the default is the CPU, else the GPU
    backend present ("metal" or "cuda")."""
    if mx.default_device() == mx.cpu:
        return "cpu"
    return next((b for b in ("metal", "cuda") if present(b)), "cpu")


def cpu_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
