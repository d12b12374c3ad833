"""mlx-lm's float32 swiglu on a CPU, bit for bit, ten times faster: cpu_swiglu.c.

MLX's x86 CPU build runs exp-based ops one element at a time (SIMD width 1, its exp a scalar
polynomial with libm fma calls): a SwiGLU costs ~20 ns an element, ~15 ms of a 16-token
SmolLM2-135M verify. cpu_swiglu.c does the same IEEE operations in the same order, eight lanes
at a time with AVX2+FMA, so its output equals `swiglu(gate, up)` exactly (tests/
test_cpu_swiglu.py). It is compiled at first use with the system C compiler ($CC, else cc)
into the cache folder and checked against mlx-lm's swiglu once per process, so an MLX whose
sigmoid changed turns it off rather than changing results. Not x86-64 Linux, no compiler, no
AVX2/FMA, a failed check, or DFLASH_CPU_KERNELS=off: `library()` is None and `swiglu` is
mlx-lm's. DFLASH_CPU_KERNELS: auto (default: where it pays) | on | off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.activations import swiglu as mlx_swiglu

from ..cache import cache_root, intact, part_path, remove_dead_parts, write_stamp

ENV = "DFLASH_CPU_KERNELS"
MODES = ("auto", "on", "off")
SOURCE = Path(__file__).with_name("cpu_swiglu.c")
FLAGS = ("-O2", "-shared", "-fPIC", "-ffp-contract=off")
# Below this many elements (rows x intermediate) the kernel's graph break (an eval of gate
# and up, a copy back) costs about what it saves: SmolLM2-135M's 1-token step (1536) is
# below, a 16-token verify (24576) far above.
MIN_SIZE = 4096


@dataclass
class KernelStatus:
    library: str | None  # the loaded kernel, or None: mlx-lm's swiglu is used
    reason: str  # why not, when library is None


_status: KernelStatus | None = None
_lib: ctypes.CDLL | None = None
_lock = threading.Lock()  # one build per process, whichever thread asks first


def mode() -> str:
    """$DFLASH_CPU_KERNELS, or "auto" (unknown values read as auto)."""
    value = (os.environ.get(ENV) or "auto").strip().lower()
    return value if value in MODES else "auto"


def status() -> KernelStatus:
    """What `library()` found (building and checking the kernel if it has not run)."""
    library()
    return _status


def library() -> ctypes.CDLL | None:
    """The checked kernel, once per process; None where it cannot be used."""
    global _status, _lib
    with _lock:
        if _status is None:
            try:
                _lib = _load()
                _status = KernelStatus(str(_lib._name), "")
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                _lib, _status = None, KernelStatus(None, str(exc) or type(exc).__name__)
    return _lib


def _load() -> ctypes.CDLL:
    if mode() == "off":
        raise RuntimeError(f"{ENV}=off")
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError("not x86-64 Linux (MLX's sigmoid there is not width 1)")
    lib = ctypes.CDLL(str(build()))
    lib.dflash_swiglu_f32.restype = None
    lib.dflash_swiglu_f32.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t]
    if not lib.dflash_swiglu_supported():
        raise RuntimeError("this CPU lacks AVX2 or FMA")
    if not _agrees(lib):
        raise RuntimeError(f"differs from MLX {mx.__version__}'s swiglu")
    return lib


def build(folder: Path | None = None) -> Path:
    """cpu_swiglu.c compiled once per source, flags and compiler (named by their digest)."""
    cc = shlex.split(os.environ.get("CC") or "") or [shutil.which("cc") or shutil.which("gcc")]
    if not cc[0]:
        raise RuntimeError("no C compiler (set CC)")
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join((*cc, *FLAGS)).encode())
    folder = folder or cache_root() / "kernels"
    dest = folder / f"cpu_swiglu-{digest.hexdigest()[:16]}.so"
    if intact(dest):
        return dest
    folder.mkdir(parents=True, exist_ok=True)
    remove_dead_parts(dest)
    part = part_path(dest)
    try:
        subprocess.run([*cc, *FLAGS, "-o", str(part), str(SOURCE)], check=True,
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
        os.replace(part, dest)
        write_stamp(dest)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
        raise RuntimeError(f"{cc[0]} failed: {detail[0] if detail else exc}") from exc
    finally:
        part.unlink(missing_ok=True)
    return dest


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
