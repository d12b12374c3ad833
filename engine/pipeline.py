"""Pipelined greedy cycles: the next cycle is built and queued before this one's commit is read.

A plain cycle reads its accepted count before the host builds the next verify, so on a GPU
the verify's device time and the host's graph building add up, where plain decoding
overlaps them (mlx-lm queues step n + 1 before it reads step n). Here nothing the host
builds waits for a read: the target's and the draft's caches keep every verified position,
the rejected ones hidden by a mask held on the device; the next block's position (RoPE) and
its staged token stay device arrays too. Every DRAIN_EVERY cycles, and at the end, the
pipeline drains and the caches are compacted to the committed positions, whose counts have
been read by then.

The suffix lookup (engine/lookup.py) runs on the device too (`looked_up`), over the committed
tokens kept there: where the context's last `min_match` tokens occurred before, what followed
the place the host's lookup picks is the proposal instead of the draft's (the draft forward
still runs: the host cannot skip what it has not read); where only its last `short_match`
did, the draft weighs that repeat against its own proposal, as on the host (full heads).

Greedy, whole blocks, pure-attention targets with plain KV caches, drafts without sliding
windows (`pipeline_applies`). Lossless as the verify defines it: every committed token is
the verify's argmax.
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

from .cycle import Commit, DraftProposer, accept, commit_values, prefill, read_commit
from .draft import DFlashDraft
from .events import CycleStats
from .lookup import MAX_MATCH, RECENT
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
    its positions in the target's and the draft's caches (scalars), which entries of each
    cache are committed ones (bool, one per entry), and for the lookup the context's tokens
    (a buffer, the staged token last of the first `length`)."""

    staged: mx.array
    target_position: mx.array
    draft_position: mx.array
    target_visible: mx.array
    draft_visible: mx.array
    context: mx.array | None = None  # None: no lookup
    length: mx.array | None = None

    def arrays(self) -> list[mx.array]:
        return [self.staged, self.target_position, self.draft_position, self.target_visible,
                self.draft_visible, *([] if self.context is None else [self.context, self.length])]

    @classmethod
    def settled(cls, context: list[int], target_length: int, draft_length: int,
                room: int | None) -> Queued:
        """After a drain: every cached entry committed; `context` the tokens so far (the
        staged one last), kept on the device with `room` for more (None: not kept)."""
        return cls(mx.array(context[-1:], dtype=mx.int32), mx.array(target_length, mx.int32),
                   mx.array(draft_length, mx.int32), mx.ones((target_length,), mx.bool_),
                   mx.ones((draft_length,), mx.bool_),
                   None if room is None else mx.array(context + [0] * room, dtype=mx.int32),
                   None if room is None else mx.array(len(context), mx.int32))


@dataclass
class InFlight:
    """One queued cycle: what its one read brings back (`commit_values`) and where its block
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

    def target_entries(self) -> list[int]:
        return self._entries(self.target_base, 0)

    def draft_entries(self) -> list[int]:
        return self._entries(self.draft_base, 1)

    def _entries(self, base: int, start: int) -> list[int]:
        """The indices to keep in one cache: its committed base, then each block's kept
        entries from its start there (`start`: which of a block's two starts)."""
        kept = list(range(base))
        for block in self.blocks:
            kept += range(block[start], block[start] + block[2])
        return kept


def queue_cycle(target: TargetAdapter, proposer: DraftProposer, cache: list[Any],
                state: Queued, size: int) -> tuple[InFlight, Queued]:
    """`build_cycle`, then queue its work on the device."""
    flight, after = build_cycle(target, proposer, cache, state, size)
    mx.async_eval(flight.values, *after.arrays(), *cache_arrays(cache, proposer.cache))
    return flight, after


def looked_up(context: mx.array, length: mx.array, min_match: int, count: int
              ) -> tuple[mx.array, mx.array]:
    """SuffixLookup.propose on the device, over the first `length` tokens of `context`: of the
    RECENT latest earlier places where its last `min_match` tokens occurred, the one whose
    match runs longest (up to MAX_MATCH; the latest on a tie), and the `count` tokens that
    followed it, continued through the match's period where they reach the present.
    -> (whether there is one: a bool scalar, the tokens [count])."""
    size = context.shape[0]
    at = mx.arange(size)
    last = length - 1
    back = mx.arange(MAX_MATCH)[:, None]  # k tokens back from each place and from the end
    earlier = at[None] - back
    same = (context[mx.maximum(earlier, 0)] == context[last - back]) & (earlier >= 0)
    run = mx.sum(mx.cumprod(same.astype(mx.int32), axis=0), axis=0)  # each place's match
    hit = (run >= min_match) & (at < last)
    later = mx.cumsum(hit.astype(mx.int32), reverse=True) - hit  # hits after each place
    score = mx.where(hit & (later < RECENT), run * size + at, -1)
    end = mx.argmax(score)
    period = mx.maximum(last - end, 1)
    source = end + 1 + mx.arange(count) % period
    return mx.max(score) >= 0, context[mx.clip(source, 0, size - 1)]


def build_cycle(target: TargetAdapter, proposer: DraftProposer, cache: list[Any],
                state: Queued, size: int) -> tuple[InFlight, Queued]:
    """Build one cycle's graph on `state`: the proposal (the draft's, or the lookup's where
    it finds a match), the verify, the acceptance and the new entries of the caches and the
    context, nothing read. -> (the cycle, the state after it)."""
    t0 = time.perf_counter()
    repeats = []
    if state.context is not None and proposer.lookup is not None and size > 1:
        lookup = proposer.lookup  # its long matches, then its shorter ones
        for n in dict.fromkeys((lookup.min_match, min(lookup.short_match, lookup.min_match))):
            repeats.append(looked_up(state.context, state.length, n, size - 1))
    verify_in, took = proposer.propose_queued(state.staged, state.draft_position,
                                              state.draft_visible, size, repeats)
    t1 = time.perf_counter()
    target_start, draft_start = target.cache_length(cache), proposer.cache[0].offset
    logits, taps = target.forward_at(verify_in, cache, proposer.tap_ids, state.target_position,
                                     state.target_visible)
    accepted, choice = accept(verify_in, logits)
    following = choice[accepted]
    proposer.draft.append_context(taps, proposer.cache, state.draft_position)
    slots = mx.arange(size)
    kept = slots <= accepted  # the staged token and the accepted drafts
    values = commit_values(verify_in, accepted, following, took)
    after = Queued(following.reshape(1), state.target_position + accepted + 1,
                   state.draft_position + accepted + 1,
                   mx.concatenate([state.target_visible, kept]),
                   mx.concatenate([state.draft_visible, kept]))
    if state.context is not None:
        # the committed tokens after the staged one (the kept drafts, then the target's) go
        # after the context's; what lies past them the next cycle overwrites
        tokens = mx.where(slots == accepted, following,
                          mx.concatenate([verify_in[0, 1:], following.reshape(1)]))
        at = mx.minimum(state.length + slots, state.context.shape[0] - 1)  # room: see caller
        after.context = mx.put_along_axis(state.context, at, tokens, axis=0)
        after.length = state.length + accepted + 1
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
    # The lookup's context on the device has room for every token a reply commits there,
    # even past max_tokens (the host cuts there), and for the block the queued cycle after
    # it writes.
    room = max_tokens + 2 * block_size if proposer.lookup is not None else None
    committed = Committed(target.cache_length(cache), proposer.cache[0].offset)
    state = Queued.settled(known_context(proposer, staged), committed.target_base,
                           committed.draft_base, room)
    flight: InFlight | None = None
    if emitted < max_tokens:
        flight, state = queue_cycle(target, proposer, cache, state, block_size)
    try:
        while flight is not None:
            # the next cycle is queued before this one is read, unless this one ends the
            # reply for sure or the caches are due to drain
            following = None
            if emitted + 1 < max_tokens and (index + 1) % DRAIN_EVERY:
                following = queue_cycle(target, proposer, cache, state, block_size)
            t0 = time.perf_counter()
            a, tokens, took = read_commit(flight.values)
            wait_s = time.perf_counter() - t0
            tokens = tokens[:max_tokens - emitted]
            stop = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
            if stop is not None:
                tokens = tokens[:stop + 1]  # the stop token is yielded, never fed
            # cache entries kept: the staged token and every yielded token but the last
            committed.blocks.append((flight.target_start, flight.draft_start, len(tokens)))
            emitted += len(tokens)
            proposer.observe(tokens)
            yield Commit(tokens, min(a, len(tokens)),
                         CycleStats(index, flight.size, a, flight.draft_s, flight.verify_s,
                                    wait_s, took))
            index += 1
            if stop is not None or emitted >= max_tokens:
                break
            if following is None:  # drain: compact, then go on from the committed state
                settle(proposer, cache, committed)
                committed = Committed(target.cache_length(cache), proposer.cache[0].offset)
                state = Queued.settled(known_context(proposer, tokens[-1]),
                                       committed.target_base, committed.draft_base, room)
                flight, state = queue_cycle(target, proposer, cache, state, block_size)
            else:
                flight, state = following
    finally:  # also when the caller stops early (a cancelled reply keeps a usable state)
        settle(proposer, cache, committed)


def known_context(proposer: DraftProposer, staged: int) -> list[int]:
    """The tokens a settled state starts from, the staged one last: the lookup's (it holds
    the conversation so far), else the staged token alone (no lookup to feed)."""
    return list(proposer.lookup.tokens) if proposer.lookup is not None else [staged]


def settle(proposer: DraftProposer, cache: list[Any], committed: Committed) -> None:
    """Keep only the committed entries of the target's and the draft's caches (evaluating
    them waits for the queued work that wrote them)."""
    compact(cache, committed.target_entries())
    compact(proposer.cache, committed.draft_entries())
