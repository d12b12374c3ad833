"""Projections that read the same input, computed as one matmul.

A GatedDeltaNet layer projects its input four times (qkv, z, b, a) and two of those outputs
are a head count wide. In a 16-token verify on a GPU each is its own GEMM launch, and the
narrow ones cost about as much as the wide ones (benchmarks/stage25/verify-pieces-*.json,
`gdn_in_proj_ba`). `MergedProjection` stacks the weights' rows once and splits the one
product. The modules keep working: their weights become views into the stacked buffer, so
the model's own code (plain decoding, the baseline) reads the same numbers and no memory is
added.

A bigger GEMM may sum in another order, so the merged product is not bit-identical to the
separate ones. So only half-precision and quantized weights merge, and adapters merge only
off the CPU: where a verify is already held to the near-tie rule. float32 targets, and every
CPU, keep the model's own projections and plain decoding's bits. $DFLASH_MERGE_PROJECTIONS=0
keeps them separate everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

MERGE_ENV = "DFLASH_MERGE_PROJECTIONS"


def merging_enabled() -> bool:
    """Off with $DFLASH_MERGE_PROJECTIONS=0 (an A/B against the separate projections)."""
    return os.environ.get(MERGE_ENV) != "0"


class MergedProjection:
    """`modules`' outputs on one input, from one matmul: `merged(x)` -> [m(x) for m in
    modules]. Build with `MergedProjection.of(modules)`, which returns None unless every
    module is a bias-free `nn.Linear`, or every one an `nn.QuantizedLinear` of one format,
    all with the same input width and weight dtype, computing in half precision (float32
    weights or scales keep their bits: the module docstring)."""

    def __init__(self, weights: dict[str, mx.array], splits: list[int],
                 quantized: nn.QuantizedLinear | None) -> None:
        self.weights = weights
        self.splits = splits
        self._format = quantized

    @classmethod
    def of(cls, modules: Sequence[nn.Module]) -> MergedProjection | None:
        kind = type(modules[0])
        if kind not in (nn.Linear, nn.QuantizedLinear) or len(modules) < 2:
            return None
        if any(type(m) is not kind or "bias" in m for m in modules):
            return None
        first = modules[0]
        keys = ["weight"] if kind is nn.Linear else ["weight", "scales", "biases"]
        if kind is nn.QuantizedLinear:
            fmt = (first.group_size, first.bits, first.mode)
            if any((m.group_size, m.bits, m.mode) != fmt for m in modules):
                return None
            if any(m.get("biases") is None for m in modules):
                keys = ["weight", "scales"]
        for key in keys:
            if any(m[key].dtype != first[key].dtype or m[key].shape[1:] != first[key].shape[1:]
                   for m in modules):
                return None
        if first["scales" if kind is nn.QuantizedLinear else "weight"].dtype == mx.float32:
            return None
        rows = [m.weight.shape[0] for m in modules]
        weights = {key: mx.concatenate([m[key] for m in modules], axis=0) for key in keys}
        mx.eval(weights)
        # the modules read views into the stacked rows from now on: no second copy
        start = 0
        for m, n in zip(modules, rows, strict=True):
            views = {key: value[start:start + n] for key, value in weights.items()}
            mx.eval(views)
            m.update(views)
            start += n
        splits = [sum(rows[:i]) for i in range(1, len(rows))]
        return cls(weights, splits, first if kind is nn.QuantizedLinear else None)

    def __call__(self, x: mx.array) -> list[mx.array]:
        w = self.weights
        if self._format is None:
            y = x @ w["weight"].T
        else:
            y = mx.quantized_matmul(x, w["weight"], w["scales"], w.get("biases"),
                                    transpose=True, group_size=self._format.group_size,
                                    bits=self._format.bits, mode=self._format.mode)
        return mx.split(y, self.splits, axis=-1)
