"""Attention for a block of a few queries (a verify, a draft block) in one CUDA kernel.

MLX's CUDA backend fuses attention for a single query row (`sdpa_vector`) and sends longer
queries to cuDNN (off in the engine: it builds a plan per shape, engine/__init__.py) or to
its unfused fallback: scale, matmul, mask, softmax, matmul, a dozen graph nodes per layer.
So a 16-token verify pays the fallback in every layer. `block_attention` computes the same
attention in one launch: one thread block per (query row, head), its warps splitting the
keys with an online softmax merged in shared memory, fp32 accumulation, inputs read through
their strides (a KV cache slice is not copied).

Its rounding differs from the fallback's (fp32 throughout), so it serves bf16/fp16 targets
only, whose verify is held to the near-tie rule anyway; float32 keeps MLX's own ops and stays
bit-identical to plain decoding. scripts/gpu_attention_check.py proves it on the GPU against a
float32 reference (never further off than MLX's own attention), so it is on by default on
CUDA; DFLASH_GPU_ATTENTION=mlx keeps MLX's attention everywhere.
"""

from __future__ import annotations

import os
import sys
from functools import cache
from typing import Any

import mlx.core as mx

from ..device import current

MODE_ENV = "DFLASH_GPU_ATTENTION"
MODES = ("mlx", "kernel")
MAX_QUERIES = 16  # a block: longer queries (prefill) keep MLX's attention
# Each warp walks its share of the keys one at a time, so its cost grows with keys x query
# heads x head size while MLX's matmuls stay nearly flat: past this much work MLX's attention
# is faster. Set from scripts/gpu_attention_check.py's `timing_by_keys` sweep (the largest
# SmolLM2 history it timed faster; a Qwen3-8B layout reaches it at a few hundred keys).
MAX_KEY_WORK = 4096 * 9 * 64
CHECK_TOLERANCE = 0.02  # a half-precision output's rounding, not a wrong result
_failed: str | None = None  # why the start-up check turned the kernel off in this process
WARPS = 4

SOURCE = r"""
    // grid (32 * NW, Hq, B * L) threads in blocks of 32 * NW: one block per (row, head).
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int h = blockIdx.y;
    const int L = q_shape[2];
    const int b = blockIdx.z / L;
    const int i = blockIdx.z % L;
    const int Hq = q_shape[1];
    const int S = k_shape[2];
    const int hk = h / (Hq / k_shape[1]);
    // causal: row i sits at position S - L + i and sees keys 0 .. S - L + i
    const int n_keys = CAUSAL ? S - L + i + 1 : S;
    const float sc = scale[0];
    float qr[EPL];
    float acc[EPL];
    const T* qp = q + b * q_strides[0] + h * q_strides[1] + i * q_strides[2];
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
      qr[e] = static_cast<float>(qp[(lane + 32 * e) * q_strides[3]]) * sc;
      acc[e] = 0.0f;
    }
    float m = __int_as_float(0xff800000);  // -inf (NVRTC has no INFINITY macro)
    float l = 0.0f;
    const T* kb = k + b * k_strides[0] + hk * k_strides[1];
    const T* vb = v + b * v_strides[0] + hk * v_strides[1];
    for (int j = warp; j < n_keys; j += NW) {
      const T* kp = kb + j * k_strides[2];
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        s += qr[e] * static_cast<float>(kp[(lane + 32 * e) * k_strides[3]]);
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, off);
      }
      const float m_new = fmaxf(m, s);
      const float corr = expf(m - m_new);  // 0 on a warp's first key (m = -inf)
      const float p = expf(s - m_new);
      l = l * corr + p;
      const T* vp = vb + j * v_strides[2];
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        acc[e] = acc[e] * corr + p * static_cast<float>(vp[(lane + 32 * e) * v_strides[3]]);
      }
      m = m_new;
    }
    __shared__ float s_m[NW];
    __shared__ float s_l[NW];
    __shared__ float s_acc[NW * D];
    if (lane == 0) {
      s_m[warp] = m;
      s_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < EPL; ++e) {
      s_acc[warp * D + lane + 32 * e] = acc[e];
    }
    __syncthreads();
    if (warp == 0) {
      float top = __int_as_float(0xff800000);
      for (int w = 0; w < NW; ++w) {
        top = fmaxf(top, s_m[w]);
      }
      float total = 0.0f;
      float o[EPL];
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        o[e] = 0.0f;
      }
      for (int w = 0; w < NW; ++w) {
        const float c = s_l[w] > 0.0f ? expf(s_m[w] - top) : 0.0f;  // a warp with no keys
        total += s_l[w] * c;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          o[e] += s_acc[w * D + lane + 32 * e] * c;
        }
      }
      T* op = out + ((size_t)(b * Hq + h) * L + i) * D;
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        op[lane + 32 * e] = static_cast<T>(o[e] / total);
      }
    }
"""


def mode() -> str:
    """$DFLASH_GPU_ATTENTION: "kernel" (the default) uses `block_attention` on CUDA, "mlx"
    keeps MLX's attention."""
    value = os.environ.get(MODE_ENV) or "kernel"
    if value not in MODES:
        from ..errors import ConfigError

        raise ConfigError(f"{MODE_ENV}={value!r} is unknown. Fix: set it to one of "
                          f"{', '.join(MODES)}, or unset it.")
    return value


def applies(q: mx.array, k: mx.array, v: mx.array, mask: Any, sinks: Any = None) -> bool:
    """Whether `block_attention` computes this call: a block of 2..16 bf16/fp16 queries over
    at most MAX_KEY_WORK keys x query heads x head size, no mask or the causal one, head
    size a multiple of 32 (<= 256), whole GQA groups."""
    causal = isinstance(mask, str) and mask == "causal"
    if sinks is not None or not (mask is None or causal):
        return False
    if q.dtype not in (mx.bfloat16, mx.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    L, D = q.shape[2], q.shape[3]
    return (2 <= L <= MAX_QUERIES and D % 32 == 0 and D <= 256 and v.shape[3] == D
            and q.shape[1] % k.shape[1] == 0 and k.shape[2] >= L
            and key_work(q, k) <= MAX_KEY_WORK)


def key_work(q: mx.array, k: mx.array) -> int:
    """What the kernel's time grows with: keys x query heads x head size."""
    return k.shape[2] * q.shape[1] * q.shape[3]


@cache
def _scale(value: float) -> mx.array:
    """The scale as a kernel input, made once per value (not once per layer and call)."""
    return mx.array([value], mx.float32)


@cache
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name="dflash_block_attention", input_names=["q", "k", "v", "scale"],
        output_names=["out"], source=SOURCE, ensure_row_contiguous=False)


def block_attention(q: mx.array, k: mx.array, v: mx.array, scale: float,
                    causal: bool) -> mx.array:
    """q [B, Hq, L, D], k and v [B, Hkv, S, D] (any strides) -> [B, Hq, L, D] in q's dtype:
    softmax(scale * q @ k.T, causal: row i sees keys up to S - L + i) @ v."""
    B, Hq, L, D = q.shape
    (out,) = _kernel()(
        inputs=[q, k, v, _scale(float(scale))],
        template=[("T", q.dtype), ("D", D), ("EPL", D // 32), ("NW", WARPS),
                  ("CAUSAL", causal)],
        grid=(32 * WARPS, Hq, B * L),
        threadgroup=(32 * WARPS, 1, 1),
        output_shapes=[(B, Hq, L, D)],
        output_dtypes=[q.dtype],
    )
    return out


def enabled() -> bool:
    """The kernel is on: a CUDA device, unless DFLASH_GPU_ATTENTION=mlx or the start-up
    check failed here."""
    return mode() == "kernel" and current() == "cuda" and _failed is None


def state() -> str:
    """What a verify block's attention runs on this device, for reports: "kernel", "mlx", or
    "mlx (...)" with the reason the start-up check gave."""
    if _failed is not None:
        return f"mlx ({_failed})"
    return "kernel" if enabled() else "mlx"


def check() -> str | None:
    """Compile and run the kernel once on a small block of each half precision against MLX's
    own attention, outside any compiled graph (the runtime calls this before its warm-up).
    A GPU or toolkit where it fails keeps MLX's attention for the rest of the process, with
    one line on stderr instead of an error mid-reply. -> why it failed, or None."""
    global _failed
    if not enabled():
        return _failed
    _failed = _checked()
    if _failed is not None:
        print(f"dflash: the fused block attention failed its start-up check on this GPU "
              f"({_failed}); MLX's attention runs instead. Set {MODE_ENV}=mlx to skip the "
              f"check.", file=sys.stderr)
    return _failed


def _checked() -> str | None:
    """Run the kernel on a small block of each half precision against MLX's attention.
    -> why it failed, or None."""
    try:
        keys = mx.random.split(mx.random.key(0), 3)
        for dtype in (mx.bfloat16, mx.float16):
            q, k, v = (mx.random.normal((1, 4, n, 64), key=key).astype(dtype)
                       for key, n in zip(keys, (3, 40, 40)))
            got = block_attention(q, k, v, 0.125, causal=False)
            # the reference reads the same rounded inputs, in float32
            want = mx.fast.scaled_dot_product_attention(
                *(x.astype(mx.float32) for x in (q, k, v)), scale=0.125)
            err = float(mx.max(mx.abs(got.astype(mx.float32) - want)))
            if not err <= CHECK_TOLERANCE:  # also catches nan
                raise ValueError(f"{dtype} output off by {err:.3g} from MLX's attention")
    except Exception as exc:  # a kernel that does not compile or run here: MLX's attention
        return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"
    return None


def scaled_dot_product_attention(q: mx.array, k: mx.array, v: mx.array, scale: float,
                                 mask: Any = None) -> mx.array:
    """mx.fast.scaled_dot_product_attention, through `block_attention` where it is on and
    applies."""
    if enabled() and applies(q, k, v, mask):
        return routed(q, k, v, scale, mask)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def routed(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Any) -> mx.array:
    """`block_attention` for a call that `applies`: mask None or "causal"."""
    return block_attention(q, k, v, scale, causal=mask is not None)
