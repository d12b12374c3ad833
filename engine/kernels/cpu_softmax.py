"""MLX's float32 CPU softmax, bit for bit, about ten times faster: cpu_softmax.c.

MLX's x86 CPU build computes softmax one element at a time (SIMD width 1, its exp a scalar
polynomial with libm fma calls): ~14 ns per element, which dominates attention over a long
cached history (benchmarks/smollm2-multiturn-cpu.json, history_cost). cpu_softmax.c does the
same IEEE operations in the same order per element and per row sum, vectorized with AVX2
over elements and threaded over rows, so its output equals `mx.softmax(x, -1, precise=True)`
exactly (tests/test_cpu_softmax.py). It is compiled at first use with the system C compiler
($CC, else cc) into the cache folder and checked against MLX's own softmax once per process,
so an MLX whose softmax changed turns it off rather than changing results. Not x86-64 Linux,
no compiler, no AVX2/FMA, a failed check, or DFLASH_CPU_SOFTMAX=off: `library()` is None and
callers use MLX's path. DFLASH_CPU_SOFTMAX: auto (default: where it pays) | on | off.
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

from ..cache import cache_root, intact, part_path, remove_dead_parts, write_stamp

ENV = "DFLASH_CPU_SOFTMAX"
MODES = ("auto", "on", "off")
SOURCE = Path(__file__).with_name("cpu_softmax.c")
FLAGS = ("-O2", "-shared", "-fPIC", "-pthread", "-ffp-contract=off")
PER_THREAD = 1 << 18  # elements: a smaller share costs more to start than it saves


@dataclass
class SoftmaxStatus:
    library: str | None  # the loaded kernel, or None: MLX's softmax is used
    reason: str  # why not, when library is None


_status: SoftmaxStatus | None = None
_lib: ctypes.CDLL | None = None
_once = threading.Lock()  # a server thread and the main thread may both ask first


def mode() -> str:
    """$DFLASH_CPU_SOFTMAX, or "auto" (unknown values read as auto)."""
    value = (os.environ.get(ENV) or "auto").strip().lower()
    return value if value in MODES else "auto"


def status() -> SoftmaxStatus:
    """What `library()` found (building and checking the kernel if it has not run)."""
    library()
    return _status


def library() -> ctypes.CDLL | None:
    """The checked kernel, once per process; None where it cannot be used."""
    global _status, _lib
    with _once:
        if _status is None:
            try:
                _lib = _load()
                _status = SoftmaxStatus(str(_lib._name), "")
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                _lib, _status = None, SoftmaxStatus(None, str(exc) or type(exc).__name__)
    return _lib


def _load() -> ctypes.CDLL:
    if mode() == "off":
        raise RuntimeError(f"{ENV}=off")
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError("not x86-64 Linux (MLX's softmax there is not width 1)")
    lib = ctypes.CDLL(str(build()))
    lib.dflash_softmax.restype = ctypes.c_int
    lib.dflash_softmax.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    if not lib.dflash_softmax_supported():
        raise RuntimeError("this CPU lacks AVX2 or FMA")
    if not _agrees(lib):
        raise RuntimeError(f"differs from MLX {mx.__version__}'s softmax")
    return lib


def build(folder: Path | None = None) -> Path:
    """cpu_softmax.c compiled once per source, flags and compiler (named by their digest)."""
    cc = shlex.split(os.environ.get("CC") or "") or [shutil.which("cc") or shutil.which("gcc")]
    if not cc[0]:
        raise RuntimeError("no C compiler (set CC)")
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join((*cc, *FLAGS)).encode())
    digest = digest.hexdigest()[:16]
    folder = folder or cache_root() / "kernels"
    dest = folder / f"cpu_softmax-{digest}.so"
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
