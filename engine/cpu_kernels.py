"""Exact C kernels for the CPU backend, built at first use with the system C compiler.

On x86 Linux MLX's CPU backend runs exp-based ops one lane at a time (its SIMD width is 1
there), so a SwiGLU costs ~30 ns an element: milliseconds of a 16-token verify. The C files
in engine/kernels/ compute what MLX computes, bit for bit (each file says how), eight lanes
at a time with AVX2+FMA. A kernel is compiled once into the cache (the name carries a digest
of source, compiler and flags) and loaded with ctypes. Anything missing (not x86-64 Linux, no
AVX2/FMA, no compiler, a failed build) means MLX's own ops, silently: `status()` says why.
DFLASH_CPU_KERNELS: auto (default) | off. CC picks the compiler (default cc).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.activations import swiglu as mlx_swiglu

from .cache import cache_root, part_path, remove_dead_parts

ENV = "DFLASH_CPU_KERNELS"
SOURCES = Path(__file__).parent / "kernels"
FLAGS = ("-O2", "-mavx2", "-mfma", "-ffp-contract=off", "-fPIC", "-shared")
# Below this many elements (rows x intermediate) MLX's own swiglu costs less than the graph
# break the kernel needs (an eval of gate and up, a copy back): measured on SmolLM2-135M.
SWIGLU_MIN = 4096

_libs: dict[str, ctypes.CDLL | None] = {}
_why: dict[str, str] = {}


def enabled() -> bool:
    """Whether the kernels may be used at all (not switched off, an x86-64 Linux CPU with
    AVX2 and FMA)."""
    if os.environ.get(ENV, "auto").strip() == "off":
        return False
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64") \
        and _cpu_flags() >= {"avx2", "fma"}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def library(name: str) -> ctypes.CDLL | None:
    """engine/kernels/<name>.c compiled and loaded (once per process), or None."""
    if name not in _libs:
        try:
            _libs[name] = _build(name) if enabled() else None
            if _libs[name] is None:
                _why[name] = f"off ({ENV}=off, or not an x86-64 Linux CPU with AVX2 and FMA)"
        except (OSError, subprocess.SubprocessError) as exc:
            _libs[name], _why[name] = None, " ".join(str(exc).split())[:300]
    return _libs[name]


def status(name: str) -> str:
    """One line for `dflash doctor`: the loaded file, or why MLX's own ops run."""
    lib = library(name)
    return lib._name if lib is not None else f"MLX's own ops: {_why.get(name, 'unknown')}"


def _build(name: str) -> ctypes.CDLL:
    source = SOURCES / f"{name}.c"
    cc = os.environ.get("CC") or "cc"
    compiler = shutil.which(cc)
    if compiler is None:
        raise OSError(f"no C compiler ({cc!r} not found)")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             check=True, stdin=subprocess.DEVNULL).stdout
    key = hashlib.sha256(source.read_bytes() + " ".join(FLAGS).encode() + version.encode())
    dest = cache_root() / "cpu-kernels" / f"{name}-{key.hexdigest()[:16]}.so"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_parts(dest)
        part = part_path(dest)
        try:
            subprocess.run([compiler, *FLAGS, str(source), "-o", str(part)], check=True,
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
            os.replace(part, dest)
        except subprocess.CalledProcessError as exc:
            raise OSError(f"{cc} could not build {source.name}: {exc.stderr}") from exc
        finally:
            part.unlink(missing_ok=True)
    return ctypes.CDLL(str(dest))


def swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """mlx-lm's swiglu(gate, up), by the C kernel when it is loaded and pays (float32, same
    shape, at least SWIGLU_MIN elements): an eval, the kernel on the buffers, a copy back."""
    if (gate.dtype != mx.float32 or up.dtype != mx.float32 or gate.shape != up.shape
            or gate.size < SWIGLU_MIN):
        return mlx_swiglu(gate, up)
    lib = library("cpu_swiglu")
    if lib is None:
        return mlx_swiglu(gate, up)
    mx.eval(gate, up)
    g, u = np.asarray(gate), np.asarray(up)  # views of MLX's buffers (with their strides)
    if not (g.flags.c_contiguous and u.flags.c_contiguous):
        return mlx_swiglu(gate, up)
    return mx.array(run_swiglu(lib, g, u))


def run_swiglu(lib: ctypes.CDLL, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The kernel on row-contiguous float32 arrays of one shape -> a new array."""
    out = np.empty_like(g)
    lib.dflash_swiglu_f32(ctypes.c_void_p(g.ctypes.data), ctypes.c_void_p(u.ctypes.data),
                          ctypes.c_void_p(out.ctypes.data), ctypes.c_size_t(g.size))
    return out
