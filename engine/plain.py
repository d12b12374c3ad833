"""Paused stretches: the target alone, one token a step, each step queued before the host
reads the last one's token.

While the pacer (engine/pause.py) has speculation paused, the decode loop (engine/cycle.py)
hands the back-off's tokens to `plain_stretch`. As mlx-lm's generate_step does, the next
step's forward is queued before the host reads the current token, so the device does not
wait for the host between steps (on a GPU a small target's step is mostly host time). A
stretch that ends early (a stop token, or a long suffix-lookup match for the loop to
propose) discards the one step queued ahead: the target's caches roll it back as they roll
back a verify's rejected tokens. Lossless: each token is the target's argmax, or a draw from
its processed distribution, from the same 1-token forward a paused cycle runs.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx

from .events import Commit, CycleStats
from .pause import Pacer
from .sampling import Sampler, next_token
from .targets.base import TargetAdapter


class Proposer(Protocol):
    """What a stretch needs of the loop's proposer (cycle.DraftProposer)."""

    @property
    def tap_ids(self) -> Sequence[int]: ...

    def observe(self, tokens: Sequence[int]) -> None: ...

    def paused_size(self, size: int) -> int: ...


@dataclass
class Stretch:
    """Where a stretch left the reply: its last token (the next cycle's staged one), the
    tokens it committed, and whether it ended at a stop token."""

    last: int
    tokens: int
    stopped: bool


class PlainSteps:
    """1-token forwards of the target, each queued (`async_eval`) before the one before it is
    read. Each runs as a 1-token verify (`begin_verify`), so the one queued ahead can be
    rolled back."""

    def __init__(self, target: TargetAdapter, cache: list[Any], staged: int,
                 tap_ids: list[int], sampler: Sampler | None) -> None:
        self.target, self.cache, self.tap_ids, self.sampler = target, cache, tap_ids, sampler
        self.pending: tuple[mx.array, mx.array] | None = self._queue(mx.array([staged]))

    def _queue(self, token: mx.array) -> tuple[mx.array, mx.array]:
        self.target.begin_verify(self.cache)
        logits, taps = self.target.forward(token.reshape(1, 1).astype(mx.int32), self.cache,
                                           self.tap_ids)
        following = self.choose(logits[0, -1])
        mx.async_eval(following, taps)
        return following, taps

    def choose(self, logits: mx.array) -> mx.array:
        """The token after a step: the target's argmax, or a draw from its processed
        distribution (what a 1-token verify's speculative sampling draws)."""
        return next_token(logits, self.sampler)

    def read(self, more: bool) -> tuple[int, mx.array]:
        """The pending step's token and tapped features [1, 1, F]; with `more`, the step
        after it is queued before the read waits for the device."""
        assert self.pending is not None, "read after the last step"
        following, taps = self.pending
        self.pending = self._queue(following) if more else None
        return int(following.item()), taps

    def close(self) -> None:
        """Discard the step queued ahead, if any, else settle the last one read."""
        self.target.rollback(self.cache, keep=0 if self.pending is not None else 1, verified=1)
        self.pending = None


def plain_stretch(target: TargetAdapter, proposer: Proposer, pacer: Pacer, cache: list[Any],
                  staged: int, left: int, block_size: int, sampler: Sampler | None,
                  stop_ids: Collection[int], index: int) -> Generator[Commit, None, Stretch]:
    """The rest of the pacer's back-off (at most `left` tokens, those left to emit) by the
    target alone after `staged`, one Commit a token, numbered as cycles from `index`; their
    tapped features wait in `pacer.deferred`. Ends early at a stop token, or where the
    suffix lookup finds a long match (the loop proposes its repeat)."""
    count = min(pacer.left, left)
    done, last, stopped = 0, staged, False
    pacer.begin()
    steps = PlainSteps(target, cache, staged, list(proposer.tap_ids), sampler)
    try:
        while done < count:
            more = done + 1 < count
            start = time.perf_counter()
            last, taps = steps.read(more)
            pacer.end(1, plain=True)
            pacer.deferred.append(taps)
            proposer.observe([last])
            stopped = last in stop_ids
            yield Commit([last], 0, CycleStats(index + done, 1, 0, 0.0,
                                               time.perf_counter() - start, 0.0, paused=True))
            done += 1
            if stopped or (more and proposer.paused_size(min(block_size, left - done)) > 1):
                break
            pacer.begin()
    finally:
        steps.close()
    return Stretch(last, done, stopped)
