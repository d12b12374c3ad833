"""The numerics policy: checkpoint precision on GPUs and Metal, float32 on the CPU, --dtype
overrides; the runtime reports what it loaded."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from engine.loading import checkpoint_precision, load_target, quantization


@pytest.fixture(scope="module")
def quantized_folder(tiny_pairs, tmp_path_factory):
    """The tiny llama target as a 4-bit MLX checkpoint (bf16 scales), as mlx_lm.convert -q
    writes one."""
    from mlx_lm.utils import load

    target, _ = tiny_pairs("llama")
    out = tmp_path_factory.mktemp("q4") / "tiny-llama-4bit"
    shutil.copytree(target, out)
    model, _ = load(str(target))
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=32, bits=4)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    config = json.loads((out / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 4}
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_policy_by_backend():
    assert checkpoint_precision(None, "cuda") and checkpoint_precision(None, "metal")
    assert not checkpoint_precision(None, "cpu")
    assert not checkpoint_precision("bfloat16", "cuda")  # --dtype overrides


def test_gpu_keeps_the_checkpoint_cpu_runs_float32(quantized_folder):
    stored, _, _ = load_target(str(quantized_folder), backend="cuda")
    q = quantization(stored)
    assert q == {"layers": q["layers"], "bits": [4], "group_size": [32], "mode": ["affine"]}
    assert stored.model.norm.weight.dtype == mx.bfloat16
    cpu, _, _ = load_target(str(quantized_folder), backend="cpu")
    assert quantization(cpu) is None and cpu.model.norm.weight.dtype == mx.float32
    # The same weights: the CPU's fp32 model is the checkpoint dequantized.
    layer = stored.model.layers[0].self_attn.q_proj
    dense = mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=32, bits=4)
    got = cpu.model.layers[0].self_attn.q_proj.weight
    assert mx.array_equal(got, dense.astype(mx.float32)).item()
    half, _, _ = load_target(str(quantized_folder), "float16", backend="cuda")
    assert quantization(half) is None and half.model.norm.weight.dtype == mx.float16


def test_runtime_describes_its_weights(quantized_folder, tiny_pairs):
    from engine import DFlashConfig, DFlashRuntime

    stored, tokenizer, _ = load_target(str(quantized_folder), backend="cuda")
    desc = DFlashRuntime(stored, tokenizer, None).describe()
    assert desc["dtype"] == "bfloat16" and desc["quantization"]["bits"] == [4]
    _, draft = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(str(quantized_folder), str(draft),
                                       DFlashConfig(dtype="float32"))
    assert rt.describe()["dtype"] == "float32" and rt.describe()["quantization"] is None


def test_engine_turns_cudnn_attention_off_unless_told():
    import os
    import subprocess
    import sys

    code = ("import os, engine; print(os.environ['MLX_CUDA_USE_CUDNN_SDPA'], "
            "os.environ['MLX_CUDA_USE_CUDNN_SPDA'])")  # both spellings MLX has used
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_CUDA_USE_CUDNN")}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    assert run.stdout.split() == ["0", "0"]
    env["MLX_CUDA_USE_CUDNN_SDPA"] = "1"  # the user's own setting wins
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    assert run.stdout.split() == ["1", "0"]
