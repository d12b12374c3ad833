"""Pure-attention targets (llama, qwen2, qwen3, mistral): KV caches roll back by trimming.

A verify forward runs the second half of each decoder layer (residual, post-attention norm,
MLP, residual) as one mx.compile'd function per layer, shapeless: traced once (at load, by
warm_up, with a full block) for every verify length, then replayed in C++: fewer Python calls and
less host time per verify build (benchmarks/host-cost-cpu.json; gpu_cycle_probe's host part
measures the GPU's share). The compiled half computes
the same primitives in the same order: on a GPU the half holds no chain of elementwise ops
that compiling could fuse (its norm is one kernel; swiglu is compiled by mlx-lm already), so
logits and taps are the model's own bit for bit (tests/test_cycle_sync.py checks it on CPU,
gpu_cycle_probe's host part on a GPU). Only where the host is the bottleneck: a CPU is bound
by its arithmetic, and there a norm falls back to elementwise ops that compiling would fuse.
Prefill and sharded targets run the model's own layers, except that on a CPU a layer's
attention may run through cpu_attention.py (the same code and bits, a faster softmax).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama, qwen2, qwen3
from mlx_lm.models.base import create_attention_mask

from ..device import current
from .base import TargetAdapter, cache_arrays
from .cpu_attention import KernelProjections, attention_call, kernel_sized

# Decoder layers whose __call__ is r = self_attn(input_layernorm(x), mask, cache);
# h = x + r; out = h + mlp(post_attention_layernorm(h)) (mistral loads as llama).
SPLIT_LAYERS = (llama.TransformerBlock, qwen2.TransformerBlock, qwen3.TransformerBlock)


def second_half(layer: nn.Module) -> Callable[[mx.array, mx.array], mx.array]:
    """The layer's code after its attention, compiled (its weights are traced as constants).
    Shapeless: a verify's length changes at the end of every reply, and a new trace (with,
    on a GPU, new kernels to build) would cost that reply far more than its last cycle."""
    def half(x: mx.array, r: mx.array) -> mx.array:
        h = x + r
        return h + layer.mlp(layer.post_attention_layernorm(h))

    return mx.compile(half, shapeless=True)


class AttentionAdapter(TargetAdapter):
    family = "attention"
    model_types = ("llama", "qwen2", "qwen3", "mistral")

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self._halves: list[Callable[[mx.array, mx.array], mx.array]] | None = None
        self._verifying = False
        self.compile_halves(current() != "cpu")
        self._attend = [attention_call(layer.self_attn) if type(layer) in SPLIT_LAYERS else None
                        for layer in self.layers]
        # On a CPU the attention modules as the rebound calls see them: their projections
        # through cpu_linear.c (which keeps MLX's for inputs it does not fit)
        self._attention = [KernelProjections(layer.self_attn) if self.on_cpu
                           and kernel_sized(layer.self_attn) else layer.self_attn
                           for layer in self.layers]

    def compile_halves(self, on: bool) -> bool:
        """Verify forwards with compiled layer halves (on) or the model's own layers (off);
        -> whether they are on (never for other decoder layers than SPLIT_LAYERS)."""
        on = on and all(type(layer) in SPLIT_LAYERS for layer in self.layers)
        self._halves = [second_half(layer) for layer in self.layers] if on else None
        return on

    def warm_up(self, verify_tokens: int = 16, tap_ids: Sequence[int] = ()) -> None:
        """Trace the compiled halves and build the kernels of a full-block verify (tapping the
        draft's `tap_ids`) on a scratch cache: on a GPU the first one otherwise stalls the
        first reply's first cycle."""
        if self._halves is None or self.lockstep is not None:
            return  # nothing compiled (sharded: the model's own layers)
        cache = self.make_cache()
        self.forward(mx.array([[0]]), cache, [], last_only=True)
        self.begin_verify(cache)
        logits, _ = self.forward(mx.zeros((1, verify_tokens), mx.int32), cache, tap_ids)
        self.rollback(cache, keep=0, verified=verify_tokens)
        mx.eval(logits, cache_arrays(cache))

    def _first_kv_index(self) -> int:
        return 0

    def _masks(self, h: mx.array, cache: list[Any]) -> dict[str, Any]:
        return {"attention": create_attention_mask(h, cache[0])}

    def _layer_forward(self, index: int, layer: nn.Module, h: mx.array, masks, cache) -> mx.array:
        if self.lockstep is not None:
            return layer(h, masks["attention"], cache=cache)
        attend = self._attend[index]
        half = self._halves[index] if self._verifying and self._halves is not None else None
        written_out = self.cpu_mlp and type(layer) in SPLIT_LAYERS  # the layer's own code
        if attend is None and half is None and not written_out:
            return layer(h, masks["attention"], cache=cache)
        x = layer.input_layernorm(h)
        if attend is None:
            r = layer.self_attn(x, masks["attention"], cache)
        else:
            r = attend(self._attention[index], x, masks["attention"], cache)
        if half is not None:
            return half(h, r)
        h = h + r
        return h + self._mlp(layer.mlp, layer.post_attention_layernorm(h))

    def begin_verify(self, cache: list[Any]) -> None:
        """Nothing to record (a KV cache rolls back by trimming): the next forward is a
        verify, with the compiled layer halves."""
        self._verifying = True

    def rollback(self, cache: list[Any], keep: int, verified: int) -> None:
        self._verifying = False
        drop = verified - keep
        if drop > 0:
            for c in cache:
                c.trim(drop)
