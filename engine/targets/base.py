"""The target-adapter interface and what every family shares: run an mlx-lm model layer by
layer, tapping hidden states, and roll its caches back after a partly rejected verify.

An adapter never changes mlx-lm's classes: it walks `model.layers` itself with the
model's own modules and caches, so the output is exactly the model's own; on an x86-64 CPU
its Linear products for a few rows go through kernels/cpu_linear.py instead of the BLAS,
equal up to float32 rounding. A family says how
its layers are called (`_masks`, `_layer_forward`) and how its caches roll back
(`begin_verify`, `rollback`); see attention.py and gated_delta.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama, qwen2, qwen3, qwen3_next
from mlx_lm.models.base import gather_last_axis
from mlx_lm.models.cache import make_prompt_cache

from ..device import current
from ..kernels import cpu_linear, cpu_swiglu

# mlx-lm model args that make the logits more than `hidden @ W.T` (Granite, Cohere, Gemma):
# their head rows alone would not reproduce the target's logits.
SCALED_LOGITS_ARGS = ("logits_scaling", "logit_scale", "final_logit_softcapping",
                      "output_multiplier", "lm_head_multiplier")
# mlx-lm MLPs whose __call__ is down_proj(swiglu(gate_proj(x), up_proj(x))).
SWIGLU_MLPS = (llama.MLP, qwen2.MLP, qwen3.MLP, qwen3_next.Qwen3NextMLP)


def text_model(model: nn.Module) -> nn.Module:
    """The decoder stack (embed_tokens, layers, norm) inside an mlx-lm model."""
    inner = getattr(model, "language_model", model)
    return inner.model


def text_args(model: nn.Module) -> Any:
    return getattr(model, "language_model", model).args


def cache_arrays(*caches: list[Any]) -> list[mx.array]:
    """Every array held by the given caches (target and draft): what to evaluate so that a
    cycle's cache updates are done. Called every cycle: flat states (KV caches, GatedDeltaNet
    arrays) are read directly, a sixth of tree_flatten's host time (benchmarks/
    host-cost-cpu.json); nested ones still go through it, in the same order."""
    out: list[mx.array] = []
    for c in caches:
        for x in c:
            state = x.state
            if not isinstance(state, (list, tuple)):
                state = [state]
            for a in state:
                if isinstance(a, mx.array):
                    out.append(a)
                elif isinstance(a, (list, tuple, dict)):
                    out += [b for _, b in tree_flatten(a) if isinstance(b, mx.array)]
    return out


def first_linear_weight(module: nn.Module) -> mx.array | None:
    """The weight of the first plain nn.Linear inside `module` (None if it has none)."""
    return next((m.weight for _, m in module.named_modules() if type(m) is nn.Linear), None)


class TargetAdapter:
    """Runs a target with tapped features; knows how to roll its caches back.

    The interface the speculative cycle uses: `forward`, `begin_verify`, `rollback`,
    `embed`, `lm_head`/`head_rows`, `make_cache`, `warm_up`. Subclasses implement the
    family-specific parts marked below.
    """

    family: str = ""
    model_types: tuple[str, ...] = ()
    lockstep: Any = None  # a distributed.Lockstep when the target is sharded over ranks
    # Queue a forward's work every this many layers (0: only when the caller evaluates it),
    # so that the device runs the first layers while the host builds the rest: a GPU
    # otherwise idles for the whole graph build (DFlashConfig.stream_verify).
    launch_every: int = 0

    def __init__(self, model: nn.Module):
        self.model = model
        self.inner = text_model(model)
        self.args = text_args(model)
        self.layers = list(self.inner.layers)
        self.on_cpu = current() == "cpu"
        # Forwards of a few rows whose products go through cpu_linear.c run OpenBLAS on one
        # thread (cpu_linear.blas_aside); None: they leave it as it is
        self.blas_aside = cpu_linear.blas_aside(first_linear_weight(self.layers[0])
                                                if self.on_cpu and self.layers else None)

    @classmethod
    def build(cls, model: nn.Module, **options: Any) -> TargetAdapter:
        """The adapter from adapter_for's options; families without options ignore them."""
        return cls(model)

    # -- facts the draft needs ---------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return int(self.args.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.args.vocab_size)

    def embed(self, tokens: mx.array) -> mx.array:
        """The target's input embedding (times its embedding scale, if the family has one)."""
        h = self.inner.embed_tokens(tokens)
        scale = getattr(self.args, "embedding_multiplier", None)
        return h * scale if scale else h

    def _head(self) -> tuple[nn.Module, bool]:
        """-> (the output head's module, whether it is the tied input embedding)."""
        outer = getattr(self.model, "language_model", self.model)
        if getattr(self.args, "tie_word_embeddings", False) or not hasattr(outer, "lm_head"):
            return self.inner.embed_tokens, True
        return outer.lm_head, False

    def lm_head(self, hidden: mx.array) -> mx.array:
        """The target's output head on already-normed hidden states."""
        head, tied = self._head()
        if tied:
            if self.on_cpu and type(head) is nn.Embedding:  # a verify's rows: cpu_linear.c
                return cpu_linear.project(hidden, head.weight)
            return head.as_linear(hidden)
        if self.on_cpu and type(head) is nn.Linear:
            return cpu_linear.linear(hidden, head)
        group = getattr(getattr(self.model, "language_model", self.model), "sharding_group",
                        None)  # a head sharded by vocabulary rows (mlx-lm's qwen3_5 shard())
        return head(hidden) if group is None else gather_last_axis(head(hidden), group)

    def agree(self, *values: mx.array) -> tuple[mx.array, ...]:
        """The cycle's data-dependent integer arrays (drafts, accepted count, next token) as
        rank 0 has them when sharded (one collective); as they are otherwise."""
        return values if self.lockstep is None else self.lockstep.agree(*values)

    def head_rows(self, ids: mx.array) -> mx.array | None:
        """The output head's rows for token `ids` [K] -> [K, H], such that
        `hidden @ rows.T == lm_head(hidden)[..., ids]` (dequantized if the head is
        quantized). None when the head is more than a bias-free projection (a bias, scaled or
        soft-capped logits, an unknown module): callers then use the full head."""
        if any(getattr(self.args, k, None) for k in SCALED_LOGITS_ARGS):
            return None
        head, tied = self._head()
        if tied:
            # the embedding itself, not embed(): a family's embedding multiplier scales the
            # input embeddings only, never the head
            if isinstance(head, (nn.Embedding, nn.QuantizedEmbedding)):
                return head(ids)
            return None
        if "bias" in head:
            return None
        if isinstance(head, nn.QuantizedLinear):
            biases = head.get("biases")
            return mx.dequantize(head["weight"][ids], head["scales"][ids],
                                 biases[ids] if biases is not None else None,
                                 group_size=head.group_size, bits=head.bits, mode=head.mode)
        if isinstance(head, nn.Linear):
            return head.weight[ids]
        return None

    # -- caches ------------------------------------------------------------------------
    def make_cache(self) -> list[Any]:
        return make_prompt_cache(self.model)

    def cache_length(self, cache: list[Any]) -> int:
        """Tokens held by the cache (read from its first KV cache)."""
        return int(cache[self._first_kv_index()].offset)

    def warm_up(self, verify_tokens: int = 16, tap_ids: Sequence[int] = ()) -> None:
        """Compile whatever the target's verify (of up to `verify_tokens`, tapping `tap_ids`)
        and rollback will need, before the first reply (default: nothing to compile)."""

    @property
    def cpu_mlp(self) -> bool:
        """Whether SwiGLU MLPs run their swiglu through kernels/cpu_swiglu.py (same bits): on a
        CPU, unless sharded (sharded targets run the model's own layers)."""
        return self.on_cpu and self.lockstep is None

    def _mlp(self, mlp: nn.Module, x: mx.array) -> mx.array:
        """`mlp(x)`; a SwiGLU MLP on CPU computes its swiglu in C (same bits) and, for a
        verify's few rows, its products through kernels/cpu_linear.py."""
        if self.cpu_mlp and type(mlp) in SWIGLU_MLPS:
            gate, up = cpu_linear.linears(x, [mlp.gate_proj, mlp.up_proj])
            return cpu_linear.linear(cpu_swiglu.swiglu(gate, up), mlp.down_proj)
        return mlp(x)

    # -- family-specific ---------------------------------------------------------------
    def _first_kv_index(self) -> int:
        """Index of the first layer whose cache is a KV cache."""
        raise NotImplementedError

    def _masks(self, h: mx.array, cache: list[Any]) -> dict[str, Any]:
        """The masks this family's layers take, built once per forward."""
        raise NotImplementedError

    def _layer_forward(self, index: int, layer: nn.Module, h: mx.array, masks, cache) -> mx.array:
        """One decoder layer, as the model's own forward would call it."""
        raise NotImplementedError

    def begin_verify(self, cache: list[Any]) -> None:
        """Called before a forward whose tokens may be partly rolled back."""
        raise NotImplementedError

    def rollback(self, cache: list[Any], keep: int, verified: int) -> None:
        """After a forward of `verified` tokens, keep only the first `keep` of them."""
        raise NotImplementedError

    # -- forward -----------------------------------------------------------------------
    def forward(
        self, tokens: mx.array, cache: list[Any], tap_ids: Sequence[int], last_only: bool = False
    ) -> tuple[mx.array, mx.array]:
        """tokens [1, T] -> (logits [1, T, V], taps [1, T, len(tap_ids) * H]).

        A tap of layer l is the output of decoder layer l (before the final norm).
        `last_only` computes logits for the last position only (prefill chunks).
        """
        aside = self.blas_aside if tokens.size <= cpu_linear.MAX_ROWS else None
        restore = aside.single_thread() if aside is not None else 0
        try:
            h = self.inner.embed_tokens(tokens)
            masks = self._masks(h, cache)
            wanted = set(tap_ids)
            outputs: dict[int, mx.array] = {}
            for i, (layer, c) in enumerate(zip(self.layers, cache)):
                h = self._layer_forward(i, layer, h, masks, c)
                if i in wanted:
                    outputs[i] = h
                if (self.launch_every and (i + 1) % self.launch_every == 0
                        and i + 1 < len(self.layers)):
                    mx.async_eval(h)
            if last_only:
                h = h[:, -1:]
            logits = self.lm_head(self.inner.norm(h))
        finally:
            if restore:
                aside.set(restore)  # type: ignore[union-attr]
        taps = [outputs[i] for i in tap_ids]
        feats = mx.concatenate(taps, axis=-1) if taps else h[..., :0]
        return logits, feats
