"""scripts/gpu_cycle_probe.py runs on the CPU at small sizes (the H200 run is one call)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_probe_small_run_writes_every_part(tiny_pairs, tmp_path):
    target, draft = tiny_pairs("llama")
    out = tmp_path / "probe.json"
    # Without the setting, the probe's own process measures MLX's default (cuDNN SDPA on).
    env = {k: v for k, v in os.environ.items() if k != "MLX_CUDA_USE_CUDNN_SDPA"}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_cycle_probe.py"), "--small",
                    "--out", str(out), "--model", str(target), "--draft", str(draft),
                    "--precisions", "float32,q-bfloat16",
                    "--parts", "sdpa,forward,pieces,split,cycle"],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    report = json.loads(out.read_text())
    assert report["backend"] == "cpu" and report["env"]["MLX_CUDA_USE_CUDNN_SDPA"] == "1"
    assert {"fixed_kv_fast", "growing_kv_fast", "growing_kv_manual"} <= set(
        report["sdpa"]["bfloat16_q16_causal"])
    row = report["precisions"]["float32"]
    assert row["weights"]["quantized_linears"] == 0
    assert row["forward"]["dtypes"]["logits"] == "mlx.core.float32"
    assert row["forward"]["growing_kv_T16"]["n"] == report["settings"]["iters"]
    pieces = row["pieces"]
    assert set(pieces["T16"]) == {"norm", "q_proj", "k_proj", "v_proj", "rope", "attention",
                                  "attention_mlx", "o_proj", "mlp"}
    assert all(t["median_ms"] > 0 for t in pieces["T1"].values())
    assert pieces["attention_kernel"] == "mlx"  # a CPU
    split = row["split"]
    assert set(split) == {"ctx", "forward_T16", "forward_T1", "forward_T16_head_last_row",
                          "head_T16", "head_T1", "mlx_lm_model_T16", "mlx_lm_model_T1"}
    assert all(t["wall"]["n"] == report["settings"]["iters"] and t["wall"]["median_ms"] > 0
               for k, t in split.items() if k != "ctx")
    cycle = row["cycle"]["prompt0"]
    assert cycle["wholeblock"]["first_mismatch"] is None  # float32: plain greedy, bit for bit
    assert set(cycle["profiled_wholeblock_ms_per_cycle"]) == {"draft", "verify", "rollback"}
    laps = cycle["wholeblock"]["host_laps_median_ms"]
    assert set(laps) == {"draft_build", "verify_build", "wait_and_rollback", "outside"}
    assert all(v > 0 for k, v in laps.items() if k != "outside")
    # q-bfloat16 needs the offline GGUF: recorded as an error, the run goes on.
    assert "offline SmolLM2 GGUF" in report["precisions"]["q-bfloat16"]["error"]


def test_probe_host_part_counts_each_phase(tiny_pairs, tmp_path):
    """The host part builds each phase without evaluating it. The adapter's verify forward
    builds a smaller graph than mlx-lm's own 16-token call (its layer halves are compiled):
    a change that adds graph work per verify shows here."""
    for family in ("llama", "qwen3_5"):
        target, draft = tiny_pairs(family)
        out = tmp_path / f"host-{family}.json"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_cycle_probe.py"), "--small",
                        "--out", str(out), "--model", str(target), "--draft", str(draft),
                        "--precisions", "float32", "--parts", "host"],
                       cwd=ROOT, check=True, capture_output=True, timeout=600)
        host = json.loads(out.read_text())["precisions"]["float32"]["host"]
        phases = ("plain1", "plain16", "draft", "verify", "accept", "rollback")
        assert all(host[p]["build_ms"]["n"] == host["iters"] for p in phases), host
        assert all(host[p]["nodes"] > 0 and "launch_ms" not in host[p] for p in phases)
        assert host["accept"]["by_primitive"]["ArgReduce"] == 1  # its own nodes only
        if family == "llama":  # compiled layer halves: fewer nodes and Python calls
            assert host["verify"]["nodes"] < host["plain16"]["nodes"]
            assert host["verify"]["python_calls"] < host["plain16"]["python_calls"]
            assert host["compiled_halves_exact"] is True
        else:  # GatedDeltaNet verify forwards record a tape per linear layer
            assert host["verify"]["nodes"] > host["plain16"]["nodes"]
            assert host["compiled_halves_exact"] is None
