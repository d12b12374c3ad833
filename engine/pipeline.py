"""Pipelined greedy cycles: the next cycle is built and queued before this one's commit is read.

A plain cycle reads its accepted count before the host builds the next verify, so on a GPU
the verify's device time and the host's graph building add up, where plain decoding
overlaps them (mlx-lm queues step n + 1 before it reads step n). Here nothing the host
builds waits for a read: the target's and the draft's caches keep every verified position,
the rejected ones hidden by a mask held on the device; the next block's position (RoPE) and
its staged token stay device arrays too. Every DRAIN_EVERY cycles, and at the end, the
pipeline drains and the caches are compacted to the committed positions, whose counts have
been read by then.

Greedy, whole blocks, pure-attention targets with plain KV caches, drafts without sliding
windows (`pipeline_applies`); the suffix lookup is off (it reads committed tokens before it
proposes). Lossless as the verify defines it: every committed token is the verify's argmax.
A hidden position weighs exactly zero, but attention over a longer row of keys rounds
differently from attention over the trimmed cache, so in float32 the output is not bit for
bit plain decoding's: meant for GPUs at checkpoint precision, under the near-tie rule.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from .cycle import Commit, DraftProposer, accept, commit_row, prefill
from .draft import DFlashDraft
from .events import CycleStats
from .targets.base import TargetAdapter, cache_arrays

# Cycles between drains: the caches then hold at most this many cycles' rejected positions
DRAIN_EVERY = 32


def pipeline_applies(target: TargetAdapter, draft: DFlashDraft, caches: list[Any],
                     min_confidence: float | None) -> bool:
    """Whether greedy cycles can be pipelined: whole blocks, a target that verifies at a
    device position (`forward_at`), not sharded, a draft whose context can hold hidden
    positions (no sliding window, as for the prefetch), and plain KV `caches` (the target's
    and the draft's)."""
    return (min_confidence is None and target.lockstep is None
            and hasattr(target, "forward_at") and draft.can_prefetch
            and all(type(c) is KVCache for c in caches))


@dataclass
class Queued:
    """The device state after the cycles queued so far: the next block's staged token [1],
    its positions in the target's and the draft's caches (scalars), and which entries of
    each cache are committed ones (bool, one per entry)."""

    staged: mx.array
    target_position: mx.array
    draft_position: mx.array
    target_visible: mx.array
    draft_visible: mx.array

    def arrays(self) -> list[mx.array]:
        return [self.staged, self.target_position, self.draft_position, self.target_visible,
                self.draft_visible]

    @classmethod
    def settled(cls, staged: int, target_length: int, draft_length: int) -> Queued:
        """After a drain: every cached entry committed."""
        return cls(mx.array([staged], dtype=mx.int32), mx.array(target_length, mx.int32),
                   mx.array(draft_length, mx.int32), mx.ones((target_length,), mx.bool_),
                   mx.ones((draft_length,), mx.bool_))


@dataclass
class InFlight:
    """One queued cycle: what its one read brings back (`commit_row`) and where its block
    starts in the target's and the draft's caches."""

    values: mx.array
    target_start: int
    draft_start: int
    size: int
    draft_s: float
    verify_s: float


@dataclass
class Committed:
    """The cache entries to keep at the next compaction: each cache's length at the last one
    (all committed), then each read cycle's block start and its committed entries."""

    target_base: int
    draft_base: int
    blocks: list[tuple[int, int, int]] = field(default_factory=list)

    def indices(self, which: int) -> list[int]:
        base = self.target_base if which == 0 else self.draft_base
        kept = list(range(base))
        for block in self.blocks:
            kept += range(block[which], block[which] + block[2])
        return kept


def queue_cycle(target: TargetAdapter, proposer: DraftProposer, cache: list[Any],
                state: Queued, size: int) -> tuple[InFlight, Queued]:
    """`build_cycle`, then queue its work on the device."""
    flight, after = build_cycle(target, proposer, cache, state, size)
    mx.async_eval(flight.values, *after.arrays(), *cache_arrays(cache, proposer.cache))
    return flight, after


def build_cycle(target: TargetAdapter, proposer: DraftProposer, cache: list[Any],
                state: Queued, size: int) -> tuple[InFlight, Queued]:
    """Build one cycle's graph on `state`: the draft's proposal, the verify, the acceptance
    and the caches' new entries, nothing read. -> (the cycle, the state after it)."""
    t0 = time.perf_counter()
    verify_in = proposer.propose_queued(state.staged, state.draft_position, state.draft_visible,
                                        size)
    t1 = time.perf_counter()
    target_start, draft_start = target.cache_length(cache), proposer.cache[0].offset
    logits, taps = target.forward_at(verify_in, cache, proposer.tap_ids, state.target_position,
                                     state.target_visible)
    accepted, choice = accept(verify_in, logits)
    following = choice[accepted]
    proposer.draft.append_context(taps, proposer.cache, state.draft_position)
    kept = mx.arange(size) <= accepted  # the staged token and the accepted drafts
    values = commit_row(verify_in, accepted, following)
    after = Queued(following.reshape(1), state.target_position + accepted + 1,
                   state.draft_position + accepted + 1,
                   mx.concatenate([state.target_visible, kept]),
                   mx.concatenate([state.draft_visible, kept]))
    return (InFlight(values, target_start, draft_start, size, t1 - t0,
                     time.perf_counter() - t1), after)


def compact(caches: list[Any], kept: list[int]) -> None:
    """Keep only the entries `kept` (ascending indices) of every KV cache in `caches`."""
    index = mx.array(kept, dtype=mx.int32)
    for c in caches:
        if c.keys is not None:
            c.keys, c.values = c.keys[:, :, index], c.values[:, :, index]
        c.offset = len(kept)
    mx.eval([a for c in caches if c.keys is not None for a in (c.keys, c.values)])


def pipelined_decode(target: TargetAdapter, proposer: DraftProposer, prompt: list[int],
                     max_tokens: int, block_size: int, prefill_chunk: int,
                     cache: list[Any] | None = None,
                     stop_ids: Collection[int] = ()) -> Iterator[Commit]:
    """`speculative_decode`'s greedy cycles, pipelined: yields the prefill's token, then one
    Commit per cycle, read one cycle late. A commit holding one of `stop_ids` is the last,
    and the caches then end just before that token, as there."""
    cache = target.make_cache() if cache is None else cache
    last = prefill(target, cache, prompt, prefill_chunk, proposer)
    staged = int(mx.argmax(last))
    proposer.observe([staged])
    yield Commit([staged], 0)
    emitted, index = 1, 0
    committed = Committed(target.cache_length(cache), proposer.cache[0].offset)
    state = Queued.settled(staged, committed.target_base, committed.draft_base)
    flight: InFlight | None = None
    if emitted < max_tokens:
        flight, state = queue_cycle(target, proposer, cache, state, block_size)
    while flight is not None:
        # the next cycle is queued before this one is read, unless this one ends the reply
        # for sure or the caches are due to drain
        following = None
        if emitted + 1 < max_tokens and (index + 1) % DRAIN_EVERY:
            following = queue_cycle(target, proposer, cache, state, block_size)
        t0 = time.perf_counter()
        row = flight.values.tolist()
        wait_s = time.perf_counter() - t0
        a = row[0]
        tokens = (row[1:1 + a] + [row[-1]])[:max_tokens - emitted]
        stop = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
        if stop is not None:
            tokens = tokens[:stop + 1]  # the stop token is yielded, never fed
        # cache entries kept: the staged token and every yielded token but the last
        committed.blocks.append((flight.target_start, flight.draft_start, len(tokens)))
        emitted += len(tokens)
        proposer.observe(tokens)
        yield Commit(tokens, min(a, len(tokens)),
                     CycleStats(index, flight.size, a, flight.draft_s, flight.verify_s, wait_s))
        index += 1
        if stop is not None or emitted >= max_tokens:
            break
        if following is None:  # drain: compact, then go on from the committed state
            settle(target, proposer, cache, committed)
            committed = Committed(target.cache_length(cache), proposer.cache[0].offset)
            state = Queued.settled(tokens[-1], committed.target_base, committed.draft_base)
            flight, state = queue_cycle(target, proposer, cache, state, block_size)
        else:
            flight, state = following
    settle(target, proposer, cache, committed)


def settle(target: TargetAdapter, proposer: DraftProposer, cache: list[Any],
           committed: Committed) -> None:
    """Wait for the queued work, then keep only the committed entries of both caches."""
    mx.eval(cache_arrays(cache, proposer.cache))
    compact(cache, committed.indices(0))
    compact(proposer.cache, committed.indices(1))
