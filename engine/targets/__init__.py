"""Target adapters, one small module per family, picked by mlx-lm model_type."""

from __future__ import annotations

import mlx.nn as nn

from ..errors import UnsupportedModel
from .attention import AttentionAdapter
from .base import TargetAdapter, text_args


def adapter_for(model: nn.Module, enable_tape_replay: bool = True,
                kernels: str = "auto") -> TargetAdapter:
    """The adapter for this model's family; `kernels` is DFlashConfig.kernels."""
    model_type = getattr(getattr(model, "args", None), "model_type", None) or text_args(
        model
    ).model_type
    if model_type in AttentionAdapter.model_types:
        return AttentionAdapter(model)
    from .gated_delta import GatedDeltaAdapter

    if model_type in GatedDeltaAdapter.model_types:
        from ..kernels import select

        return GatedDeltaAdapter(model, enable_tape_replay=enable_tape_replay,
                                 kernels=select(mode=kernels))
    supported = AttentionAdapter.model_types + GatedDeltaAdapter.model_types
    raise UnsupportedModel(
        f"model_type {model_type!r} has no DFlash target adapter yet. Supported: "
        f"{', '.join(supported)}."
    )


__all__ = ["AttentionAdapter", "TargetAdapter", "adapter_for"]
