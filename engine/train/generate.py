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


def _gram_ids(rows: np.ndarray, n: int) -> np.ndarray:
    """rows [B, T] -> [B, T - n + 1] ids, equal exactly where the n-grams starting there are:
    the n tokens packed into one integer when they fit, else ranks of the distinct n-grams."""
    B, width = rows.shape
    G = width - n + 1
    bits = 64 // n
    low, high = int(rows.min()), int(rows.max())
    if high - low < 1 << bits:
        ids = np.zeros((B, G), dtype=np.uint64)
        for k in range(n):
            ids = (ids << np.uint64(bits)) | (rows[:, k:k + G] - low).astype(np.uint64)
        return ids
    grams = np.stack([rows[:, k:k + G] for k in range(n)], axis=-1).reshape(B * G, n)
    return np.unique(grams, axis=0, return_inverse=True)[1].reshape(B, G)


def loop_starts(rows: np.ndarray, lengths: np.ndarray, window: int = 64,
                threshold: float = 0.5, n: int = 4) -> np.ndarray:
    """engine.bench.metrics.loop_start for a batch at once: rows [B, T] (padded), lengths [B] ->
    [B] first position whose trailing `window` tokens repeat more than `threshold` of their
    n-grams, -1 where a row never loops. Vectorised, and linear in T: a running batch checks
    hundreds of rows every few dozen steps."""
    B, width = rows.shape
    out = np.full(B, -1, dtype=np.int64)
    if width <= n:
        return out
    G = width - n + 1
    ids = _gram_ids(rows, n)
    # prev[b, i]: the nearest earlier start j >= i - (window - n) of the same n-gram, else -1
    reach = window - n + 1
    prev = np.full((B, G), -1, dtype=np.int64)
    for d in range(reach, 0, -1):  # nearest last, so it wins
        same = ids[:, d:] == ids[:, :-d]
        prev[:, d:] = np.where(same, np.arange(d, G) - d, prev[:, d:])
    # nxt[b, j]: the start i whose prev is j (the next occurrence, if within reach), else G
    nxt = np.full((B, G + 1), G, dtype=np.int64)
    b_idx, i_idx = np.nonzero(prev >= 0)
    nxt[b_idx, prev[b_idx, i_idx]] = i_idx
    # window of position p: n-gram starts s..e, s = max(0, p - window + 1), e = p - n + 1;
    # repeated = starts whose gram occurred earlier inside the window (prev >= s). Sliding
    # from p - 1 to p, start e joins (repeated if prev[e] >= s) and when s moves on, the
    # next occurrence of the gram at the old s (if already inside) stops being repeated.
    p = np.arange(n, width)
    s, e = np.maximum(0, p - window + 1), p - n + 1
    s_before = np.maximum(0, p - window)
    joins = prev[:, e] >= s[None]
    leaves = (s > s_before)[None] & (nxt[:, s_before] <= (e - 1)[None])
    repeated = np.cumsum(joins.astype(np.int64) - leaves, axis=1)
    share = repeated / (e - s + 1)[None]  # [B, P]
    looping = (share > threshold) & (p[None, :] < lengths[:, None])
    first = looping.argmax(axis=1)
    hit = looping[np.arange(B), first]
    out[hit] = p[first[hit]]
    return out


def pick(logits: mx.array, temperature: float) -> mx.array:
    """Each row's next token: greedy, or drawn at `temperature` (seed with mx.random.seed)."""
    if temperature <= 0:
        return mx.argmax(logits, axis=-1)
    return mx.random.categorical(logits.astype(mx.float32) / temperature)


ATTENTION = ("mlx", "grouped", "auto")  # how a decode step attends: see decode_logits
# "auto": a running batch's first step runs alternate the two ways, this many each, timed
# per row-step; the faster one runs from then on (the first run of each pays its compiles)
AUTO_TRIALS = 2


def grouped_sdpa(q: mx.array, k: mx.array, v: mx.array, scale: float,
                 mask: mx.array | None) -> mx.array:
    """Attention of one query position [B, H, 1, D] over k, v [B, Hkv, L, D] with a boolean
    mask [B, 1, 1, L] (or None): the ops of MLX's own unfused attention (scale, scores,
    where, precise softmax, weighted values), with the H / Hkv queries that share a KV head
    as the rows of one [R, D] x [D, L] product. MLX's fused kernels take no array mask
    (left padding needs one), and its unfused path broadcasts each KV head to R query heads
    with a length-1 query: B * H one-row products instead of B * Hkv products of R rows."""
    B, H, _, D = q.shape
    Hkv = k.shape[1]
    q = (mx.array(scale, q.dtype) * q).reshape(B, Hkv, H // Hkv, D)
    scores = q @ k.swapaxes(-1, -2)  # [B, Hkv, R, L]
    if mask is not None:
        scores = mx.where(mask, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
    probs = mx.softmax(scores, axis=-1, precise=True)
    return (probs @ v).reshape(B, H, 1, D)


def _grouped_attention(attn: nn.Module, x: mx.array, mask: mx.array | None,
                       cache: Any) -> mx.array:
    """mlx-lm's llama / qwen2 / qwen3 Attention.__call__ for one new position per row, with
    `grouped_sdpa` in place of mx.fast.scaled_dot_product_attention."""
    B, L, _ = x.shape
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    q, k = q.reshape(B, L, attn.n_heads, -1), k.reshape(B, L, attn.n_kv_heads, -1)
    if hasattr(attn, "q_norm"):  # qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
    v = v.reshape(B, L, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    q, k = attn.rope(q, offset=cache.offset), attn.rope(k, offset=cache.offset)
    k, v = cache.update_and_fetch(k, v)
    out = grouped_sdpa(q, k, v, attn.scale, None if isinstance(mask, str) else mask)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def groupable(target: Any) -> bool:
    """Whether `decode_logits` can run the target's blocks with grouped attention."""
    return not any(getattr(layer, "use_sliding", False) for layer in target.layers)


def decode_logits(model: nn.Module, tok: mx.array, cache: list[Any], attention: str = "mlx",
                  target: Any = None) -> mx.array:
    """One decode step: each row's last token [B] -> next-token logits [B, V]. "mlx" runs
    the model as it is; "grouped" runs its blocks with `grouped_sdpa` (attention-only
    llama-style blocks: pre-norm attention, then pre-norm MLP, both residual)."""
    if attention == "mlx":
        return model(tok[:, None], cache=cache)[:, -1]
    if attention != "grouped":  # "auto" is a RunningBatch's choice between these two
        raise ValueError(f"attention {attention!r}: expected 'mlx' or 'grouped'")
    from mlx_lm.models.base import create_attention_mask

    from ..targets import adapter_for

    target = target or adapter_for(model)
    if not groupable(target):
        raise ValueError("grouped attention: sliding-window layers need their own mask")
    h = target.inner.embed_tokens(tok[:, None])
    mask = create_attention_mask(h, cache[0])
    for layer, c in zip(target.layers, cache):
        h = h + _grouped_attention(layer.self_attn, layer.input_layernorm(h), mask, c)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return target.lm_head(target.inner.norm(h)[:, -1])


def left_padded(prompts: list[list[int]]) -> tuple[mx.array, list[int]]:
    """Prompts as one batch [B, longest], each left-padded -> (tokens, each row's padding)."""
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    return mx.array([[0] * k + p for k, p in zip(pads, prompts)]), pads


def last_logits(model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
    """Prefill `tokens` into `cache` -> the logits of the last position [B, V], the head on
    that position only: full-prompt logits of a big batch would not fit."""
    from ..targets import adapter_for

    target = adapter_for(model)
    return target.lm_head(target.inner(tokens, cache=cache)[:, -1])


def continue_batch(model: nn.Module, prompts: list[list[int]], max_new: int, eos: set[int],
                   temperature: float = 0.0, stop_loops: bool = False) -> list[list[int]]:
    """Continuations of a batch of prompts: greedy, or sampled at `temperature` (seed with
    mx.random.seed). Prompts of one length run unpadded, exactly as a single prompt would;
    mixed lengths are left-padded with the padding masked (attention-only models: training
    data, where float noise in the last bits is harmless). Each response ends at its first
    EOS (kept). With `stop_loops`, a row that has fallen into a loop stops counting towards
    the batch's end (cut it afterwards with `loop_starts`)."""
    from mlx_lm.models.cache import make_prompt_cache

    tokens, pads = left_padded(prompts)
    if any(pads) and not paddable(model):
        raise ValueError("prompts of different lengths need an attention-only model: "
                         "group them by length (generate_dataset does)")
    cache = left_padded_cache(model, pads) if any(pads) else make_prompt_cache(model)
    tok = pick(last_logits(model, tokens, cache), temperature)
    steps, finished = [tok], mx.zeros(tok.shape, dtype=mx.bool_)
    eos_ids = mx.array(sorted(eos))
    looped = np.zeros(len(prompts), dtype=bool)
    for i in range(1, max_new):
        finished = finished | (tok[:, None] == eos_ids).any(axis=-1)
        tok = pick(model(tok[:, None], cache=cache)[:, -1], temperature)
        steps.append(tok)
        mx.synchronize()  # cache updates in place (see RunningBatch)
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


class RunningBatch:
    """Continuous batching for attention-only targets: rows that finish (EOS, the token limit,
    or a loop) leave the batch and queued prompts take their place, so the GPU never decodes
    for rows that are done. Answers of very different lengths (up to a thousand tokens) made
    fixed batches run as long as their longest row.

    `seconds` adds up the wall time of each kind of work (decode: building and queuing the
    steps; sync: waiting for their tokens; check: EOS and limits; loops: loop detection;
    drop: removing ended rows; fill: prefilling new ones) and `counts` how often each
    happened. GPU work is lazy: what a step queues is waited for in "sync", and a drop's
    cache copies run with the next step unless `eager` evaluates them where they happen.

    `in_place`: each step is queued only once the step before has finished (its graph is
    built meanwhile). MLX writes a KV cache update into the cache's buffer only when nothing
    else holds that buffer, and a step still queued or running holds it (it reads the
    keys): decoding steps queued back to back copy every layer's whole cache on every
    step, gigabytes at hundreds of rows (scripts/gen_profile.py measures both)."""

    def __init__(self, model: nn.Module, max_new: int, eos: set[int], width: int,
                 temperature: float = 0.0, stop_loops: bool = False,
                 prefill_tokens: int = 1 << 16, attention: str = "mlx",
                 eager: bool = False, in_place: bool = True) -> None:
        from ..targets import adapter_for

        self.model, self.target = model, adapter_for(model)
        self.max_new, self.eos, self.width = max_new, eos, width
        self.temperature, self.stop_loops = temperature, stop_loops
        self.prefill_tokens = prefill_tokens  # bounds a prefill's attention scores
        if attention not in ATTENTION:
            raise ValueError(f"attention {attention!r}: expected one of {ATTENTION}")
        self.attention, self.eager, self.in_place = attention, eager, in_place
        # "auto": the ways still to time, and each way's ms per row-step so far
        self.trials: dict[str, list[float]] = {}
        self._untimed = (["mlx", "grouped"] * AUTO_TRIALS if attention == "auto"
                         and groupable(self.target) else [])
        if attention == "auto" and not self._untimed:
            self.attention = "mlx"
        self.cache: list[Any] | None = None
        self.rows: list[int] = []  # prompt index of each row
        self.out: list[list[int]] = []  # tokens so far of each row
        self.tok: mx.array | None = None  # each row's last token [B]
        self.seconds = dict.fromkeys(("decode", "sync", "check", "loops", "drop", "fill"), 0.0)
        self.counts = dict.fromkeys(("steps", "row_steps", "drops", "fills", "prefills",
                                     "prefill_tokens", "prefill_padding"), 0)

    def add(self, indices: list[int], prompts: list[list[int]]) -> None:
        """Prefill `prompts` (left-padded among themselves) and join them to the batch."""
        tokens, pads = left_padded(prompts)
        cache = left_padded_cache(self.model, pads)
        first = pick(last_logits(self.model, tokens, cache), self.temperature)
        mx.eval(first, [(c.keys, c.values) for c in cache])
        if self.cache is None:
            self.cache, self.tok = cache, first
        else:
            for mine, theirs in zip(self.cache, cache):
                mine.extend(theirs)
            self.tok = mx.concatenate([self.tok, first])
            if self.eager:
                mx.eval(self.tok, [(c.keys, c.values) for c in self.cache])
        self.rows += indices
        self.out += [[t] for t in first.tolist()]
        self.counts["prefills"] += 1
        self.counts["prefill_tokens"] += tokens.size
        self.counts["prefill_padding"] += sum(pads)

    def fill(self, queue: list[int], prompts: list[list[int]]) -> None:
        """Take prompts from the front of `queue` until the batch is `width` rows."""
        t0 = time.perf_counter()
        self.counts["fills"] += 1
        while queue and len(self.rows) < self.width:
            take: list[int] = []
            while queue and len(self.rows) + len(take) < self.width:
                longest = max([len(prompts[i]) for i in take] + [len(prompts[queue[0]])])
                if take and (len(take) + 1) * longest > self.prefill_tokens:
                    break
                take.append(queue.pop(0))
            self.add(take, [prompts[i] for i in take])
        self.seconds["fill"] += time.perf_counter() - t0

    def step(self, n: int) -> dict[int, list[int]]:
        """Decode `n` tokens for every row; -> {prompt index: answer} of the rows that ended
        (their first EOS kept, or the token limit, or a loop with `stop_loops`)."""
        t0 = time.perf_counter()
        steps = []
        tok = self.tok
        way = self._untimed[0] if self._untimed else self.attention
        for _ in range(n):
            logits = decode_logits(self.model, tok, self.cache, way, self.target)
            tok = pick(logits, self.temperature)
            steps.append(tok)
            if self.in_place:
                mx.synchronize()  # the last step lets go of the cache buffers (see class)
            mx.async_eval(tok)
        self.tok = tok
        t1 = time.perf_counter()
        new = np.array(mx.stack(steps, axis=1))
        t2 = time.perf_counter()
        if self._untimed:
            self._timed(way, (t2 - t0) * 1e3 / (n * len(self.rows)))
        self.counts["steps"] += n
        self.counts["row_steps"] += n * len(self.rows)
        done: dict[int, list[int]] = {}
        keep = []
        for r, row in enumerate(new.tolist()):
            out = self.out[r]
            seen = max(0, len(out) - 1)  # the prefill's token is checked on the first step
            out += row
            end = next((j + 1 for j in range(seen, len(out)) if out[j] in self.eos), None)
            if end is not None or len(out) >= self.max_new:
                done[self.rows[r]] = out[:end or self.max_new]
            else:
                keep.append(r)
        t3 = time.perf_counter()
        if self.stop_loops and keep:
            recent = [self.out[r][-128:] for r in keep]
            span = min(len(x) for x in recent)
            rows = np.array([x[-span:] for x in recent])
            looped = loop_starts(rows, np.full(len(keep), span)) >= 0
            for r in [r for r, hit in zip(keep, looped) if hit]:
                done[self.rows[r]] = self.out[r]
            keep = [r for r, hit in zip(keep, looped) if not hit]
        t4 = time.perf_counter()
        if len(keep) < len(self.rows):
            self.drop(keep)
        t5 = time.perf_counter()
        for name, took in (("decode", t1 - t0), ("sync", t2 - t1), ("check", t3 - t2),
                           ("loops", t4 - t3), ("drop", t5 - t4)):
            self.seconds[name] += took
        return done

    def _timed(self, way: str, ms_per_row_step: float) -> None:
        """Record an "auto" trial; after the last, settle on the faster way."""
        self.trials.setdefault(way, []).append(round(ms_per_row_step, 4))
        self._untimed.pop(0)
        if not self._untimed:
            self.attention = min(self.trials, key=lambda w: min(self.trials[w]))

    def drop(self, keep: list[int]) -> None:
        """Keep only rows `keep` (the others ended)."""
        self.counts["drops"] += 1
        self.rows = [self.rows[r] for r in keep]
        self.out = [self.out[r] for r in keep]
        if not keep:
            self.cache, self.tok = None, None
            return
        index = mx.array(keep)
        for c in self.cache:
            c.filter(index)
        self.tok = self.tok[index]
        if self.eager:
            mx.eval(self.tok, [(c.keys, c.values) for c in self.cache])


def answer_running(model: nn.Module, prompts: list[list[int]], max_new: int, eos: set[int],
                   width: int, seconds: float | None = None,
                   on_done: Callable[[int], None] | None = None, temperature: float = 0.0,
                   stop_loops: bool = False, refill_every: int = 32,
                   prefill_tokens: int = 1 << 16, order: list[int] | None = None,
                   attention: str = "mlx", stats: dict | None = None, eager: bool = False,
                   in_place: bool = True,
                   follow_up: Callable[[dict[int, list[int]]], list[int]] | None = None,
                   ) -> dict[int, list[int]]:
    """Answers to `prompts` through one `RunningBatch` of up to `width` rows, prompts taken in
    `order` (default: as given); refills once a quarter of the rows have ended. With
    `seconds`, stops there: the rows in flight give their answers so far (a prefix of the
    target's answer is still its answer), so no tail of ever fewer rows runs on. `stats`,
    if given, receives the batch's `seconds` and `counts` (see RunningBatch). `follow_up`,
    if given, sees the answers that ended at each check and returns the indices of prompts
    it appended to `prompts` meanwhile (a conversation's next turn): they go to the front of
    the queue, so a chat's later turns run beside other chats' earlier ones, not in rounds
    that each end on their longest answer, and a time budget still reaches turn 2 and
    later. -> {prompt index: answer}."""
    batch = RunningBatch(model, max_new, eos, width, temperature, stop_loops, prefill_tokens,
                         attention, eager, in_place)
    queue = list(range(len(prompts))) if order is None else list(order)
    answers: dict[int, list[int]] = {}
    start = time.perf_counter()
    while queue or batch.rows:
        if seconds is not None and time.perf_counter() - start > seconds:
            answers.update(zip(batch.rows, batch.out))
            break
        if queue and len(batch.rows) <= width * 3 // 4:
            batch.fill(queue, prompts)
        done = batch.step(refill_every)
        answers.update(done)
        if on_done and done:
            on_done(len(done))
        if follow_up and done:
            queue[:0] = follow_up(done)
    if stats is not None:
        stats.update(seconds=dict(batch.seconds), counts=dict(batch.counts),
                     wall=time.perf_counter() - start, attention=batch.attention,
                     attention_trials=batch.trials)
    return answers


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


def running_order(prompts: list[list[int]], width: int, window: int = 4) -> list[int]:
    """The order `answer_prompts` feeds a running batch. The prompts' own order is kept
    window by window (`window` batches of `width`), so a time budget that stops the run keeps
    the mix an ordered list holds (mix.weighted_order). Inside a window the prompts are
    sorted by length, so neighbours refill together with little padding, and its chunks of
    `width` are shuffled (seeded) so every length comes early."""
    rng, order, span = random.Random(0), [], width * window
    for start in range(0, len(prompts), span):
        ids = sorted(range(start, min(start + span, len(prompts))), key=lambda i: len(prompts[i]))
        chunks = [ids[i:i + width] for i in range(0, len(ids), width)]
        rng.shuffle(chunks)
        order += [i for c in chunks for i in c]
    return order


def answer_prompts(model: nn.Module, tokenizer: Any, prompts: list[list[int]], max_new: int,
                   batch: int, seconds: float | None = None,
                   on_done: Callable[[int], None] | None = None, token_budget: int = 1 << 18,
                   temperature: float = 0.0, loop_keep: int | None = None,
                   attention: str = "mlx", in_place: bool = True,
                   stats: dict | None = None,
                   follow_up: Callable[[dict[int, list[int]]], list[int]] | None = None,
                   ) -> dict[int, list[int]]:
    """The target's responses to `prompts` in batches of similar length (see
    `length_batches`), in a seeded shuffle so every category and length comes early; ->
    {prompt index: response}. With `seconds`, stops after the batch that crosses it. With
    `loop_keep`, looping rows stop early and are cut `loop_keep` tokens into their loop.
    `attention` picks the decode step's attention for paddable targets (decode_logits),
    `in_place` how their steps are queued (RunningBatch); `stats` receives a running
    batch's time accounts (answer_running). `follow_up` (see answer_running) sees finished
    responses as they are returned (loops cut) and may append prompts to `prompts`: a
    running batch takes them as rows free up, other targets in later batches."""
    eos = set(tokenizer.eos_token_ids)

    def cut(answers: dict[int, list[int]]) -> dict[int, list[int]]:
        return answers if loop_keep is None else dict(
            zip(answers, cut_loops(list(answers.values()), loop_keep)))

    follow = None if follow_up is None else lambda done: follow_up(cut(done))
    if paddable(model):
        return cut(answer_running(model, prompts, max_new, eos, batch, seconds, on_done,
                                  temperature, stop_loops=loop_keep is not None,
                                  order=running_order(prompts, batch), attention=attention,
                                  in_place=in_place, stats=stats, follow_up=follow))
    answers: dict[int, list[int]] = {}
    start = time.perf_counter()
    todo = list(range(len(prompts)))
    while todo:  # rounds: the prompts follow_up added during one are the next one's
        chunks = length_batches([len(prompts[i]) for i in todo], batch, max_new,
                                token_budget, False)
        random.Random(0).shuffle(chunks)
        # full batches first: narrow ones waste the GPU
        chunks.sort(key=lambda c: len(c) < min(batch, 64))
        added: list[int] = []
        for chunk in ([todo[i] for i in c] for c in chunks):
            if seconds is not None and time.perf_counter() - start > seconds:
                return answers
            responses = continue_batch(model, [prompts[i] for i in chunk], max_new, eos,
                                       temperature, stop_loops=loop_keep is not None)
            done = cut(dict(zip(chunk, responses)))
            answers.update(done)
            if on_done:
                on_done(len(chunk))
            if follow:
                added += follow(done)
        todo = added
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
