"""The DFlash block-diffusion draft, in the published z-lab checkpoint layout.

One forward turns `[staged, mask x (B-1)]` into B-1 proposals. Queries come from the
block; keys/values from the cached target context plus the block ("KV injection").
The draft has no embedding or lm_head of its own: it borrows the target's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from . import blas
from .device import current
from .kernels import cpu_linear, cpu_swiglu
from .kernels.cuda_attention import scaled_dot_product_attention as block_sdpa
from .targets import cpu_attention

# dflash_config keys of draft layouts this engine no longer runs (their experiments lost)
RETIRED = {"chain_units": "a token chain", "anchor_peek": "a peek at the anchor",
           "target_top": "the target's last layers on the draft's states"}


def default_tap_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """The documented default: one tap at L // 2; n taps spread from layer 1 to L - 3."""
    if num_taps == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_taps - 1)) for i in range(num_taps)]


@dataclass
class DraftArgs:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: int
    block_size: int = 16
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 40960
    vocab_size: int = 0
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    attention_bias: bool = False
    # Whether a block sees itself causally; None: in sliding-window layers only (z-lab's
    # reference reads an absent `is_causal` so)
    is_causal: bool | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @classmethod
    def from_config(cls, config: dict) -> DraftArgs:
        """Read both published variants: block_size top-level (Qwen3, LLaMA-3.1 drafts) or
        inside `dflash_config` (Qwen3.5+), taps from dflash_config or the default rule."""
        dflash = config.get("dflash_config") or {}
        missing = [
            k
            for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "num_target_layers")
            if k not in config
        ]
        if missing:
            raise KeyError(", ".join(missing))
        retired = next((k for k in RETIRED if dflash.get(k)), None)
        if retired is not None:
            raise ValueError(f"dflash_config.{retired} asks for {RETIRED[retired]}, which this "
                             "engine no longer runs")
        mask_id = dflash.get("mask_token_id", config.get("mask_token_id"))
        if mask_id is None:
            raise KeyError("dflash_config.mask_token_id")
        n_target = int(config["num_target_layers"])
        taps = dflash.get("target_layer_ids") or config.get("target_layer_ids")
        if not taps:
            taps = default_tap_ids(n_target, int(config.get("num_taps", 1)))
        rope_theta = config.get("rope_theta")
        if rope_theta is None:
            rope_theta = (config.get("rope_parameters") or {}).get("rope_theta", 1_000_000.0)
        return cls(
            hidden_size=int(config["hidden_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=int(config["num_attention_heads"]),
            num_key_value_heads=int(
                config.get("num_key_value_heads", config["num_attention_heads"])
            ),
            intermediate_size=int(config["intermediate_size"]),
            num_target_layers=n_target,
            target_layer_ids=[int(t) for t in taps],
            mask_token_id=int(mask_id),
            block_size=int(dflash.get("block_size", config.get("block_size", 16))),
            head_dim=config.get("head_dim"),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=config.get("rope_scaling"),
            max_position_embeddings=int(config.get("max_position_embeddings", 40960)),
            vocab_size=int(config.get("vocab_size", 0)),
            layer_types=config.get("layer_types"),
            sliding_window=config.get("sliding_window"),
            attention_bias=bool(config.get("attention_bias", False)),
            is_causal=config.get("is_causal"),
        )

    def to_config(self) -> dict:
        """config.json in the published layout (block_size both top-level and nested)."""
        cfg: dict[str, Any] = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "attention_bias": self.attention_bias,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": {
                "block_size": self.block_size,
                "target_layer_ids": list(self.target_layer_ids),
                "mask_token_id": self.mask_token_id,
            },
        }
        if self.layer_types:
            cfg["layer_types"] = self.layer_types
            cfg["sliding_window"] = self.sliding_window
        if self.is_causal is not None:
            cfg["is_causal"] = self.is_causal
        return cfg


class DraftAttention(nn.Module):
    def __init__(self, args: DraftArgs, sliding: bool):
        super().__init__()
        dim, hd = args.hidden_size, args.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = (
            args.num_attention_heads, args.num_key_value_heads, hd
        )
        self.scale = hd**-0.5
        bias = args.attention_bias
        self.q_proj = nn.Linear(dim, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, dim, bias=False)
        self.q_norm = nn.RMSNorm(hd, eps=args.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=args.rms_norm_eps)
        self.rope = initialize_rope(
            hd, args.rope_theta, False, args.rope_scaling, args.max_position_embeddings
        )
        self.window = args.sliding_window if sliding else None
        self.causal = sliding if args.is_causal is None else bool(args.is_causal)

    def _heads(self, x: mx.array, n: int) -> mx.array:
        B, L, _ = x.shape
        return x.reshape(B, L, n, self.head_dim).transpose(0, 2, 1, 3)

    def context_kv(self, ctx: mx.array, offset: int | mx.array, cpu: bool = False
                   ) -> tuple[mx.array, mx.array]:
        """K/V of context features [B, T, H], positions offset.. (k_norm and RoPE applied:
        cacheable); `offset` may be one per batch row [B]. `cpu`: the products through
        kernels/cpu_linear.py (inference only)."""
        k, v = (cpu_linear.linears(ctx, [self.k_proj, self.v_proj]) if cpu
                else (self.k_proj(ctx), self.v_proj(ctx)))
        k = self.rope(self.k_norm(self._heads(k, self.n_kv_heads)), offset=offset)
        return k, self._heads(v, self.n_kv_heads)

    def __call__(self, x: mx.array, cache: KVCache, start: int | mx.array, cpu: bool = False,
                 context_mask: mx.array | None = None) -> mx.array:
        """`context_mask` [context length] (bool): the cached context entries the block sees
        (a prefetched block's context still holds the verify's rejected positions); None: all
        of them, within a sliding window's reach (`block_mask`)."""
        B, L, _ = x.shape
        q, k, v = (cpu_linear.linears(x, [self.q_proj, self.k_proj, self.v_proj]) if cpu
                   else (self.q_proj(x), self.k_proj(x), self.v_proj(x)))
        q = self.rope(self.q_norm(self._heads(q, self.n_heads)), offset=start)
        k = self.rope(self.k_norm(self._heads(k, self.n_kv_heads)), offset=start)
        v = self._heads(v, self.n_kv_heads)
        ctx_k, ctx_v = cache.keys_and_values() if cache.offset else (k[:, :, :0], v[:, :, :0])
        if self.window is not None:  # the last window - 1: all that block slot 0 sees
            first = max(0, ctx_k.shape[2] - self.window + 1)
            ctx_k, ctx_v = ctx_k[:, :, first:], ctx_v[:, :, first:]
        keys = mx.concatenate([ctx_k, k], axis=2)
        values = mx.concatenate([ctx_v, v], axis=2)
        mask = self.block_mask(ctx_k.shape[2], L)
        if context_mask is not None:
            seen = mx.concatenate([context_mask, mx.ones((L,), dtype=mx.bool_)])[None]
            mask = seen if mask is None else mask & seen
        if mask is None:  # a bidirectional block that sees all of its context
            out = block_attention(q, keys, values, self.scale, cpu)
        else:
            out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale,
                                                       mask=mask[None, None])
        out = out.transpose(0, 2, 1, 3).reshape(B, L, -1)
        return cpu_linear.linear(out, self.o_proj) if cpu else self.o_proj(out)

    def block_mask(self, context: int, length: int) -> mx.array | None:
        """Which keys ([the last `context` context entries; the block], bool [length, context
        + length]) each block query sees, as z-lab's reference has it: in a sliding-window
        layer query i (at position start + i) sees the context above start + i - window, and
        a causal block sees itself causally. None: every key."""
        windowed = self.window is not None and context + length > self.window
        if not windowed and not self.causal:
            return None
        query = mx.arange(length)[:, None]
        key = mx.arange(context + length)[None]
        # context entry j sits at position start - context + j, query i at start + i
        seen = key >= context + query - self.window + 1 if windowed else key >= 0
        block = key >= context
        if self.causal:
            block = block & (key - context <= query)
        return mx.where(key < context, seen, block)


def block_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, cpu: bool) -> mx.array:
    """A block's attention over its context and itself, unmasked. `cpu`: through the target's
    C softmax where it applies (targets/cpu_attention.py: MLX's bits, faster; not
    differentiable, so for inference only)."""
    if cpu and cpu_attention.eligible(q, k, v, None, None, None):
        return cpu_attention.sdpa(q, k, v, scale, None)
    return block_sdpa(q, k, v, scale)


class DraftMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array, cpu: bool = False) -> mx.array:
        """`cpu`: the swiglu through kernels/cpu_swiglu.py (same bits, faster on a CPU) and the
        products through kernels/cpu_linear.py; neither is differentiable, so for inference
        only: training calls it without."""
        if not cpu:
            return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = cpu_linear.linears(x, [self.gate_proj, self.up_proj])
        return cpu_linear.linear(cpu_swiglu.swiglu(gate, up), self.down_proj)


class DraftLayer(nn.Module):
    def __init__(self, args: DraftArgs, sliding: bool):
        super().__init__()
        self.self_attn = DraftAttention(args, sliding)
        self.mlp = DraftMLP(args.hidden_size, args.intermediate_size)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, cache: KVCache, start: int | mx.array, cpu: bool = False,
                 context_mask: mx.array | None = None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), cache, start, cpu, context_mask)
        return h + self.mlp(self.post_attention_layernorm(h), cpu)


class DFlashDraft(nn.Module):
    layer_class: type[DraftLayer] = DraftLayer  # DFlash2 (engine/dflash2.py) wraps it

    def __init__(self, args: DraftArgs):
        super().__init__()
        self.args = args
        n_taps, H = len(args.target_layer_ids), args.hidden_size
        types = args.layer_types or ["full_attention"] * args.num_hidden_layers
        self.fc = nn.Linear(n_taps * H, H, bias=False)
        self.hidden_norm = nn.RMSNorm(H, eps=args.rms_norm_eps)
        self.layers = [self.layer_class(args, t == "sliding_attention") for t in types]
        self.norm = nn.RMSNorm(H, eps=args.rms_norm_eps)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def project_context(self, taps: mx.array, cpu: bool = False) -> mx.array:
        """Concatenated tapped target features [B, T, n_taps*H] -> context [B, T, H]. `cpu`:
        the product through kernels/cpu_linear.py (inference only)."""
        return self.hidden_norm(cpu_linear.linear(taps, self.fc) if cpu else self.fc(taps))

    def append_context(self, taps: mx.array, cache: list[KVCache]) -> None:
        """Project newly committed tokens' features once and cache their K/V per layer, at
        positions from the cache's length."""
        cpu = current() == "cpu"  # inference only: the products through cpu_linear.c
        ctx = self.project_context(taps, cpu)
        offset = cache[0].offset
        for layer, c in zip(self.layers, cache):
            c.update_and_fetch(*layer.self_attn.context_kv(ctx, offset, cpu))

    @property
    def can_prefetch(self) -> bool:
        """Whether a block can run before its context is settled (`__call__`'s `kept`): not
        with sliding-window layers, whose window would count the unsettled positions."""
        return all(layer.self_attn.window is None for layer in self.layers)

    def __call__(self, block_embeddings: mx.array, cache: list[KVCache],
                 unsettled: int = 0, kept: mx.array | None = None) -> mx.array:
        """Block embeddings [B, L, H] at positions offset.. -> normed hidden states [B, L, H].

        `unsettled` > 0: the cache's last `unsettled` entries are a verify's positions, of
        which only the first `kept` (a scalar still on the device) are context; the rest are
        trimmed once the count is read. The block then starts after the kept ones and sees
        only the context before them and them."""
        start: int | mx.array = cache[0].offset
        mask = None
        if unsettled:
            assert kept is not None and self.can_prefetch
            start = start - unsettled + kept
            mask = mx.arange(cache[0].offset) < start
        return self.forward_at(block_embeddings, cache, start, mask)

    def forward_at(self, block_embeddings: mx.array, cache: list[KVCache],
                   start: int | mx.array, context_mask: mx.array | None = None) -> mx.array:
        """Block embeddings [B, L, H] at positions start.. -> normed hidden states [B, L, H],
        seeing the cached context entries that `context_mask` [context length] (bool) holds
        (None: all of them)."""
        h = block_embeddings
        cpu = current() == "cpu"
        aside = self._blas_aside() if cpu and h.shape[0] * h.shape[1] <= cpu_linear.MAX_ROWS \
            else None
        restore = aside.single_thread() if aside is not None else 0  # cpu_linear.blas_aside
        try:
            for layer, c in zip(self.layers, cache):
                h = layer(h, c, start, cpu, context_mask)
        finally:
            if restore:
                aside.set(restore)  # type: ignore[union-attr]
        return self.norm(h)

    def _blas_aside(self) -> blas.Threads | None:
        """cpu_linear.blas_aside for this draft's weights, looked up once."""
        if "_aside" not in self.__dict__:
            self.__dict__["_aside"] = cpu_linear.blas_aside(self.fc.weight)
        return self.__dict__["_aside"]
