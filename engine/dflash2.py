"""The DFlash2 draft (z-lab's `DFlash2DraftModel`), in its published checkpoint layout.

DFlash2 keeps DFlash's block forward (KV injection of the target's tapped features, the
target's embedding and lm_head) and adds two things:
- each layer wraps its attention and its MLP in a grouped dynamic causal convolution over the
  block's slots (`DynamicConv`: a fixed kernel plus one predicted per slot and channel group),
  so a slot sees the slots just before it through more than attention;
- a candidate selector (`CandidateSelector`) picks the block's path among each slot's top-k
  tokens, one slot after the other: a candidate's score is its logit plus a low-rank edge
  between the token picked before it and itself, read through the slot's hidden state. The
  path, not each slot's argmax, is the proposal. At temperature > 0 the selector samples the
  path from those scores, so its proposal distribution is that of the sequential draws.

The published configs put every layer in a sliding window (`sliding_attention`) with a
bidirectional block (`is_causal: false`): a block query at position t sees the context keys at
positions above t - window, and the whole block (`DraftAttention.block_mask`, as for DFlash
drafts). Architecture facts from z-lab's reference
(PyPI `dflash` 0.1.0, `dflash/model_mlx.py`); `scripts/check_zlab_reference.py` compares this
module against it on the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from .draft import DFlashDraft, DraftArgs, DraftLayer
from .draft_head import DraftHead
from .sampling import Sampler

ARCHITECTURE = "DFlash2DraftModel"
# Stored under these names without the `.weight` suffix (z-lab's layout): the module's
# embeddings are `<name>.weight` here.
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")
SELECTOR_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
LAYER_TYPES = ("full_attention", "sliding_attention")


def is_dflash2(config: dict) -> bool:
    """Whether a draft config.json declares z-lab's DFlash2 architecture."""
    return ARCHITECTURE in (config.get("architectures") or [])


@dataclass
class DFlash2Args(DraftArgs):
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    @classmethod
    def from_config(cls, config: dict) -> DFlash2Args:
        """Read a `DFlash2DraftModel` config.json as the reference does. ValueError or KeyError
        names what is missing or inconsistent."""
        base = DraftArgs.from_config(config)
        dflash = config.get("dflash_config") or {}
        missing = [f"dflash_config.{k}" for k in SELECTOR_KEYS if k not in dflash]
        missing += [k for k in ("vocab_size",) if k not in config]
        if missing:
            raise KeyError(", ".join(missing))
        rope = config.get("rope_parameters") or config.get("rope_scaling")
        theta = config.get("rope_theta", (rope or {}).get("rope_theta", 10000.0))
        softcap = dflash.get("final_logit_softcapping", config.get("final_logit_softcapping"))
        args = cls(
            **{f.name: getattr(base, f.name) for f in fields(DraftArgs)},
            conv_kernel_size=int(dflash["conv_kernel_size"]),
            conv_group_size=int(dflash["conv_group_size"]),
            selector_rank=int(dflash["selector_rank"]),
            selector_top_k=int(dflash["selector_top_k"]),
            input_embedding_scale=float(dflash.get("input_embedding_scale", 1.0)),
            output_multiplier=float(dflash.get("output_multiplier", 1.0)),
            final_logit_softcapping=None if softcap is None else float(softcap),
        )
        args.rope_theta, args.rope_scaling = float(theta), rope
        args.check()
        return args

    def check(self) -> None:
        """The shapes the weights are built from must be consistent (ValueError)."""
        for name in SELECTOR_KEYS:
            if getattr(self, name) < 1:
                raise ValueError(f"dflash_config.{name} must be a positive integer")
        if self.hidden_size % self.conv_group_size:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"dflash_config.conv_group_size {self.conv_group_size}")
        if not 0 < self.selector_top_k <= self.vocab_size:
            raise ValueError(f"dflash_config.selector_top_k {self.selector_top_k} is not within "
                             f"the vocabulary (vocab_size {self.vocab_size})")
        types = self.layer_types or []
        if types and len(types) != self.num_hidden_layers:
            raise ValueError(f"layer_types lists {len(types)} layers, num_hidden_layers is "
                             f"{self.num_hidden_layers}")
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"unknown layer_types {unknown}")
        if "sliding_attention" in types and not self.sliding_window:
            raise ValueError("sliding_attention layers need a sliding_window")

    def to_config(self) -> dict:
        """config.json in z-lab's published DFlash2 layout."""
        cfg: dict[str, Any] = {
            "architectures": [ARCHITECTURE],
            "model_type": "qwen3",
            "attention_bias": self.attention_bias,
            "is_causal": self.is_causal,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "num_target_layers": self.num_target_layers,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "dflash_config": {
                "block_size": self.block_size,
                "conv_group_size": self.conv_group_size,
                "conv_kernel_size": self.conv_kernel_size,
                "mask_token_id": self.mask_token_id,
                "selector_rank": self.selector_rank,
                "selector_top_k": self.selector_top_k,
                "target_layer_ids": list(self.target_layer_ids),
            },
        }
        if self.is_causal is None:
            del cfg["is_causal"]
        if self.layer_types:
            cfg["layer_types"] = list(self.layer_types)
            cfg["sliding_window"] = self.sliding_window
            cfg["use_sliding_window"] = "sliding_attention" in self.layer_types
        extra = {"input_embedding_scale": 1.0, "output_multiplier": 1.0,
                 "final_logit_softcapping": None}
        for key, default in extra.items():
            if getattr(self, key) != default:
                cfg["dflash_config"][key] = getattr(self, key)
        return cfg


def causal_convolve(x: mx.array, dynamic: mx.array, base: mx.array, group_size: int
                    ) -> mx.array:
    """x [B, L, H] -> y [B, L, H] with y[t] = sum over offsets o of (base[o] + dynamic[t, o]) *
    x[t - o] (zero before the block's first slot); `base` [K, H] per channel, `dynamic`
    [B, L, K, H // group_size] per slot and channel group."""
    out = mx.zeros_like(x)
    for o in range(base.shape[0]):
        shifted = x if o == 0 else mx.pad(x[:, :-o], [(0, 0), (o, 0), (0, 0)])
        weight = base[o].astype(x.dtype) + mx.repeat(dynamic[:, :, o], group_size, axis=-1)
        out = out + weight * shifted
    return out


class DynamicConv(nn.Module):
    """A grouped dynamic causal convolution around a sublayer: `prepare` convolves its input
    and predicts the kernel that `finish` convolves its output with (z-lab's
    `GroupedDynamicCausalConv`: parameters `base_kernel` [2, K, H], `kernel_projection`)."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.base_kernel = mx.zeros((2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(
            hidden_size, 2 * kernel_size * (hidden_size // group_size), bias=False)

    def prepare(self, x: mx.array) -> tuple[mx.array, mx.array]:
        """x [B, L, H] -> (x convolved, the kernel for `finish` [B, L, K, groups])."""
        groups = x.shape[-1] // self.group_size
        dynamic = self.kernel_projection(x).reshape(*x.shape[:-1], 2, self.kernel_size, groups)
        return (causal_convolve(x, dynamic[..., 0, :, :], self.base_kernel[0], self.group_size),
                dynamic[..., 1, :, :])

    def finish(self, y: mx.array, dynamic: mx.array) -> mx.array:
        return causal_convolve(y, dynamic, self.base_kernel[1], self.group_size)


class DFlash2Layer(DraftLayer):
    """A DFlash layer with its attention and its MLP each inside a `DynamicConv`."""

    def __init__(self, args: DFlash2Args, sliding: bool):
        super().__init__(args, sliding)
        self.attention_conv = DynamicConv(args.hidden_size, args.conv_kernel_size,
                                          args.conv_group_size)
        self.mlp_conv = DynamicConv(args.hidden_size, args.conv_kernel_size,
                                    args.conv_group_size)

    def __call__(self, x: mx.array, cache: KVCache, start: int | mx.array, cpu: bool = False,
                 context_mask: mx.array | None = None) -> mx.array:
        h, kernel = self.attention_conv.prepare(self.input_layernorm(x))
        h = x + self.attention_conv.finish(self.self_attn(h, cache, start, cpu, context_mask),
                                           kernel)
        y, kernel = self.mlp_conv.prepare(self.post_attention_layernorm(h))
        return h + self.mlp_conv.finish(self.mlp(y, cpu), kernel)


@dataclass
class Path:
    """A selector's proposal for a block's slots 1.. (n of them)."""

    tokens: mx.array  # [n] int32 token ids
    candidates: mx.array  # [n, k] token ids: each slot's candidates
    q: mx.array | None  # [n, k]: the draws' distributions over the candidates (sampled only)
    confidence: mx.array  # [n]: the draft's own probability of each path token (its logits)


class CandidateSelector(nn.Module):
    """Picks the block's path among each slot's `top_k` tokens (z-lab's `CandidateSelector`):
    slot p's candidate c scores logit(c) + sum(pred(previous) * proj(hidden_p) * succ(c)), the
    previous token being the staged one for the first slot, then each slot's pick."""

    def __init__(self, args: DFlash2Args):
        super().__init__()
        self.top_k = args.selector_top_k
        self.predecessor_codebook = nn.Embedding(args.vocab_size, args.selector_rank)
        self.successor_codebook = nn.Embedding(args.vocab_size, args.selector_rank)
        self.hidden_projection = nn.Linear(args.hidden_size, args.selector_rank, bias=False)

    def walk(self, hidden: mx.array, logits: mx.array, staged: int | mx.array,
             head: DraftHead, sampler: Sampler | None = None) -> Path:
        """The draft's normed hidden states at slots 1.. [n, H] and its logits there [n, K]
        over `head` -> the path: each slot's best-scoring candidate given the pick before it,
        or with a `sampler` a draw from its processed distribution of the scores (temperature
        and filters, over the candidates). All on the device, no host sync."""
        k = min(self.top_k, logits.shape[-1])
        index = mx.argpartition(logits, -k, axis=-1)[..., -k:]  # [n, k] into the head
        unary = mx.take_along_axis(logits, index, axis=-1).astype(mx.float32)
        candidates = head.token_ids(index).astype(mx.int32)
        projected = self.hidden_projection(hidden)  # [n, r]
        successors = self.successor_codebook(candidates)  # [n, k, r]
        previous = mx.array(staged).astype(mx.int32).reshape(())
        picks, tokens, rows = [], [], []
        for slot in range(hidden.shape[0]):
            edges = mx.sum(self.predecessor_codebook(previous)[None] * projected[slot, None]
                           * successors[slot], axis=-1)
            scores = unary[slot] + edges.astype(mx.float32)
            if sampler is None:
                pick = mx.argmax(scores)
            else:
                rows.append(sampler.probs(scores))
                pick = sampler.draw(rows[-1])
            previous = candidates[slot, pick]
            picks.append(pick)
            tokens.append(previous)
        chosen = mx.take_along_axis(index, mx.stack(picks)[:, None], axis=-1)[:, 0]
        probs = mx.softmax(logits.astype(mx.float32), axis=-1)
        confidence = mx.take_along_axis(probs, chosen[:, None], axis=-1)[:, 0]
        return Path(mx.stack(tokens), candidates, mx.stack(rows) if rows else None, confidence)


class DFlash2Draft(DFlashDraft):
    layer_class = DFlash2Layer

    def __init__(self, args: DFlash2Args):
        super().__init__(args)
        self.candidate_selector = CandidateSelector(args)

    @property
    def can_prefetch(self) -> bool:
        """Never: a prefetched forward proposes each slot's argmax, not the selector's path."""
        return False

    def output_logits(self, logits: mx.array) -> mx.array:
        """The head's logits as the draft's own: scaled and soft-capped where its config says."""
        args: DFlash2Args = self.args  # type: ignore[assignment]
        if args.output_multiplier != 1.0:
            logits = logits * args.output_multiplier
        if args.final_logit_softcapping:
            cap = args.final_logit_softcapping
            logits = mx.tanh(logits / cap) * cap
        return logits

    def block_outputs(self, block_embeddings: mx.array, cache: list[KVCache], head: DraftHead
                      ) -> tuple[mx.array, mx.array]:
        """The target's embeddings of a block [staged, mask x (B - 1)] [1, B, H] -> the normed
        hidden states [B - 1, H] and logits [B - 1, K] over `head` of its slots 1.. (the head
        runs on all B rows: a CPU BLAS multiplies 16 rows faster than 15)."""
        scale = self.args.input_embedding_scale  # type: ignore[attr-defined]
        hidden = self(block_embeddings * scale if scale != 1.0 else block_embeddings, cache)
        return hidden[0, 1:], self.output_logits(head(hidden))[0, 1:]


def stored_weights(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """The module's parameters -> z-lab's checkpoint names (the codebooks without `.weight`)."""
    return {k.removesuffix(".weight") if k.removesuffix(".weight") in CODEBOOKS else k: v
            for k, v in weights.items()}


def module_weights(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """z-lab's checkpoint names -> the module's (ValueError: a codebook stored both ways)."""
    out = dict(weights)
    for name in CODEBOOKS:
        if name in out:
            if f"{name}.weight" in out:
                raise ValueError(f"both {name} and {name}.weight are stored")
            out[f"{name}.weight"] = out.pop(name)
    return out
