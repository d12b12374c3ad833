"""Pure-attention targets (llama, qwen2, qwen3): KV caches roll back by trimming."""

from __future__ import annotations

from .base import TargetAdapter


class AttentionAdapter(TargetAdapter):
    family = "attention"
    model_types = ("llama", "qwen2", "qwen3", "mistral")
