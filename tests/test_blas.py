"""The in-process BLAS loader. Loading is once per process and cannot be undone, so each case
runs in a fresh interpreter; the dynamic linker's own log (LD_DEBUG=bindings) says which
library MLX's cblas_sgemm was bound to: proof without timing anything."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import blas

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the loader only acts on Linux")
SHOW = "import engine.blas as b, mlx.core; s = b.status(); print(s.source, s.library, sep='|')"


def run(code: str, tmp_path: Path, **env: str) -> tuple[str, str, str]:
    """-> (status line, stderr, the file libmlx's cblas_sgemm was bound to)."""
    log = tmp_path / "ld"
    full = {k: v for k, v in os.environ.items() if k not in ("DFLASH_BLAS", "LD_PRELOAD")}
    full |= {"DFLASH_CACHE_DIR": str(tmp_path / "cache"), "LD_DEBUG": "bindings",
             "LD_DEBUG_OUTPUT": str(log)} | env
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    linker = ""
    for file in tmp_path.glob("ld.*"):  # one per process: <LD_DEBUG_OUTPUT>.<pid>
        linker += file.read_text()
        file.unlink()
    bound = re.search(r"binding file \S*libmlx\.so \[0\] to (\S+) \[0\]: normal symbol "
                      r"`cblas_sgemm'", linker)
    return proc.stdout.strip(), proc.stderr.strip(), bound.group(1) if bound else ""


def renamed(tmp_path: Path) -> Path:
    source = next(Path(blas.importlib.util.find_spec("scipy_openblas32").origin).parent.glob(
        "lib/libscipy_openblas*.so"))
    return blas.renamed_copy(source, tmp_path / "made")


def test_auto_loads_the_pypi_blas_into_the_cache_and_mlx_uses_it(tmp_path):
    out, errors, bound = run(SHOW, tmp_path)
    source, library = out.split("|")
    assert source == "pypi" and errors == ""
    assert Path(library).parent == tmp_path / "cache" / "blas"
    assert Path(library + ".stamp.json").is_file()
    assert os.path.samefile(bound, library)
    # Second start: the cached copy is reused as it is.
    mtime = Path(library).stat().st_mtime_ns
    assert run(SHOW, tmp_path)[0] == out and Path(library).stat().st_mtime_ns == mtime


def test_truncated_cached_copy_is_made_again(tmp_path):
    library = Path(run(SHOW, tmp_path)[0].split("|")[1])
    with open(library, "r+b") as f:
        f.truncate(4096)
    out, errors, bound = run(SHOW, tmp_path)
    assert out.startswith("pypi|") and errors == "" and os.path.samefile(bound, library)
    assert library.stat().st_size > 1 << 20


def test_off_keeps_the_reference(tmp_path):
    out, errors, bound = run(SHOW, tmp_path, DFLASH_BLAS="off")
    assert out == "off|reference" and errors == ""
    assert "mlx_cpu.libs/libblas" in bound


def test_wrong_path_warns_and_falls_back(tmp_path):
    out, errors, bound = run(SHOW, tmp_path, DFLASH_BLAS=str(tmp_path / "nope.so"))
    assert out == "reference|reference" and "mlx_cpu.libs/libblas" in bound
    assert errors == (f"dflash: DFLASH_BLAS={tmp_path / 'nope.so'}: no such file. Fix: set "
                      "DFLASH_BLAS to auto, off or the path of a BLAS library; CPU matmuls use "
                      "MLX's reference BLAS (about 30x slower)")


def test_a_library_without_cblas_is_refused(tmp_path):
    ctypes.CDLL("libm.so.6")
    maps = Path("/proc/self/maps").read_text().split()
    libm = next(p for p in maps if p.startswith("/") and p.endswith("/libm.so.6"))
    out, errors, _ = run(SHOW, tmp_path, DFLASH_BLAS=libm)
    assert out == "reference|reference"
    assert "has no cblas_sgemm, so it is not a CBLAS library" in errors


def test_failed_check_warns_and_keeps_the_reference(tmp_path):
    code = ("import engine.blas as b; b._status = None; b.check = lambda f: False; "
            "b.load('auto'); import mlx.core; s = b.status(); print(s.source, s.library, "
            "sep='|')")
    out, errors, bound = run(code, tmp_path, DFLASH_BLAS="off")
    assert out == "reference|reference" and "mlx_cpu.libs/libblas" in bound
    assert "computes wrong matrix products (checked against numpy)" in errors
    assert "CPU matmuls use MLX's reference BLAS" in errors


def test_preloaded_blas_is_respected(tmp_path):
    library = renamed(tmp_path)
    out, errors, bound = run(SHOW, tmp_path, LD_PRELOAD=str(library))
    assert out == f"preloaded|{library}" and errors == ""
    assert os.path.samefile(bound, library)
    assert not (tmp_path / "cache" / "blas").exists()  # nothing made when one is preloaded


def test_an_unrenamed_scipy_openblas_path_is_renamed(tmp_path):
    source = next(Path(blas.importlib.util.find_spec("scipy_openblas32").origin).parent.glob(
        "lib/libscipy_openblas*.so"))
    out, errors, bound = run(SHOW, tmp_path, DFLASH_BLAS=str(source))
    source_name, library = out.split("|")
    assert source_name == "DFLASH_BLAS" and errors == ""
    assert Path(library).parent == tmp_path / "cache" / "blas" and os.path.samefile(bound, library)


def test_mlx_imported_first_is_named(tmp_path):
    code = "import mlx.core; " + SHOW
    out, errors, bound = run(code, tmp_path)
    assert out == "reference|reference" and "mlx_cpu.libs/libblas" in bound
    assert "mlx.core was imported before engine" in errors and "import engine first" in errors


def test_unwritable_cache_still_loads_a_private_copy(tmp_path):
    # Root ignores permission bits, so the cache path goes under a plain file instead: every
    # write below it fails (NotADirectoryError), as on a read-only folder.
    (tmp_path / "file").write_text("")
    out, errors, bound = run(SHOW, tmp_path, DFLASH_CACHE_DIR=str(tmp_path / "file" / "cache"))
    assert out.startswith("pypi|") and bound.endswith(".so")
    assert "cannot cache the BLAS in" in errors and "Fix: make that folder writable" in errors
    assert not Path(out.split("|")[1]).exists()  # the private copy is gone from disk


def test_check_against_numpy():
    def fake(wrong: bool):
        proto = ctypes.CFUNCTYPE(None, *[ctypes.c_int] * 6, ctypes.c_float, ctypes.c_void_p,
                                 ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                                 ctypes.c_void_p, ctypes.c_int)

        def sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
            def view(ptr, rows, cols):
                buf = (ctypes.c_float * (rows * cols)).from_address(ptr)
                return np.frombuffer(buf, dtype=np.float32).reshape(rows, cols)

            out = view(c, m, n)
            out[:] = view(a, m, k) @ view(b, k, n)
            if wrong:
                out[-1, -1] += 1.0

        return proto(sgemm)

    right, wrong = fake(False), fake(True)
    assert blas.check(right) and not blas.check(wrong)


def test_exported_symbols_reads_the_renamed_library(tmp_path):
    names = set(blas.exported_symbols(renamed(tmp_path)))
    assert {"cblas_sgemm", "cblas_dgemm", "cblas_cgemm", "sgetrf_", "ssyevd_"} <= names
    assert not any(n.startswith("scipy_") for n in names)
    (tmp_path / "x.so").write_bytes(b"not elf")
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        blas.exported_symbols(tmp_path / "x.so")


def test_partial_copy_of_a_killed_start_is_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    library = Path(run(SHOW, tmp_path)[0].split("|")[1])
    library.unlink()  # as if the first start had been killed while renaming
    leftover = library.with_name(f"{library.name}.{dead}.part")
    leftover.write_bytes(b"\x7fELF half")
    out, errors, bound = run(SHOW, tmp_path)
    assert out == f"pypi|{library}" and errors == "" and os.path.samefile(bound, library)
    assert not leftover.exists()
