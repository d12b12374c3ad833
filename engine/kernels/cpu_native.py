"""What the CPU's C kernels (cpu_softmax.c, cpu_swiglu.c, cpu_linear.c) share: one switch, the
build, and a checked load once per process.

MLX's x86-64 Linux CPU build evaluates exp-based ops one element at a time (SIMD width 1, its
exp a scalar polynomial with libm fma calls). The softmax and SwiGLU kernels redo MLX's own
IEEE operations in MLX's order with AVX2+FMA, so their output is MLX's bit for bit; the
matmul kernel sums in its own order (cpu_linear.py says why that is as lossless as the BLAS's
own products). Each is compiled at first use with the system C compiler ($CC, else cc) into
the cache folder, named by a digest of source, compiler and flags, and checked against MLX
once per process: an MLX whose ops changed turns it off rather than changing results (the
matmul: beyond float32 rounding). Not x86-64 Linux, no compiler, no AVX2/FMA, a failed
check, or DFLASH_CPU_KERNELS=off: `library()` is None and callers use MLX's ops.
DFLASH_CPU_KERNELS: auto (default: where it pays) | on (at every size) | off.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..cache import cache_root, intact, part_path, remove_dead_parts, write_stamp

ENV = "DFLASH_CPU_KERNELS"
MODES = ("auto", "on", "off")
INCLUDE = Path(__file__).parent  # mlx_exp_avx2.h, shared by the kernels


def mode() -> str:
    """$DFLASH_CPU_KERNELS, or "auto" (unknown values read as auto)."""
    value = (os.environ.get(ENV) or "auto").strip().lower()
    return value if value in MODES else "auto"


@dataclass
class KernelStatus:
    library: str | None  # the loaded kernel, or None: MLX's ops are used
    reason: str  # why not, when library is None


class Kernel:
    """One C kernel: `setup` declares its functions and raises RuntimeError where the CPU
    cannot run it, `agrees` compares it with MLX. Threads (the server's, the chat app's
    worker) may ask first at the same time: one build, one check."""

    def __init__(self, source: Path, flags: tuple[str, ...],
                 setup: Callable[[ctypes.CDLL], None],
                 agrees: Callable[[ctypes.CDLL], bool], what: str) -> None:
        self.source, self.flags, self.setup, self.agrees, self.what = (
            source, flags, setup, agrees, what)
        self._status: KernelStatus | None = None
        self._lib: ctypes.CDLL | None = None
        self._lock = threading.Lock()

    def library(self) -> ctypes.CDLL | None:
        """The checked kernel, once per process; None where it cannot be used."""
        with self._lock:
            if self._status is None:
                try:
                    self._lib = self._load()
                    self._status = KernelStatus(str(self._lib._name), "")
                except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                    self._lib = None
                    self._status = KernelStatus(None, str(exc) or type(exc).__name__)
        return self._lib

    def status(self) -> KernelStatus:
        """What `library()` found (building and checking the kernel if it has not run)."""
        self.library()
        return self._status

    def forget(self) -> None:
        """Build and check again at the next use (a changed environment, in tests)."""
        with self._lock:
            self._status, self._lib = None, None

    def _load(self) -> ctypes.CDLL:
        if mode() == "off":
            raise RuntimeError(f"{ENV}=off")
        if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64",
                                                                              "AMD64"):
            raise RuntimeError(f"not x86-64 Linux (MLX's {self.what} there is not width 1)")
        import mlx.core as mx

        lib = ctypes.CDLL(str(build(self.source, self.flags)))
        self.setup(lib)
        if not self.agrees(lib):
            raise RuntimeError(f"differs from MLX {mx.__version__}'s {self.what}")
        return lib


def build(source: Path, flags: tuple[str, ...], folder: Path | None = None) -> Path:
    """`source` compiled once per source, shared headers, flags and compiler (named by their
    digest)."""
    cc = shlex.split(os.environ.get("CC") or "") or [shutil.which("cc") or shutil.which("gcc")]
    if not cc[0]:
        raise RuntimeError("no C compiler (set CC)")
    flags = (*flags, f"-I{INCLUDE}")
    headers = b"".join(h.read_bytes() for h in sorted(INCLUDE.glob("*.h")))
    digest = hashlib.sha256(source.read_bytes() + headers + " ".join((*cc, *flags)).encode())
    folder = folder or cache_root() / "kernels"
    dest = folder / f"{source.stem}-{digest.hexdigest()[:16]}.so"
    if intact(dest):
        return dest
    folder.mkdir(parents=True, exist_ok=True)
    remove_dead_parts(dest)
    part = part_path(dest)
    try:
        subprocess.run([*cc, *flags, "-o", str(part), str(source)], check=True,
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
        os.replace(part, dest)
        write_stamp(dest)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
        raise RuntimeError(f"{cc[0]} failed: {detail[0] if detail else exc}") from exc
    finally:
        part.unlink(missing_ok=True)
    return dest
