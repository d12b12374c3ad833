"""The facts every benchmark report carries: machine, package versions, which BLAS ran."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15-minute load averages: a benchmark on a busy CPU times the
    other jobs too."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def machine_info() -> dict:
    import mlx.core as mx

    from ..device import cpu_name

    try:
        device = dict(mx.device_info())
    except Exception:  # no device info for this backend
        device = {}
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": cpu_name(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _total_memory(),
        "load_average": load_average(),
        "default_device": str(mx.default_device()),
        "gpu": device.get("device_name") if on_gpu else None,
        "device_info": device,
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import mlx.core as mx

    from .. import __version__

    try:
        mlx_lm = version("mlx-lm")
    except PackageNotFoundError:
        import mlx_lm as m

        mlx_lm = getattr(m, "__version__", "unknown")
    return {"mlx": mx.__version__, "mlx_lm": mlx_lm, "dflash_engine": __version__,
            "python": platform.python_version()}


def blas_info() -> dict:
    """Which BLAS the CPU matmuls use: the engine's OpenBLAS, one named by DFLASH_BLAS (MKL's
    libmkl_rt, say), an LD_PRELOAD'ed one, or MLX's bundled one."""
    preload = os.environ.get("LD_PRELOAD", "")
    try:  # Linux: the libraries actually mapped into this process
        maps = Path("/proc/self/maps").read_text().splitlines()
        # numpy's scipy_openblas uses suffixed symbols: it never serves MLX's matmuls.
        mapped = sorted({line.split()[-1] for line in maps
                         if any(name in line.lower() for name in ("blas", "libmkl_"))
                         and "/" in line and "scipy_openblas" not in line})
    except OSError:
        mapped = None
    return {"openblas_preloaded": "openblas" in preload.lower(), "ld_preload": preload or None,
            "blas_libraries_loaded": mapped}


SWITCHES = ("DFLASH_GPU_ATTENTION", "DFLASH_KERNELS", "DFLASH_CPU_KERNELS", "DFLASH_BLAS",
            "DFLASH_FUSED_ROLLBACK", "DFLASH_MERGE_PROJECTIONS")


def switches() -> dict:
    """The environment settings that change how the engine or MLX computes (MLX_*, and the
    engine's kernel switches), as this process sees them."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith("MLX_") or k in SWITCHES}


def cpu_kernels() -> dict | None:
    """On a CPU, the engine's C kernels in use (the loaded file, or why MLX's or the BLAS's
    ops run instead): softmax, swiglu and the verify's matmuls (engine/kernels/cpu_*.py)."""
    from ..device import current

    if current() != "cpu":
        return None
    from ..kernels import cpu_linear, cpu_softmax, cpu_swiglu

    return {name: (status.library or f"off: {status.reason}")
            for name, status in (("softmax", cpu_softmax.status()),
                                 ("swiglu", cpu_swiglu.status()),
                                 ("linear", cpu_linear.status()))}


def git_state() -> dict | None:
    """The commit of the checkout this engine runs from, and whether tracked files differ from
    it (`dirty`); None outside a git checkout (an installed wheel)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root:
            return None  # installed into some other project's tree
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def environment() -> dict:
    """{"machine", "versions", "blas", "switches", "gpu_attention", "cpu_kernels", "git"}: merged
    into every report (gpu_attention: what a verify block's attention ran on,
    engine/kernels/cuda_attention.py)."""
    from ..kernels import cuda_attention

    return {"machine": machine_info(), "versions": versions(), "blas": blas_info(),
            "switches": switches(), "gpu_attention": cuda_attention.state(),
            "cpu_kernels": cpu_kernels(), "git": git_state()}
