"""The fused block-attention switch on a CPU: where it applies, that it stays off here, its
setting's errors, and the GPU check script's harness (the kernel itself runs on the H200:
scripts/gpu_attention_check.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from script_modules import load_script

from engine.errors import ConfigError
from engine.kernels import cuda_attention

ROOT = Path(__file__).resolve().parents[1]


def qkv(L: int = 16, S: int = 300, d: int = 64, dtype=mx.bfloat16, hq: int = 9, hkv: int = 3):
    return (mx.zeros((1, hq, L, d), dtype), mx.zeros((1, hkv, S, d), dtype),
            mx.zeros((1, hkv, S, d), dtype))


def test_applies_to_a_verify_block_of_low_precision_queries_only():
    assert cuda_attention.applies(*qkv(), "causal")
    assert cuda_attention.applies(*qkv(L=2), None)
    assert cuda_attention.applies(*qkv(dtype=mx.float16, d=128, hq=32, hkv=8), "causal")
    assert not cuda_attention.applies(*qkv(L=1), "causal")  # MLX's own kernel: fused already
    assert not cuda_attention.applies(*qkv(L=17), "causal")  # a prefill chunk
    assert cuda_attention.applies(*qkv(S=4096), "causal")  # a long SmolLM2 chat
    assert not cuda_attention.applies(*qkv(S=4097), "causal")  # longer: MLX's matmuls win
    assert cuda_attention.applies(*qkv(S=576, d=128, hq=32, hkv=8), "causal")
    assert not cuda_attention.applies(*qkv(S=577, d=128, hq=32, hkv=8), "causal")  # more heads
    assert not cuda_attention.applies(*qkv(dtype=mx.float32), "causal")  # fp32 stays exact
    assert not cuda_attention.applies(*qkv(d=48), "causal")
    assert not cuda_attention.applies(*qkv(hq=8, hkv=3), "causal")
    # an array mask: MLX's
    assert not cuda_attention.applies(*qkv(), mx.zeros((16, 300), mx.bool_))
    assert not cuda_attention.applies(*qkv(), mx.zeros((16, 300), mx.bfloat16))  # additive
    assert not cuda_attention.applies(*qkv(), "causal", sinks=mx.zeros((9,)))


def test_off_the_gpu_attention_is_mlxs_own_whatever_the_setting(monkeypatch):
    monkeypatch.setenv(cuda_attention.MODE_ENV, "kernel")
    assert not cuda_attention.enabled()
    mx.random.seed(0)
    q, k, v = (mx.random.normal(x.shape).astype(mx.bfloat16) for x in qkv(S=40))
    got = cuda_attention.scaled_dot_product_attention(q, k, v, 0.125, "causal")
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert mx.array_equal(got, want)


def test_an_unknown_setting_names_the_choices(monkeypatch):
    monkeypatch.setenv(cuda_attention.MODE_ENV, "kernal")
    with pytest.raises(ConfigError, match="mlx, kernel"):
        cuda_attention.mode()
    monkeypatch.delenv(cuda_attention.MODE_ENV)
    assert cuda_attention.mode() == "kernel"  # on by default (only CUDA uses it)
    monkeypatch.setenv(cuda_attention.MODE_ENV, "mlx")
    assert cuda_attention.mode() == "mlx"


@pytest.fixture
def pretend_cuda(monkeypatch):
    """cuda_attention believes it runs on CUDA; a failed check is forgotten afterwards."""
    monkeypatch.delenv(cuda_attention.MODE_ENV, raising=False)
    monkeypatch.setattr(cuda_attention, "current", lambda: "cuda")
    monkeypatch.setattr(cuda_attention, "_failed", None)
    return monkeypatch


def mlx_block_attention(q, k, v, scale, causal):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale,
                                                mask="causal" if causal else None)


def test_a_kernel_that_passes_the_start_up_check_stays_on(pretend_cuda, capsys):
    pretend_cuda.setattr(cuda_attention, "block_attention", mlx_block_attention)
    assert cuda_attention.check() is None
    assert cuda_attention.enabled() and cuda_attention.state() == "kernel"
    assert capsys.readouterr().err == ""


def test_a_kernel_that_does_not_compile_here_falls_back_to_mlx(pretend_cuda, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("Failed to compile kernel: identifier \"inf\" is undefined\nmore")

    pretend_cuda.setattr(cuda_attention, "block_attention", broken)
    reason = cuda_attention.check()
    assert reason.startswith("RuntimeError: Failed to compile kernel") and "more" not in reason
    assert not cuda_attention.enabled()
    assert cuda_attention.state() == f"mlx ({reason})"
    err = capsys.readouterr().err
    assert "MLX's attention runs instead" in err and "DFLASH_GPU_ATTENTION=mlx" in err
    # the layers then keep MLX's attention: nothing routes to the kernel any more
    q, k, v = (mx.ones((1, 2, n, 64), mx.bfloat16) for n in (4, 30, 30))
    got = cuda_attention.scaled_dot_product_attention(q, k, v, 0.125)
    assert mx.array_equal(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125))


def test_a_kernel_with_wrong_results_is_turned_off(pretend_cuda, capsys):
    pretend_cuda.setattr(cuda_attention, "block_attention",
                         lambda q, k, v, scale, causal: mlx_block_attention(
                             q, k, v, scale, causal) + 0.1)
    assert "off by" in cuda_attention.check()
    assert not cuda_attention.enabled()
    pretend_cuda.setenv(cuda_attention.MODE_ENV, "mlx")
    assert cuda_attention.state().startswith("mlx (")


def test_doctor_names_what_the_gpu_attention_runs(pretend_cuda, capsys):
    from engine import doctor

    pretend_cuda.setattr(cuda_attention, "block_attention", mlx_block_attention)
    assert doctor.gpu_attention() == "kernel"
    pretend_cuda.setenv(cuda_attention.MODE_ENV, "kernal")
    assert "is unknown. Fix:" in doctor.gpu_attention()  # a report line, not a crash
    pretend_cuda.setenv(cuda_attention.MODE_ENV, "kernel")
    pretend_cuda.setattr(cuda_attention, "block_attention", None)  # not callable: fails
    assert doctor.gpu_attention().startswith("mlx (TypeError")
    capsys.readouterr()


def test_with_mlx_chosen_the_check_runs_nothing(pretend_cuda):
    pretend_cuda.setenv(cuda_attention.MODE_ENV, "mlx")
    pretend_cuda.setattr(cuda_attention, "block_attention", None)  # would fail if called
    assert cuda_attention.check() is None and cuda_attention.state() == "mlx"


def test_check_scripts_key_sweep_times_both_sides_per_layout_and_length(monkeypatch):
    script = load_script("gpu_attention_check")
    monkeypatch.setattr(script, "SWEEP_KEYS", (20, 40))
    # MLX's attention stands in for the kernel (no CUDA here)
    monkeypatch.setattr(cuda_attention, "block_attention", mlx_block_attention)
    rows = script.sweep_keys(iters=3)
    assert [(r["layout"], r["keys"]) for r in rows] == [
        (name, S) for name, *_ in script.LAYOUTS for S in (20, 40)]
    assert all(r["mlx_ms"] > 0 and r["kernel_ms"] > 0 and r["speedup"] > 0 for r in rows)


def test_check_script_proves_its_harness_without_cuda(tmp_path):
    out = tmp_path / "check.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_attention_check.py"),
                    "--out", str(out), "--iters", "3"], check=True, capture_output=True)
    report = json.loads(out.read_text())
    assert report["exactness"]["status"] == "skipped: no CUDA"
    assert report["harness_self_test"]["cases"] == 72  # causal or unmasked
    # the float32 reference agrees with MLX's attention to bf16/fp16 rounding
    assert 0 < report["harness_self_test"]["mlx_err_max"] < 0.05
    assert report["timing"]["mlx_ms"] > 0 and "kernel_ms" not in report["timing"]
    assert report["timing_by_keys"] == "skipped: no CUDA"


def test_on_cuda_with_the_kernel_on_target_layers_route_through_it(monkeypatch):
    from mlx_lm.models import llama

    from engine.targets import cpu_attention

    args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=1,
                           intermediate_size=128, num_attention_heads=2, rms_norm_eps=1e-5,
                           vocab_size=32, num_key_value_heads=1)
    module = llama.Attention(args)
    monkeypatch.setattr(cpu_attention, "current", lambda: "cuda")
    assert cpu_attention.attention_call(module) is None  # cuda_attention itself sees the CPU
    monkeypatch.setattr(cuda_attention, "enabled", lambda: True)
    call = cpu_attention.attention_call(module)
    assert (call.__globals__["scaled_dot_product_attention"]
            is cpu_attention.cuda_scaled_dot_product_attention)
    # float32 (or any call the kernel does not take) keeps mlx-lm's attention
    q, k, v = qkv(dtype=mx.float32, S=20)
    got = cpu_attention.cuda_scaled_dot_product_attention(q, k, v, None, 0.125, "causal")
    assert mx.array_equal(got, mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125,
                                                                     mask="causal"))


