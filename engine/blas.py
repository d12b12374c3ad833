"""Fast CPU matmuls on Linux: re-exec once with the system OpenBLAS preloaded.

MLX's Linux CPU wheel bundles a reference BLAS (a 1024^3 fp32 matmul takes ~350 ms); Debian's
libopenblas0-pthread, preloaded, does it in ~23 ms. LD_PRELOAD only works at process start,
hence the re-exec. No MLX import here unless the answer depends on it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",  # Debian/Ubuntu
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",  # Fedora/RHEL (pthreads build)
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",  # Arch, Alpine
)
NO_REEXEC_ENV = "DFLASH_NO_BLAS_REEXEC"
MARKER_ENV = "DFLASH_BLAS_REEXECED"
HINT = "dflash: install libopenblas0-pthread (apt) for ~15x faster CPU matmuls"


def find_openblas(candidates: Iterable[str] = OPENBLAS_CANDIDATES) -> str | None:
    """The first OpenBLAS shared library that exists, or None."""
    return next((c for c in candidates if Path(c).is_file()), None)


def should_reexec(env: Mapping[str, str], platform: str, found: str | None) -> bool:
    """Pure decision: Linux, OpenBLAS found, not yet preloaded, not disabled, not under pytest."""
    if not platform.startswith("linux") or found is None:
        return False
    if env.get(NO_REEXEC_ENV) or env.get(MARKER_ENV) or "PYTEST_CURRENT_TEST" in env:
        return False
    return "openblas" not in env.get("LD_PRELOAD", "")


def gpu_backend() -> bool:
    """True when MLX will run on a GPU (CUDA or Metal): then BLAS does not matter."""
    from .device import gpu_present  # the engine's one backend probe (imports MLX)

    return gpu_present()


def ensure_fast_blas(argv: list[str]) -> None:
    """Call first thing in a CLI `main`: may replace this process (same argv) via `os.execv`."""
    env = os.environ
    if not sys.platform.startswith("linux") or env.get(MARKER_ENV) or env.get(NO_REEXEC_ENV):
        return
    if "PYTEST_CURRENT_TEST" in env or "pytest" in sys.modules or gpu_backend():
        return
    found = find_openblas()
    if found is None:
        print(HINT, file=sys.stderr)
        return
    if not should_reexec(env, sys.platform, found):
        return
    args = _command_line(argv)
    if args is None:
        return
    print(f"dflash: using OpenBLAS ({found}) for CPU matmuls", file=sys.stderr, flush=True)
    new_env = dict(env)
    new_env["LD_PRELOAD"] = ":".join(p for p in (found, env.get("LD_PRELOAD")) if p)
    new_env[MARKER_ENV] = "1"  # once only, even if the preload turns out not to stick
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *args], new_env)


def _command_line(argv: list[str]) -> list[str] | None:
    """Interpreter arguments that re-run this program: keeps `-m module` invocations intact."""
    orig = getattr(sys, "orig_argv", None)  # Python >= 3.10
    if orig and len(orig) > 1 and "-c" not in orig:
        return list(orig[1:])
    if not orig and argv and argv[0] and Path(argv[0]).is_file():
        return list(argv)
    return None  # `python -c`, a REPL or an embedded interpreter: not a CLI to re-run
