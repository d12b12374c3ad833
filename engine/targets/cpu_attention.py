"""Target attention on a CPU with the exact vectorized softmax (engine/kernels/cpu_softmax.c).

On a CPU `mx.fast.scaled_dot_product_attention` is its fallback in mlx/fast.cpp: scaled q @
k.T (GQA by unflattening q's heads), a causal `where`, `softmax(precise=True)`, @ v, and that
softmax is most of its time over a long history. `sdpa` runs the same ops, evaluates the
scores (one sync per layer, microseconds on a CPU), runs the kernel on them in place (it
writes the causal mask's values itself, saving the `where` pass) and goes on with the same
matmul: the output is MLX's bit for bit (tests/test_cpu_softmax.py).

The engine calls it only from its own layer forwards: `attention_call(module)` is the
module's own mlx-lm `__call__` code, rebound to globals where `scaled_dot_product_attention`
is ours; mlx-lm's modules and functions stay untouched for everyone else in the process.
On CUDA the same rebinding sends a verify block's attention to one fused kernel
(engine/kernels/cuda_attention.py) unless DFLASH_GPU_ATTENTION=mlx.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base, llama, qwen2, qwen3, qwen3_next

from ..device import current
from ..kernels import cpu_linear, cpu_softmax, cuda_attention

# Attention modules whose __call__ reaches attention through their module's global
# scaled_dot_product_attention (qwen3_5's full-attention layers are Qwen3NextAttention).
MODULES = (llama.Attention, qwen2.Attention, qwen3.Attention, qwen3_next.Qwen3NextAttention)


def sdpa(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: str | None) -> mx.array:
    """mlx/fast.cpp's fallback op for op (mask None or "causal"), its softmax in place."""
    n_q, L = q.shape[1], q.shape[2]
    n_kv = k.shape[1]
    q = mx.array(scale, dtype=q.dtype) * q
    if n_q > n_kv:
        q = mx.unflatten(q, 1, (n_kv, n_q // n_kv))
        k, v = mx.expand_dims(k, 2), mx.expand_dims(v, 2)
    scores = q @ mx.swapaxes(k, -1, -2)
    mx.eval(scores)
    causal = isinstance(mask, str) and mask == "causal"
    offset = k.shape[-2] - L if causal else None  # the kernel applies the causal mask
    if not cpu_softmax.softmax_(scores, offset):
        if offset is not None:
            allowed = mx.arange(offset, offset + L)[:, None] >= mx.arange(0, k.shape[-2])[None]
            scores = mx.where(allowed, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
        scores = mx.softmax(scores, axis=-1, precise=True)
    out = scores @ v
    return mx.flatten(out, 1, 2) if n_q > n_kv else out


def eligible(q: mx.array, k: mx.array, v: mx.array, mask: Any, cache: Any, sinks: Any) -> bool:
    causal = isinstance(mask, str) and mask == "causal"
    if sinks is not None or hasattr(cache, "bits") or not (mask is None or causal):
        return False
    if q.dtype != mx.float32 or k.dtype != mx.float32 or v.dtype != mx.float32:
        return False
    if k.shape[-2] < q.shape[-2] or current() != "cpu":
        return False
    mode = cpu_softmax.mode()  # "off": never; "on": every size; "auto": big enough to pay
    # scores per forward: query rows x keys, all heads
    big = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[-2] >= cpu_softmax.MIN_ELEMENTS
    return mode != "off" and (big or mode == "on") and cpu_softmax.library() is not None


def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """mlx_lm.models.base.scaled_dot_product_attention, through `sdpa` where eligible."""
    if eligible(queries, keys, values, mask, cache, sinks):
        return sdpa(queries, keys, values, scale, mask)
    return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale,
                                             mask=mask, sinks=sinks)


def cuda_scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None):
    """The same on CUDA, through cuda_attention's block kernel where it applies (a verify)."""
    if not hasattr(cache, "bits") and cuda_attention.applies(queries, keys, values, mask, sinks):
        return cuda_attention.routed(queries, keys, values, scale, mask)
    return base.scaled_dot_product_attention(queries, keys, values, cache=cache, scale=scale,
                                             mask=mask, sinks=sinks)


class KernelProjections:
    """An attention module as its own __call__ sees `self`, with its q/k/v/o projections
    through kernels/cpu_linear.py (a verify's few rows on a CPU): q, k and v in one call,
    since the modules in MODULES ask for them one after another on the same input."""

    def __init__(self, module: nn.Module):
        self._module = module
        self._pending: tuple[mx.array, mx.array, mx.array] | None = None  # (x, k, v)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set yet (a copy being built): never the module's
            raise AttributeError(name)
        return getattr(self._module, name)

    def q_proj(self, x: mx.array) -> mx.array:
        m = self._module
        q, k, v = cpu_linear.linears(x, [m.q_proj, m.k_proj, m.v_proj])
        self._pending = (x, k, v)
        return q

    def k_proj(self, x: mx.array) -> mx.array:
        if self._pending is not None and self._pending[0] is x:
            return self._pending[1]
        return cpu_linear.linear(x, self._module.k_proj)

    def v_proj(self, x: mx.array) -> mx.array:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] is x:
            return pending[2]
        return cpu_linear.linear(x, self._module.v_proj)

    def o_proj(self, x: mx.array) -> mx.array:
        return cpu_linear.linear(x, self._module.o_proj)


def kernel_sized(module: nn.Module) -> bool:
    """Whether an attention module's projections are plain float32 Linear layers the kernel
    may take (any size with DFLASH_CPU_KERNELS=on): else its own calls, with no wrapper."""
    q = getattr(module, "q_proj", None)
    return (type(q) is nn.Linear and q.weight.dtype == mx.float32
            and (q.weight.size >= cpu_linear.MIN_WEIGHT or cpu_linear.mode() == "on"))


_calls: dict[tuple[type, Callable], Callable[..., mx.array]] = {}


def attention_call(module: nn.Module) -> Callable[..., mx.array] | None:
    """(module, x, mask, cache) -> its output: the class's own __call__ with our
    scaled_dot_product_attention (CPU; called on `KernelProjections(module)` there, its
    products go through cpu_linear.c too), or the CUDA one with the block kernel when it is
    on. None for other modules, or when neither applies."""
    cls = type(module)
    if cls not in MODULES:
        return None
    if current() == "cpu" and cpu_softmax.mode() != "off":
        ours = scaled_dot_product_attention
    elif cuda_attention.enabled():
        ours = cuda_scaled_dot_product_attention
    else:
        return None
    if (cls, ours) not in _calls:
        fn = cls.__call__
        scope = {**fn.__globals__, "scaled_dot_product_attention": ours}
        _calls[cls, ours] = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__,
                                               fn.__closure__)
    return _calls[cls, ours]
