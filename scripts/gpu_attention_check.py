"""Exactness and timing of the fused block-attention kernel (engine/kernels/cuda_attention.py).

    python scripts/gpu_attention_check.py --out $OUT/gpu-attention-check-h200.json

(a) The kernel against attention computed in float32 from the same bf16/fp16 inputs, and
    MLX's own attention (its unfused fallback for these shapes) against the same reference:
    the kernel passes when its error is within MLX's own (plus a small tolerance). Cases:
    the SmolLM2 and a Qwen3-8B head layout, 2..16 queries, causal or unmasked, key lengths
    from the block alone to a long history, keys read from a larger cache buffer (strided).
(b) Timing: 30 layers' attention at a 16-token verify's shape, the kernel against MLX's
    (`timing`: SmolLM2 over a 300-token history), and across history lengths for both
    layouts (`timing_by_keys`): the kernel walks the keys one at a time per warp, so where
    MLX's matmuls overtake it sets `cuda_attention.MAX_KEY_WORK`.
Without CUDA the kernel parts say "skipped: no CUDA" and the harness checks MLX's attention
against the reference instead, so a CPU run proves the script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401,I001  (first: the fast CPU BLAS)
import mlx.core as mx  # noqa: E402,I001
from engine import device  # noqa: E402
from engine.kernels import cuda_attention  # noqa: E402

# (name, query heads, KV heads, head size)
LAYOUTS = [("smollm2", 9, 3, 64), ("qwen3-8b", 32, 8, 128)]
QUERIES = (2, 7, 16)
KEYS = (16, 300, 1500)  # the block alone, a chat turn, a long history
SWEEP_KEYS = (316, 1040, 2064, 4112, 16400)  # timing: histories up to a long chat
DTYPES = ("bfloat16", "float16")
SLACK = 2e-3  # the kernel may exceed MLX's own error by this much (absolute)


MASKS = ("causal", "none")


def reference(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: str | None
              ) -> mx.array:
    """Attention in float32, GQA by repeating KV heads."""
    q, k, v = (x.astype(mx.float32) for x in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = mx.repeat(k, rep, axis=1), mx.repeat(v, rep, axis=1)
    scores = (q * scale) @ k.transpose(0, 1, 3, 2)
    L, S = q.shape[2], k.shape[2]
    if mask is not None:
        scores = mx.where(mx.arange(S)[None] <= (S - L + mx.arange(L))[:, None], scores,
                          -mx.inf)
    return mx.softmax(scores, axis=-1) @ v


def inputs(hq: int, hkv: int, d: int, L: int, S: int, dtype: str, seed: int
           ) -> tuple[mx.array, mx.array, mx.array]:
    """q [1, hq, L, d] and k, v [1, hkv, S, d] sliced from a larger cache buffer."""
    mx.random.seed(seed)
    dt = getattr(mx, dtype)
    cap = (S // 256 + 1) * 256
    q = mx.random.normal((1, L, hq, d)).astype(dt).transpose(0, 2, 1, 3)  # strided, as a model's
    kbuf = mx.random.normal((1, hkv, cap, d)).astype(dt)
    vbuf = mx.random.normal((1, hkv, cap, d)).astype(dt)
    mx.eval(q, kbuf, vbuf)
    return q, kbuf[:, :, :S], vbuf[:, :, :S]


def err(a: mx.array, b: mx.array) -> float:
    return float(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))))


def check_cases(kernel: bool) -> list[dict]:
    rows = []
    for name, hq, hkv, d in LAYOUTS:
        for dtype in DTYPES:
            for L in QUERIES:
                for S in KEYS:
                    for kind in MASKS:
                        if S < L:
                            continue
                        q, k, v = inputs(hq, hkv, d, L, S, dtype, seed=L * 7 + S)
                        scale = d ** -0.5
                        mask = kind if kind == "causal" else None
                        ref = reference(q, k, v, scale, mask)
                        own = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale,
                                                                   mask=mask)
                        row: dict[str, Any] = {"case": f"{name}-{dtype}-L{L}-S{S}"
                                               + ("" if kind == "none" else f"-{kind}"),
                                               "mlx_err": err(own, ref)}
                        if kernel:
                            # beyond MAX_KEY_WORK the engine keeps MLX's attention (speed,
                            # not exactness): the kernel is still checked there
                            assert cuda_attention.applies(q, k, v, mask) or (
                                cuda_attention.key_work(q, k) > cuda_attention.MAX_KEY_WORK)
                            out = cuda_attention.routed(q, k, v, scale, mask)
                            row["kernel_err"] = err(out, ref)
                            row["pass"] = (out.shape == own.shape and out.dtype == own.dtype
                                           and row["kernel_err"] <= row["mlx_err"] + SLACK)
                        rows.append(row)
    return rows


def time_layers(kernel: bool, iters: int, layers: int = 30, hq: int = 9, hkv: int = 3,
                d: int = 64, S: int = 316) -> dict:
    """`layers` layers' causal attention at a 16-token verify over an (S - 16)-token history
    (default: SmolLM2 after a 300-token history)."""
    q, k, v = inputs(hq, hkv, d, 16, S, "bfloat16", seed=0)
    scale = d ** -0.5
    mask = "causal"

    def run(fn) -> float:
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            mx.eval([fn() for _ in range(layers)])
            times.append(time.perf_counter() - start)
        return statistics.median(times[2:]) * 1e3

    out = {"mlx_ms": run(lambda: mx.fast.scaled_dot_product_attention(
        q, k, v, scale=scale, mask=mask))}
    if kernel:
        out["kernel_ms"] = run(lambda: cuda_attention.routed(q, k, v, scale, mask))
        out["speedup"] = out["mlx_ms"] / out["kernel_ms"]
    return out


def sweep_keys(iters: int) -> list[dict]:
    """The kernel against MLX's attention per history length, for both head layouts."""
    return [{"layout": name, "keys": S, **time_layers(True, iters, hq=hq, hkv=hkv, d=d, S=S)}
            for name, hq, hkv, d in LAYOUTS for S in SWEEP_KEYS]


def run_checks(iters: int) -> dict:
    from engine.bench.environment import machine_info, versions

    cuda = device.present("cuda")
    if cuda:
        mx.set_default_device(mx.gpu)
    report: dict[str, Any] = {"script": "scripts/gpu_attention_check.py",
                              "machine": machine_info(), "versions": versions(),
                              "cuda_available": cuda}
    cases = check_cases(kernel=cuda)
    if cuda:
        report["exactness"] = {"status": "pass" if all(c["pass"] for c in cases) else "fail",
                               "cases": cases}
    else:
        report["exactness"] = {"status": "skipped: no CUDA"}
        report["harness_self_test"] = {"cases": len(cases),
                                       "mlx_err_max": max(c["mlx_err"] for c in cases)}
    report["timing"] = time_layers(cuda, iters if cuda else 3)
    report["timing_by_keys"] = sweep_keys(iters) if cuda else "skipped: no CUDA"
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("gpu-attention-check.json"))
    p.add_argument("--iters", type=int, default=30, help="timing iterations")
    args = p.parse_args(argv)
    report = run_checks(args.iters)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    ex = report["exactness"]
    print(f"gpu_attention_check: {ex['status']}; timing {report['timing']}")
    for row in report["timing_by_keys"] if report["cuda_available"] else []:
        print(f"  {row['layout']} {row['keys']} keys: mlx {row['mlx_ms']:.2f} ms, kernel "
              f"{row['kernel_ms']:.2f} ms ({row['speedup']:.2f}x)")
    for c in ex.get("cases", []):
        if not c["pass"]:
            print(f"  FAIL {c['case']}: kernel {c['kernel_err']:.2e} vs mlx {c['mlx_err']:.2e}")
    print(f"wrote {args.out}")
    return 0 if ex["status"] in ("pass", "skipped: no CUDA") else 1


if __name__ == "__main__":
    sys.exit(main())
