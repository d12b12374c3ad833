"""Verify lengths the machine runs fastest: the verify cut's length, padded where longer is cheaper.

With the verify cut on (the CPU default), a cycle verifies the staged token and the drafts up
to the first one the draft doubts: 2 to 16 tokens. On a CPU a forward's cost is not monotone
in its token count: the BLAS's matmul kernels work in fixed row tiles, so some lengths cost
more than longer ones (benchmarks/verify-lengths-cpu.json). A cut of n tokens is therefore
verified as the length L >= n whose measured forward is cheapest (the longest within the
timings' noise of it): the extra drafts cost nothing and sometimes land. Lossless: the
target verifies every token it is given.

The costs are measured once per target shape, dtype and machine (a few seconds on the default
pair's CPU) and kept in the cache folder; `dflash doctor` shows them.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from . import blas, device
from .cache import cache_root
from .cycle import prefill
from .loading import Progress, quantization
from .plain import PlainSteps
from .targets.base import TargetAdapter, cache_arrays

CONTEXT = 128  # tokens of context before the timed forwards (a reply's early cycles)
ROUNDS = 4  # timed rounds over every length; the fastest of each is kept (noise only adds)
STEPS = 8  # plain steps per timed run of the pacer's start (`queued_step_s`)
# A longer verify within this fraction of the cheapest counts as cheapest: the timings are
# that noisy on a busy CPU, and a longer verify can accept more.
TOLERANCE = 0.1
FOLDER = "verify-lengths"


def measure(target: TargetAdapter, tap_ids: Sequence[int], size: int,
            rounds: int = ROUNDS, context: int = CONTEXT) -> list[float]:
    """Seconds of one verify forward for 1..size tokens, the fastest of `rounds`:
    costs[T - 1] (see `timings`)."""
    return [min(samples) for samples in timings(target, tap_ids, size, rounds, context)]


def timings(target: TargetAdapter, tap_ids: Sequence[int], size: int, rounds: int,
            context: int) -> list[list[float]]:
    """Seconds of one verify forward (the forward, its argmax, taps and cache, then the
    rollback) for 1..size tokens after `context` tokens, `rounds` each: samples[T - 1].
    Lengths alternate within each round, so a slow moment spreads over all of them."""
    cache = prefilled(target, context)
    samples: list[list[float]] = [[] for _ in range(size)]
    for round_index in range(rounds + 1):  # the first round compiles and warms the BLAS
        order = range(1, size + 1) if round_index % 2 else range(size, 0, -1)
        for tokens in order:
            ids = mx.array([token_ids(target, tokens, 13, 5)])
            target.begin_verify(cache)
            start = time.perf_counter()
            logits, taps = target.forward(ids, cache, tap_ids)
            mx.eval(mx.argmax(logits[0], axis=-1), taps, cache_arrays(cache))
            target.rollback(cache, keep=0, verified=tokens)
            mx.eval(cache_arrays(cache))
            if round_index:
                samples[tokens - 1].append(time.perf_counter() - start)
    return samples


def token_ids(target: TargetAdapter, n: int, step: int, offset: int) -> list[int]:
    """`n` arbitrary token ids 3.. within the vocabulary (the timed forwards' inputs)."""
    m = min(997, target.vocab_size - 3)
    return [(step * i + offset) % m + 3 for i in range(n)]


def prefilled(target: TargetAdapter, context: int) -> list[Any]:
    """A fresh target cache holding `context` tokens."""
    cache = target.make_cache()
    prefill(target, cache, token_ids(target, context, 7, 11), context)
    return cache


def plain_step_s(target: TargetAdapter, tap_ids: Sequence[int], costs_ms: Sequence[float] = (),
                 rounds: int = 3) -> float:
    """Seconds of a plain decoding step (a 1-token verify forward after CONTEXT tokens): where
    the pacer (engine/pause.py) starts, before it times its own. Where the verify costs by
    length are known (`costs_ms`, measured or read from the cache: the CPU, where the cut
    pads to them), their 1-token cost, the same forward: a start times no prefill for it.
    Otherwise timed now as a paused stretch runs them (`queued_step_s`)."""
    if costs_ms:
        return costs_ms[0] / 1e3
    return statistics.median(queued_step_s(target, tap_ids, rounds, CONTEXT))


def queued_step_s(target: TargetAdapter, tap_ids: Sequence[int], rounds: int, context: int,
                  steps: int = STEPS) -> list[float]:
    """Seconds per step of `rounds` runs of `steps` plain steps after `context` tokens, each
    queued before the last one's token is read (engine/plain.py's PlainSteps, as mlx-lm's
    generate_step). On a GPU a step timed on its own also pays the host building its graph,
    which queued steps overlap with the device's work: the pacer would take a cycle for
    cheaper than it is, in plain steps, and keep speculating where the draft does not pay."""
    cache = prefilled(target, context)
    per_step = []
    for round_index in range(rounds + 1):  # the first round compiles and warms up
        start = time.perf_counter()
        run = PlainSteps(target, cache, 5, list(tap_ids), None)
        for i in range(steps):
            run.read(more=i + 1 < steps)
        if round_index:
            per_step.append((time.perf_counter() - start) / steps)
        run.close()
    return per_step


def padded_lengths(costs: Sequence[float], tolerance: float = TOLERANCE) -> tuple[int, ...]:
    """costs[T - 1] of a T-token verify -> lengths[n]: the length to verify for a cut of n
    tokens, the longest L >= n that costs at most (1 + tolerance) times the cheapest such
    length. lengths[0] = 0."""
    lengths = [0] * (len(costs) + 1)
    for n in range(1, len(costs) + 1):
        cheapest = min(costs[n - 1:])
        lengths[n] = max(L for L in range(n, len(costs) + 1)
                         if costs[L - 1] <= cheapest * (1 + tolerance))
    return tuple(lengths)


def key_for(model: nn.Module, target: TargetAdapter, dtype: str, tap_ids: Sequence[int],
            size: int) -> dict:
    """What a forward's cost depends on: the target's shape and weights' storage, the taps,
    the machine, its BLAS and MLX."""
    args = getattr(model, "args", None)
    shape = vars(args) if args is not None and hasattr(args, "__dict__") else {}
    return {"shape": json.loads(json.dumps(shape, default=str, sort_keys=True)),
            "family": target.family, "dtype": dtype,
            "quantization": quantization(model), "taps": list(tap_ids), "size": size,
            "backend": device.current(), "cpu": device.cpu_name(), "cpu_count": os.cpu_count(),
            "blas": blas.status().library, "mlx": mx.__version__}


def path_for(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / FOLDER / f"{digest}.json"


def load_or_measure(model: nn.Module, target: TargetAdapter, dtype: str,
                    tap_ids: Sequence[int], size: int,
                    progress: Progress | None = None) -> dict[str, Any]:
    """{"costs_ms", "lengths", "measured_at", "key"}: from the cache folder, or measured now
    (a few seconds, which `progress` is told of) and kept there (a cache folder we cannot
    write only costs the next start a measurement)."""
    key = key_for(model, target, dtype, tap_ids, size)
    path = path_for(key)
    try:
        record = json.loads(path.read_text())
        if record.get("key") == key and len(record.get("lengths", ())) == size + 1:
            record["lengths"] = tuple(record["lengths"])
            return record
    except (OSError, ValueError):
        pass
    if progress is not None:
        progress("timing verify lengths on this machine (once for this model)", None)
    costs = measure(target, tap_ids, size)
    record = {"key": key, "costs_ms": [round(c * 1e3, 3) for c in costs],
              "lengths": padded_lengths(costs),
              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)
    except OSError:
        pass
    return record
