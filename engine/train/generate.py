"""Batched greedy generation of the target's answers (training data)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..targets.base import text_model
from .dataset import Dataset


def paddable(model: nn.Module) -> bool:
    """Whether left padding can be masked out: attention layers only. A recurrent
    (GatedDeltaNet) layer's state would absorb the pad tokens."""
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    return all(type(c) is KVCache for c in make_prompt_cache(model))


def left_padded_cache(model: nn.Module, pads: list[int]) -> list[Any]:
    """Per-layer caches that mask each row's `pads` left padding tokens (paddable models)."""
    from mlx_lm.models.cache import BatchKVCache

    return [BatchKVCache(pads) for _ in text_model(model).layers]


def greedy_batch(model: nn.Module, prompts: list[list[int]], max_new: int,
                 eos: set[int]) -> list[list[int]]:
    """Greedy continuations of a batch of prompts. Prompts of one length run unpadded,
    exactly as a single prompt would; mixed lengths are left-padded with the padding masked
    (attention-only models: training data, where float noise in the last bits is harmless).
    Each response ends at its first EOS (kept)."""
    from mlx_lm.models.cache import make_prompt_cache

    from ..targets import adapter_for

    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    if any(pads) and not paddable(model):
        raise ValueError("prompts of different lengths need an attention-only model: "
                         "group them by length (generate_dataset does)")
    cache = left_padded_cache(model, pads) if any(pads) else make_prompt_cache(model)
    tokens = mx.array([[0] * k + p for k, p in zip(pads, prompts)])
    # the head on the last position only: full-prompt logits of a big batch would not fit
    target = adapter_for(model)
    hidden = target.inner(tokens, cache=cache)[:, -1]
    tok = mx.argmax(target.lm_head(hidden), axis=-1)
    steps, finished = [tok], mx.zeros(tok.shape, dtype=mx.bool_)
    eos_ids = mx.array(sorted(eos))
    for i in range(1, max_new):
        finished = finished | (tok[:, None] == eos_ids).any(axis=-1)
        tok = mx.argmax(model(tok[:, None], cache=cache)[:, -1], axis=-1)
        steps.append(tok)
        mx.async_eval(tok, finished)
        if i % 32 == 0 and finished.all().item():
            break
    out = []
    for row in mx.stack(steps, axis=1).tolist():
        end = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        out.append(row[:end])
    return out


def length_batches(lengths: list[int], batch: int, max_new: int, token_budget: int,
                   paddable: bool) -> list[list[int]]:
    """Prompt indices in batches of up to `batch` (fewer for long prompts: at most
    `token_budget` prompt + response tokens, which bounds the KV cache). Paddable models
    batch neighbours in length order, so every prompt is answered at full batch width;
    others batch equal lengths only (small groups run narrow and slow)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    runs: list[list[int]] = []
    for i in order:
        fits = bool(runs) and len(runs[-1]) < batch and (
            (len(runs[-1]) + 1) * (lengths[i] + max_new) <= token_budget)
        if fits and (paddable or lengths[runs[-1][0]] == lengths[i]):
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def generate_dataset(model: nn.Module, tokenizer: Any, prompts: list[list[int]], max_new: int,
                     batch: int, seconds: float | None = None,
                     on_done: Callable[[int], None] | None = None,
                     token_budget: int = 1 << 18) -> Dataset:
    """Greedy responses of the target for prompts in batches of similar length (see
    `length_batches`), in a seeded shuffle so every category and length comes early. The
    EOS stays in the response: the draft must learn to predict it too. With `seconds`,
    generation stops after the batch that crosses it."""
    chunks = length_batches([len(p) for p in prompts], batch, max_new, token_budget,
                            paddable(model))
    random.Random(0).shuffle(chunks)
    # full batches first: narrow ones waste the GPU
    chunks.sort(key=lambda c: len(c) < min(batch, 64))
    eos = set(tokenizer.eos_token_ids)
    seqs, plens, done = [], [], 0
    start = time.perf_counter()
    for chunk in chunks:
        responses = greedy_batch(model, [prompts[i] for i in chunk], max_new, eos)
        for i, r in zip(chunk, responses):
            if len(r) >= 2:  # an anchor needs a label after it
                seqs.append(prompts[i] + r)
                plens.append(len(prompts[i]))
        done += len(chunk)
        if on_done:
            on_done(len(chunk))
        if seconds is not None and time.perf_counter() - start > seconds:
            break
    return Dataset(seqs, plens, {"generated": done, "seconds": time.perf_counter() - start,
                                 "max_new": max_new, "batches": chunks.index(chunk) + 1})
