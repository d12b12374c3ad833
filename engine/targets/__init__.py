"""Target adapters, one small module per family, looked up by mlx-lm model_type."""

from __future__ import annotations

import mlx.nn as nn

from ..errors import UnsupportedModel
from .attention import AttentionAdapter
from .base import TargetAdapter, text_args
from .gated_delta import GatedDeltaAdapter

FAMILIES: tuple[type[TargetAdapter], ...] = (AttentionAdapter, GatedDeltaAdapter)
ADAPTERS: dict[str, type[TargetAdapter]] = {t: cls for cls in FAMILIES for t in cls.model_types}


def adapter_for(model: nn.Module, enable_tape_replay: bool = True,
                kernels: str | None = None) -> TargetAdapter:
    """The adapter for this model's family. `enable_tape_replay` and `kernels` (a mode for
    engine.kernels.select) concern GatedDeltaNet rollback; other families ignore them."""
    model_type = getattr(getattr(model, "args", None), "model_type", None) or text_args(
        model
    ).model_type
    cls = ADAPTERS.get(model_type)
    if cls is None:
        raise UnsupportedModel(
            f"model_type {model_type!r} has no DFlash target adapter yet. Supported: "
            f"{', '.join(ADAPTERS)}."
        )
    return cls.build(model, enable_tape_replay=enable_tape_replay, kernels=kernels)


__all__ = ["ADAPTERS", "AttentionAdapter", "GatedDeltaAdapter", "TargetAdapter", "adapter_for"]
