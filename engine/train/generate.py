"""Batched greedy generation of the target's answers (training data)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

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


def loop_starts(rows: np.ndarray, lengths: np.ndarray, window: int = 64,
                threshold: float = 0.5, n: int = 4) -> np.ndarray:
    """engine.bench.metrics.loop_start for a batch at once: rows [B, T] (padded), lengths [B] ->
    [B] first position whose trailing `window` tokens repeat more than `threshold` of their
    n-grams, -1 where a row never loops. Vectorised: answers run to a thousand tokens."""
    B, width = rows.shape
    out = np.full(B, -1, dtype=np.int64)
    if width <= n:
        return out
    G = width - n + 1
    grams = np.stack([rows[:, k:k + G] for k in range(n)], axis=-1)  # [B, G, n]
    # prev[b, i]: the nearest earlier start j >= i - (window - n) of the same n-gram, else -1
    reach = window - n + 1
    prev = np.full((B, G), -1, dtype=np.int64)
    for d in range(reach, 0, -1):  # nearest last, so it wins
        same = (grams[:, d:] == grams[:, :-d]).all(axis=-1)
        idx = np.arange(d, G)
        prev[:, d:] = np.where(same, idx - d, prev[:, d:])
    p = np.arange(n, width)  # window [s, p]; its grams start at s .. p - n + 1
    s = np.maximum(0, p - window + 1)
    offs = np.arange(reach)
    i = s[:, None] + offs[None, :]  # [P, reach]
    inside = i <= (p - n + 1)[:, None]
    rep = (prev[:, np.minimum(i, G - 1)] >= s[None, :, None]) & inside[None]
    share = rep.sum(-1) / inside.sum(-1)[None]  # [B, P]
    looping = (share > threshold) & (p[None, :] < lengths[:, None])
    first = looping.argmax(axis=1)
    hit = looping[np.arange(B), first]
    out[hit] = p[first[hit]]
    return out


def continue_batch(model: nn.Module, prompts: list[list[int]], max_new: int, eos: set[int],
                   temperature: float = 0.0, stop_loops: bool = False) -> list[list[int]]:
    """Continuations of a batch of prompts: greedy, or sampled at `temperature` (seed with
    mx.random.seed). Prompts of one length run unpadded, exactly as a single prompt would;
    mixed lengths are left-padded with the padding masked (attention-only models: training
    data, where float noise in the last bits is harmless). Each response ends at its first
    EOS (kept). With `stop_loops`, a row that has fallen into a loop stops counting towards
    the batch's end (cut it afterwards with `loop_starts`)."""
    from mlx_lm.models.cache import make_prompt_cache

    from ..targets import adapter_for

    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    if any(pads) and not paddable(model):
        raise ValueError("prompts of different lengths need an attention-only model: "
                         "group them by length (generate_dataset does)")
    cache = left_padded_cache(model, pads) if any(pads) else make_prompt_cache(model)
    tokens = mx.array([[0] * k + p for k, p in zip(pads, prompts)])

    def pick(logits: mx.array) -> mx.array:
        if temperature <= 0:
            return mx.argmax(logits, axis=-1)
        return mx.random.categorical(logits.astype(mx.float32) / temperature)

    # the head on the last position only: full-prompt logits of a big batch would not fit
    target = adapter_for(model)
    tok = pick(target.lm_head(target.inner(tokens, cache=cache)[:, -1]))
    steps, finished = [tok], mx.zeros(tok.shape, dtype=mx.bool_)
    eos_ids = mx.array(sorted(eos))
    looped = np.zeros(len(prompts), dtype=bool)
    for i in range(1, max_new):
        finished = finished | (tok[:, None] == eos_ids).any(axis=-1)
        tok = pick(model(tok[:, None], cache=cache)[:, -1])
        steps.append(tok)
        mx.async_eval(tok, finished)
        if i % 64 == 0:
            done = np.array(finished)
            if stop_loops:
                recent = np.array(mx.stack(steps[-128:], axis=1))
                looped |= loop_starts(recent, np.full(len(prompts), recent.shape[1])) >= 0
            if (done | looped).all():
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


def answer_prompts(model: nn.Module, tokenizer: Any, prompts: list[list[int]], max_new: int,
                   batch: int, seconds: float | None = None,
                   on_done: Callable[[int], None] | None = None, token_budget: int = 1 << 18,
                   temperature: float = 0.0, loop_keep: int | None = None
                   ) -> dict[int, list[int]]:
    """The target's responses to `prompts` in batches of similar length (see
    `length_batches`), in a seeded shuffle so every category and length comes early; ->
    {prompt index: response}. With `seconds`, stops after the batch that crosses it. With
    `loop_keep`, looping rows stop early and are cut `loop_keep` tokens into their loop."""
    chunks = length_batches([len(p) for p in prompts], batch, max_new, token_budget,
                            paddable(model))
    random.Random(0).shuffle(chunks)
    # full batches first: narrow ones waste the GPU
    chunks.sort(key=lambda c: len(c) < min(batch, 64))
    eos = set(tokenizer.eos_token_ids)
    answers: dict[int, list[int]] = {}
    start = time.perf_counter()
    for chunk in chunks:
        if seconds is not None and time.perf_counter() - start > seconds:
            break
        responses = continue_batch(model, [prompts[i] for i in chunk], max_new, eos,
                                   temperature, stop_loops=loop_keep is not None)
        if loop_keep is not None:
            responses = cut_loops(responses, loop_keep)
        answers.update(zip(chunk, responses))
        if on_done:
            on_done(len(chunk))
    return answers


def cut_loops(responses: list[list[int]], keep: int = 16, group: int = 256) -> list[list[int]]:
    """Each response truncated `keep` tokens after its loop starts (a loop is trivial to
    draft; a few of its tokens are enough to learn it); responses without a loop as they
    are."""
    out = []
    for g in range(0, len(responses), group):
        part = responses[g:g + group]
        width = max(len(r) for r in part)
        rows = np.full((len(part), width), -1, dtype=np.int64)
        for i, r in enumerate(part):
            rows[i, :len(r)] = r
        starts = loop_starts(rows, np.array([len(r) for r in part]))
        out += [r if s < 0 else r[:s + keep] for r, s in zip(part, starts.tolist())]
    return out


def generate_dataset(model: nn.Module, tokenizer: Any, prompts: list[list[int]], max_new: int,
                     batch: int, seconds: float | None = None,
                     on_done: Callable[[int], None] | None = None,
                     token_budget: int = 1 << 18, loop_keep: int | None = None) -> Dataset:
    """Greedy responses of the target for prompts (see `answer_prompts`) as a Dataset. The
    EOS stays in the response: the draft must learn to predict it too. With `loop_keep`,
    looping rows stop early and are cut `loop_keep` tokens into their loop."""
    start = time.perf_counter()
    answers = answer_prompts(model, tokenizer, prompts, max_new, batch, seconds, on_done,
                             token_budget, loop_keep=loop_keep)
    return as_dataset(prompts, answers, {"generated": len(answers), "max_new": max_new,
                                         "seconds": time.perf_counter() - start})


def as_dataset(prompts: list[list[int]], answers: dict[int, list[int]], meta: dict) -> Dataset:
    """Prompt + answer sequences, in prompt order; answers under two tokens are dropped (an
    anchor needs a label after it)."""
    keep = [i for i in sorted(answers) if len(answers[i]) >= 2]
    return Dataset([prompts[i] + answers[i] for i in keep], [len(prompts[i]) for i in keep],
                   meta)
