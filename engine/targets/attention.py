"""Pure-attention targets (llama, qwen2, qwen3, mistral): KV caches roll back by trimming."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

from .base import TargetAdapter


class AttentionAdapter(TargetAdapter):
    family = "attention"
    model_types = ("llama", "qwen2", "qwen3", "mistral")

    def _first_kv_index(self) -> int:
        return 0

    def _masks(self, h: mx.array, cache: list[Any]) -> dict[str, Any]:
        return {"attention": create_attention_mask(h, cache[0])}

    def _layer_forward(self, index: int, layer: nn.Module, h: mx.array, masks, cache) -> mx.array:
        return layer(h, masks["attention"], cache=cache)

    def begin_verify(self, cache: list[Any]) -> None:
        """Nothing to record: a KV cache rolls back by trimming."""

    def rollback(self, cache: list[Any], keep: int, verified: int) -> None:
        drop = verified - keep
        if drop > 0:
            for c in cache:
                c.trim(drop)
