"""OpenBLAS preload: library lookup and the re-exec decision (never re-execs here)."""

from __future__ import annotations

import pytest

from engine import blas

FOUND = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


def test_find_openblas_first_existing(tmp_path):
    a, b = tmp_path / "a.so.0", tmp_path / "b.so.0"
    b.write_bytes(b"")
    assert blas.find_openblas([str(a), str(b)]) == str(b)
    a.write_bytes(b"")
    assert blas.find_openblas([str(a), str(b)]) == str(a)
    assert blas.find_openblas([str(tmp_path / "none")]) is None
    assert blas.find_openblas([str(tmp_path)]) is None  # a folder is not a library


@pytest.mark.parametrize("env, platform, found, expected", [
    ({}, "linux", FOUND, True),
    ({}, "darwin", FOUND, False),
    ({}, "win32", FOUND, False),
    ({}, "linux", None, False),
    ({"LD_PRELOAD": FOUND}, "linux", FOUND, False),
    ({"LD_PRELOAD": "/opt/libopenblas.so"}, "linux", FOUND, False),
    ({"LD_PRELOAD": "/usr/lib/libjemalloc.so"}, "linux", FOUND, True),
    ({"DFLASH_NO_BLAS_REEXEC": "1"}, "linux", FOUND, False),
    ({"DFLASH_BLAS_REEXECED": "1"}, "linux", FOUND, False),
    ({"PYTEST_CURRENT_TEST": "x"}, "linux", FOUND, False),
])
def test_should_reexec(env, platform, found, expected):
    assert blas.should_reexec(env, platform, found) is expected


def test_never_reexecs_under_pytest(monkeypatch):
    monkeypatch.delenv("DFLASH_NO_BLAS_REEXEC", raising=False)
    monkeypatch.setattr(blas.os, "execve", pytest.fail)
    blas.ensure_fast_blas(["dflash"])


def test_command_line_keeps_module_invocation(monkeypatch):
    monkeypatch.setattr(blas.sys, "orig_argv", ["python3", "-m", "engine.cli", "--x"])
    assert blas._command_line(["/x/engine/cli.py", "--x"]) == ["-m", "engine.cli", "--x"]
    monkeypatch.setattr(blas.sys, "orig_argv", ["python3", "-c", "pass"])
    assert blas._command_line(["-c"]) is None
    monkeypatch.setattr(blas.sys, "orig_argv", ["python3"])
    assert blas._command_line([""]) is None
