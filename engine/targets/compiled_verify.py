"""A pure-attention target's whole verify forward as one compiled function (issue 13).

Built layer by layer in Python, a verify costs the host about one plain step's graph
building, and a GPU idles until it is done. Here the forward is traced once with mx.compile
and replayed in C++: no Python runs per layer (the host probe's `verify_compiled` phase,
scripts/gpu_cycle_probe.py), and MLX fuses the elementwise chains, so there are fewer
kernels to launch. Attention reads the whole buffer (masked): up to twice the context, a
cost a GPU barely sees and a CPU does.

A trace is specialised to its input shapes, and a KV cache's length changes with every
cycle. So the compiled forward attends over the cache's whole buffer at a fixed capacity,
with the write position and the causal mask computed on the device from the cache's offset
(an input array): a new trace is needed only when the buffer grows past a power of two.
The model's own layer modules run inside, on a cache view that writes at that position.

Lossless as the verify is defined: each token is the argmax of the verify's own logits. The
fused ops and the longer (masked) attention round differently from the layer-by-layer
forward, so it is meant for GPU targets at checkpoint precision (bf16, fp16 activations),
whose verify is held to the near-tie rule; float32 keeps the layer-by-layer forward, bit for
bit plain decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

# The smallest buffer a compiled verify runs at: short chats never retrace.
MIN_CAPACITY = 1024


def capacity_for(positions: int) -> int:
    """The buffer length for a cache that must hold `positions`: a power of two, at least
    MIN_CAPACITY (each length is one trace)."""
    return max(MIN_CAPACITY, 1 << (positions - 1).bit_length())


def fit(cache: Any, capacity: int) -> None:
    """Grow a KV cache's buffers to `capacity` positions (zeros after the old ones); mlx-lm's
    KVCache keeps working on them as on its own."""
    grow = capacity - cache.keys.shape[2]
    if grow > 0:
        def grown(a: mx.array) -> mx.array:
            pad = mx.zeros((*a.shape[:2], grow, a.shape[3]), a.dtype)
            return mx.concatenate([a, pad], axis=2)

        cache.keys, cache.values = grown(cache.keys), grown(cache.values)


class BufferView:
    """A KV cache as the compiled forward sees it: whole buffers, written at `offset` (a
    device scalar), read whole (the mask hides what lies past the verified tokens)."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array) -> None:
        self.keys, self.values, self.offset = keys, values, offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        self.keys = mx.slice_update(self.keys, keys, self.offset, axes=(2,))
        self.values = mx.slice_update(self.values, values, self.offset, axes=(2,))
        return self.keys, self.values


class CompiledVerify:
    """`(tokens [1, T], caches) -> (logits [1, T, V], taps [1, T, len(tap_ids) * H])` for
    the adapter's target, as its layer-by-layer `forward` would return them; the caches'
    buffers and offsets advance as mlx-lm's update_and_fetch would advance them."""

    def __init__(self, adapter: Any, tap_ids: Sequence[int]) -> None:
        self.adapter = adapter
        self.tap_ids = list(tap_ids)
        self.traces = 0  # how many times the forward was traced (one per shape)
        self._step = mx.compile(self._forward)

    def _forward(self, tokens: mx.array, offset: mx.array, *buffers: mx.array
                 ) -> tuple[mx.array, ...]:
        self.traces += 1  # Python runs this body only while tracing
        a = self.adapter
        views = [BufferView(buffers[2 * i], buffers[2 * i + 1], offset)
                 for i in range(len(a.layers))]
        h = a.inner.embed_tokens(tokens)
        rows = offset + mx.arange(tokens.shape[1])
        mask = mx.arange(buffers[0].shape[2])[None] <= rows[:, None]  # causal, from offset
        outputs = {}
        wanted = set(self.tap_ids)
        for i, (layer, view) in enumerate(zip(a.layers, views)):
            h = layer(h, mask, view)
            if i in wanted:
                outputs[i] = h
        logits = a.lm_head(a.inner.norm(h))
        taps = [outputs[i] for i in self.tap_ids]
        feats = mx.concatenate(taps, axis=-1) if taps else h[..., :0]
        return (logits, feats, *[x for v in views for x in (v.keys, v.values)])

    def __call__(self, tokens: mx.array, cache: list[Any]) -> tuple[mx.array, mx.array]:
        offset = cache[0].offset
        capacity = capacity_for(max(offset + tokens.shape[1], cache[0].keys.shape[2]))
        for c in cache:
            fit(c, capacity)
        buffers = [x for c in cache for x in (c.keys, c.values)]
        logits, feats, *written = self._step(tokens, mx.array(offset, mx.int32), *buffers)
        for i, c in enumerate(cache):
            c.keys, c.values = written[2 * i], written[2 * i + 1]
            c.offset += tokens.shape[1]
        return logits, feats
