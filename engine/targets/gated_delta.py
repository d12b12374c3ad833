"""GatedDeltaNet hybrids (qwen3_5, qwen3_5_moe, qwen3_next): attention + linear layers.

Attention layers roll back by trimming their KVCache. Linear layers keep a recurrent
state that cannot be trimmed, so a verify forward runs them through `_linear_verify`,
which computes what mlx-lm's GatedDeltaNet computes while recording the state before
the verify plus a per-step tape; `rollback` rebuilds the state of the kept prefix.
Outside a verify (prefill, plain decode) the layers run as mlx-lm's own code. Sharded by
mlx-lm's shard(), a layer holds this rank's heads (its head counts are already divided): the
tape, replay and conv rows are per rank, on those heads, and the output is all_summed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.gated_delta import compute_g, normalize_qk

from ..kernels import GatedDeltaKernels, Tape, select
from ..kernels.portable import conv_rows
from .base import TargetAdapter, cache_arrays
from .cpu_attention import attention_call
from .merged import MergedProjection, merging_enabled


@dataclass
class _LinearRecord:
    """What one linear layer needs to roll back a verify."""

    conv_state: mx.array  # [B, K-1, conv_dim] before the verify
    state: mx.array  # [B, Hv, Dv, Dk] before the verify
    qkv: mx.array  # [B, T, conv_dim] conv inputs of the verify steps
    tape: Tape
    inputs: tuple[mx.array, ...] | None  # (q, k, v, g, beta) for the re-run path


def input_projections(attn: nn.Module) -> list[nn.Module]:
    """A GatedDeltaNet mixer's input projections, in the order mlx-lm applies them."""
    if hasattr(attn, "in_proj_qkvz"):  # qwen3_next
        return [attn.in_proj_qkvz, attn.in_proj_ba]
    return [attn.in_proj_qkv, attn.in_proj_z, attn.in_proj_b, attn.in_proj_a]


class GatedDeltaAdapter(TargetAdapter):
    family = "gated_delta"
    model_types = ("qwen3_5", "qwen3_5_moe", "qwen3_next")

    def __init__(
        self,
        model: nn.Module,
        enable_tape_replay: bool = True,
        kernels: GatedDeltaKernels | str | None = None,
    ):
        """`enable_tape_replay=False` rebuilds rolled-back states by re-running the kept steps
        (the reference path); `kernels`: a kernel set, or a mode for `kernels.select`
        ("auto", "portable", "native"; None: $DFLASH_KERNELS or "auto")."""
        super().__init__(model)
        self.enable_tape_replay = enable_tape_replay
        self.kernels = kernels if isinstance(kernels, GatedDeltaKernels) else select(mode=kernels)
        self._kv_index = next(i for i, layer in enumerate(self.layers) if not layer.is_linear)
        self._ssm_index = next(i for i, layer in enumerate(self.layers) if layer.is_linear)
        self._records: dict[int, _LinearRecord] | None = None
        # On a CPU, full-attention layers through cpu_attention.py (same bits, faster softmax).
        self._attend = [None if layer.is_linear else attention_call(layer.self_attn)
                        for layer in self.layers]
        # Per linear layer, its input projections as one matmul in verifies (merged.py),
        # built at the layer's first verify; None where they cannot merge.
        self._merged: dict[int, MergedProjection | None] = {}

    @classmethod
    def build(cls, model: nn.Module, enable_tape_replay: bool = True,
              kernels: str | None = None, **_: Any) -> GatedDeltaAdapter:
        return cls(model, enable_tape_replay, kernels)

    def _first_kv_index(self) -> int:
        return self._kv_index

    def _masks(self, h: mx.array, cache: list[Any]) -> dict[str, Any]:
        return {
            "attention": create_attention_mask(h, cache[self._kv_index]),
            "ssm": create_ssm_mask(h, cache[self._ssm_index]),
        }

    def _layer_forward(self, index: int, layer: nn.Module, h: mx.array, masks, cache) -> mx.array:
        verify = layer.is_linear and self._records is not None
        attend = None if layer.is_linear or self.lockstep is not None else self._attend[index]
        if not verify and attend is None and not self.cpu_mlp:
            return layer(h, masks["ssm" if layer.is_linear else "attention"], cache=cache)
        # DecoderLayer.__call__, in verify with the linear mixer swapped for the recording one.
        x = layer.input_layernorm(h)
        if verify:
            r = self._linear_verify(index, layer.linear_attn, x, masks["ssm"], cache)
        elif layer.is_linear:
            r = layer.linear_attn(x, masks["ssm"], cache)
        elif attend is not None:
            r = attend(layer.self_attn, x, masks["attention"], cache)
        else:
            r = layer.self_attn(x, masks["attention"], cache)
        h = h + r
        return h + self._mlp(layer.mlp, layer.post_attention_layernorm(h))

    # -- verify / rollback -------------------------------------------------------------
    def warm_up(self, verify_tokens: int = 16, tap_ids: Sequence[int] = ()) -> None:
        """JIT-compile native kernels now: a compile takes seconds (docs/install.md, GPUs),
        which would otherwise stall the first rejected draft of the first reply. A 2-token
        verify and a 1-token rollback on a scratch cache reach both kernels."""
        if self.kernels.name == "portable":
            return
        cache = self.make_cache()
        self.forward(mx.array([[0]]), cache, [], last_only=True)
        self.begin_verify(cache)
        logits, _ = self.forward(mx.array([[0, 0]]), cache, [])
        self.rollback(cache, keep=1, verified=2)
        mx.eval(logits, cache_arrays(cache))

    def begin_verify(self, cache: list[Any]) -> None:
        self._records = {}

    def _linear_verify(self, index: int, attn: nn.Module, x: mx.array, mask, cache) -> mx.array:
        """mlx-lm GatedDeltaNet.__call__ (both projection layouts), recording a tape."""
        if mask is not None:
            raise ValueError("verify forwards are batch-1 without padding masks")
        B, S, _ = x.shape
        merged = self.merged_projection(index)
        projected = merged(x) if merged is not None else [m(x) for m in input_projections(attn)]
        if hasattr(attn, "in_proj_qkvz"):  # qwen3_next
            q, k, v, z, b, a = attn.fix_query_key_value_ordering(*projected)
            qkv = mx.concatenate(
                [q.reshape(B, S, -1), k.reshape(B, S, -1), v.reshape(B, S, -1)], axis=-1
            )
        else:  # qwen3_5
            qkv, z, b, a = projected
            z = z.reshape(B, S, attn.num_v_heads, attn.head_v_dim)

        n_keep = attn.conv_kernel_size - 1
        conv_state = cache[0]
        if conv_state is None:
            conv_state = mx.zeros((B, n_keep, attn.conv_dim), dtype=x.dtype)
        conv_input = mx.concatenate([conv_state, qkv], axis=1)
        cache[0] = mx.contiguous(conv_input[:, -n_keep:, :])
        conv_out = nn.silu(attn.conv1d(conv_input))

        q, k, v = [
            t.reshape(B, S, h, d)
            for t, h, d in zip(
                mx.split(conv_out, [attn.key_dim, 2 * attn.key_dim], -1),
                [attn.num_k_heads, attn.num_k_heads, attn.num_v_heads],
                [attn.head_k_dim, attn.head_k_dim, attn.head_v_dim],
                strict=True,
            )
        ]
        q, k = normalize_qk(q, k, inv_scale=attn.head_k_dim**-0.5, eps=1e-6)
        beta = mx.sigmoid(b)
        g = compute_g(attn.A_log, a, attn.dt_bias)
        state = cache[1]
        if state is None:
            state = mx.zeros((B, attn.num_v_heads, attn.head_v_dim, attn.head_k_dim), mx.float32)

        out, cache[1], tape = self.kernels.verify(q, k, v, g, beta, state)
        cache.advance(S)
        inputs = None if self.enable_tape_replay else (q, k, v, g, beta)
        self._records[index] = _LinearRecord(conv_state, state, qkv, tape, inputs)

        out = attn.out_proj(attn.norm(out, z).reshape(B, S, -1))
        group = getattr(attn, "sharding_group", None)  # sharded: this rank's heads only
        return out if group is None else mx.distributed.all_sum(out, group=group)

    def merged_projection(self, index: int) -> MergedProjection | None:
        """Linear layer `index`'s input projections as one matmul for its verifies, built at
        the first call: off the CPU (merged.py); None where they stay separate."""
        if index not in self._merged:
            on = merging_enabled() and not self.on_cpu and self.lockstep is None
            modules = input_projections(self.layers[index].linear_attn)
            self._merged[index] = MergedProjection.of(modules) if on else None
        return self._merged[index]

    def rollback(self, cache: list[Any], keep: int, verified: int) -> None:
        """Keep the first `keep` of `verified` tokens: trim KV, rebuild linear states."""
        records, self._records = self._records, None
        drop = verified - keep
        if drop <= 0:
            return  # the verify's final states are already the kept ones
        if records is None:
            raise RuntimeError("rollback needs a forward after begin_verify")
        for i, (layer, c) in enumerate(zip(self.layers, cache, strict=True)):
            if not layer.is_linear:
                c.trim(drop)
                continue
            rec = records[i]
            if rec.inputs is None:
                c[1], c[0] = self.kernels.roll_back(rec.state, rec.tape, keep, rec.conv_state,
                                                    rec.qkv)
                continue
            # Reference path: re-run the recurrence on the kept steps' recorded inputs.
            q, k, v, g, beta = (t[:, :keep] for t in rec.inputs)
            c[1] = self.kernels.verify(q, k, v, g, beta, rec.state)[1]
            c[0] = conv_rows(rec.conv_state, rec.qkv, keep)
