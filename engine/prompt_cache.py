"""Conversation-state reuse: recent target + draft states, keyed by the tokens they hold.

A request resumes from the longest cached prefix of its prompt and prefills only the rest.
Attention KV caches (target and draft) can be cut to any prefix. A GatedDeltaNet layer's
conv + recurrent state cannot, so for those layers an entry keeps snapshots where reuse
happens (the end of each prompt and of each reply, inherited from the entry it grew from)
and a request resumes from the longest snapshot that is a prefix of its prompt.

Entries live in an LRU bounded in bytes. Restoring never writes into a stored array: KV
buffers are sliced into fresh caches (MLX writes in place only into the slice's own buffer
once it grows), and recurrent states are immutable arrays that layers replace, not mutate.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

# The budget "auto" takes this share of the machine's (or accelerator's) memory, capped: the
# model, its activations and the running generation need the rest.
AUTO_SHARE = 8
AUTO_CAP = 8 << 30
# Snapshots kept per entry (oldest dropped first): a qwen3.5-9B snapshot is ~50 MB.
MAX_SNAPSHOTS = 16

Snapshot = dict[int, tuple[list, Any, Any]]  # target layer -> ArraysCache state


def default_cache_bytes() -> int:
    """The "auto" budget: an eighth of the device's memory (system RAM on CPU), at most 8 GiB."""
    total = 0
    try:
        total = int(mx.device_info().get("memory_size", 0))
    except (AttributeError, RuntimeError):
        total = 0
    if not total:
        try:
            total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            total = 8 << 30
    return min(total // AUTO_SHARE, AUTO_CAP)


def resolve_cache_bytes(value: int | str | None) -> int:
    """DFlashConfig.prompt_cache_bytes -> a byte budget (0: reuse off)."""
    if value == "auto":
        return default_cache_bytes()
    return int(value or 0)


def supported(cache: list[Any]) -> bool:
    """Reuse knows how to cut KVCache and snapshot ArraysCache layers (rotating, quantized
    or chunked caches would need their own rules: such targets always prefill fresh)."""
    return all(type(c) is KVCache or isinstance(c, ArraysCache) for c in cache)


def snapshot(cache: list[Any]) -> Snapshot:
    """The non-trimmable layers' states as they are now (references: they are replaced, not
    mutated, by later steps; the list itself is copied because layers assign into it)."""
    return {i: (list(c.cache), c.left_padding, c.lengths)
            for i, c in enumerate(cache) if isinstance(c, ArraysCache)}


def _nbytes(x: Any) -> int:
    if isinstance(x, mx.array):
        return x.nbytes
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(a) for a in x)
    return 0


@dataclass
class PromptState:
    """A request's live caches and what it resumed from."""

    cache: list[Any]  # the target's (mlx-lm) caches
    draft_cache: list[Any] | None  # the draft's context caches; None: plain decoding
    cached: int = 0  # prompt tokens restored rather than prefilled
    snapshots: dict[int, Snapshot] = field(default_factory=dict)  # position -> states

    @property
    def recurrent(self) -> bool:
        """Whether some layer's state cannot be cut back (it needs snapshots)."""
        return any(isinstance(c, ArraysCache) for c in self.cache)

    def mark(self, position: int) -> None:
        """Remember the recurrent states at `position` (tokens held now)."""
        if self.recurrent:
            self.snapshots[position] = snapshot(self.cache)


@dataclass
class Entry:
    tokens: list[int]  # the tokens the state holds, in order
    kv: list[tuple[mx.array, mx.array] | None]  # per target layer: keys, values (KV layers)
    draft_kv: list[tuple[mx.array, mx.array]] | None  # None: made without the draft
    snapshots: dict[int, Snapshot]  # position -> recurrent states; includes len(tokens)
    nbytes: int = 0

    @property
    def trimmable(self) -> bool:
        return all(not s for s in self.snapshots.values())

    def usable(self, limit: int) -> int:
        """The longest position <= limit this entry can resume from (0: none)."""
        limit = min(limit, len(self.tokens))
        if self.trimmable:
            return limit
        return max((p for p in self.snapshots if p <= limit), default=0)

    def covers(self, other: Entry) -> bool:
        """Whether this entry can serve every request `other` can (so `other` is redundant)."""
        n = len(other.tokens)
        if n > len(self.tokens) or self.tokens[:n] != other.tokens:
            return False
        if other.draft_kv is not None and self.draft_kv is None:
            return False
        return self.trimmable or set(other.snapshots) <= set(self.snapshots)


def _cut(keys: mx.array, values: mx.array, n: int) -> KVCache:
    c = KVCache()
    c.keys, c.values, c.offset = keys[..., :n, :], values[..., :n, :], n
    return c


def _kv(c: KVCache) -> tuple[mx.array, mx.array]:
    return c.keys[..., : c.offset, :], c.values[..., : c.offset, :]


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PromptCache:
    """LRU of Entries bounded by `max_bytes` (0 turns reuse off)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # oldest first
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def tokens(self) -> list[list[int]]:
        """The tokens each entry holds, least recently used first."""
        return [list(e.tokens) for e in self._entries.values()]

    def clear(self) -> None:
        self._entries.clear()

    def fetch(self, ids: list[int], fresh_cache: list[Any],
              fresh_draft: list[Any] | None) -> PromptState:
        """The state to resume `ids` from: the longest usable cached prefix, leaving at least
        the last prompt token to run (its logits give the first reply token). `fresh_draft`
        is None for plain decoding; a speculative request needs an entry with draft state."""
        state = PromptState(fresh_cache, fresh_draft)
        if not self.max_bytes or not supported(fresh_cache):
            return state
        best, best_at = None, 0
        for key, entry in self._entries.items():
            if fresh_draft is not None and entry.draft_kv is None:
                continue
            at = entry.usable(min(_common(entry.tokens, ids), len(ids) - 1))
            if at > best_at:
                best, best_at = key, at
        if best is None:
            return state
        self._entries.move_to_end(best)
        entry = self._entries[best]
        recurrent = entry.snapshots.get(best_at, {})
        cache = []
        for i, (c, kv) in enumerate(zip(fresh_cache, entry.kv)):
            if kv is not None:
                cache.append(_cut(*kv, best_at))
            else:
                layers, padding, lengths = recurrent[i]
                c.cache, c.left_padding, c.lengths = list(layers), padding, lengths
                cache.append(c)
        draft = None
        if fresh_draft is not None:
            draft = [_cut(k, v, best_at) for k, v in entry.draft_kv]
        inherited = {p: s for p, s in entry.snapshots.items() if p <= best_at}
        return PromptState(cache, draft, best_at, inherited)

    def store(self, tokens: list[int], state: PromptState) -> None:
        """Keep `state` (which holds exactly `tokens`) for later requests."""
        if not self.max_bytes or not tokens or not supported(state.cache):
            return
        state.mark(len(tokens))
        positions = sorted(p for p in state.snapshots if p <= len(tokens))[-MAX_SNAPSHOTS:]
        snapshots = {p: state.snapshots[p] for p in positions}
        kv = [_kv(c) if type(c) is KVCache else None for c in state.cache]
        draft_kv = None
        if state.draft_cache is not None:
            draft_kv = [_kv(c) for c in state.draft_cache]
        entry = Entry(list(tokens), kv, draft_kv, snapshots)
        # The kept KV slices hold their caches' whole buffers (grown in steps): count those.
        kv_caches = [c for c in state.cache if type(c) is KVCache]
        kv_caches += state.draft_cache if draft_kv is not None else []
        entry.nbytes = sum(c.nbytes for c in kv_caches) + sum(
            _nbytes([s[0] for s in snap.values()]) for snap in snapshots.values())
        if entry.nbytes > self.max_bytes:
            return
        for key in [k for k, e in self._entries.items() if entry.covers(e)]:
            del self._entries[key]
        self._entries[self._next] = entry
        self._next += 1
        while self.nbytes > self.max_bytes:
            self._entries.popitem(last=False)
