"""Suffix lookup: the tokens that followed the last time the context's latest tokens occurred.

Greedy replies of small targets repeat themselves (a loop, a list's frame, a name or number
copied from the prompt). Where the context's last `min_match` or more tokens occurred before,
what followed them then is a proposal the target often accepts whole, further than the
DFlash draft reaches. A shorter match (from `short_match` tokens) is only an alternative: the
cycle still runs the draft and keeps whichever proposal the draft itself expects to run further
(`cycle.choose_proposal`). A proposal only; the target verifies it like any other. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

MIN_MATCH = 5  # picked on held-out answers: benchmarks/stage13/lookup-study-cpu.json
SHORT_MATCH = 2  # shorter matches than min_match: an alternative to the draft's proposal
MAX_MATCH = 64
RECENT = 4  # earlier occurrences compared per proposal, most recent first


@dataclass
class SuffixLookup:
    """The context's tokens (prompt, then every committed token), indexed by their n-grams."""

    min_match: int = MIN_MATCH
    short_match: int = SHORT_MATCH  # >= min_match: no short matches
    tokens: list[int] = field(default_factory=list)
    # n-gram -> where it ended, for n = min_match and n = short_match
    _ends: dict[tuple[int, ...], list[int]] = field(default_factory=dict)

    def extend(self, tokens: Iterable[int]) -> None:
        sizes = {self.min_match, min(self.short_match, self.min_match)}
        for token in tokens:
            self.tokens.append(int(token))
            end = len(self.tokens) - 1
            for n in sizes:
                if end + 1 >= n:
                    self._ends.setdefault(tuple(self.tokens[end - n + 1:]), []).append(end)

    def match(self) -> tuple[int, int]:
        """-> (length, end) of the longest earlier occurrence of the context's last tokens
        (ending at index `end`), among the RECENT latest ones of the last min_match tokens,
        else of the last short_match ones; (0, -1) when there is none."""
        found = self._match(self.min_match)
        if not found[0] and self.short_match < self.min_match:
            found = self._match(self.short_match)
        return found

    def _match(self, n: int) -> tuple[int, int]:
        tokens = self.tokens
        if len(tokens) <= n:
            return 0, -1
        last = len(tokens) - 1
        ends = self._ends.get(tuple(tokens[-n:]), [])
        best = (0, -1)
        for end in reversed(ends[-RECENT - 1:]):
            if end == last:
                continue
            length = n
            while (length < MAX_MATCH and end - length >= 0
                   and tokens[end - length] == tokens[last - length]):
                length += 1
            if length > best[0]:
                best = (length, end)
        return best

    def propose(self, count: int) -> tuple[int, list[int]]:
        """-> (match length, up to `count` tokens that followed the best match, continued
        through the match's own period where they run into the present); (0, []) when there
        is no match."""
        return self.follow(self.match(), count)

    def follow(self, found: tuple[int, int], count: int) -> tuple[int, list[int]]:
        """`propose` for a match `found` (length, end) that `match` returned."""
        length, end = found
        if not length:
            return 0, []
        period = len(self.tokens) - 1 - end
        out: list[int] = []
        for i in range(count):
            source = end + 1 + i
            out.append(self.tokens[source] if source < len(self.tokens) else out[i - period])
        return length, out


COPY_LONGEST = 4  # the longest n-gram a copy candidate is matched on


@dataclass
class ContextCopy:
    """Within a draft's block: the token that followed, earlier in the context, the longest
    n-gram (up to COPY_LONGEST tokens) that the context plus the block's tokens so far end
    with. The draft predicts a block's slots at once, so a word or identifier it has started
    it often cannot finish; the context often can (`cycle.copied_proposal`)."""

    tokens: list[int] = field(default_factory=list)
    # n-gram -> the latest two places it ended
    _ends: dict[tuple[int, ...], tuple[int, int]] = field(default_factory=dict)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.tokens.append(int(token))
            end = len(self.tokens) - 1
            for n in range(1, min(COPY_LONGEST, end + 1) + 1):
                key = tuple(self.tokens[end - n + 1:])
                self._ends[key] = (end, self._ends.get(key, (-1, -1))[0])

    def candidate(self, block: list[int]) -> int:
        """The token that followed the longest earlier n-gram the context + `block` ends
        with (the context's own end excluded: nothing followed it yet); -1 when none."""
        return self.match(block)[1]

    def match(self, block: list[int]) -> tuple[int, int]:
        """-> (n, `candidate`): the n-gram's length with it; (0, -1) when none."""
        tail = self.tokens[-COPY_LONGEST:] + block
        for n in range(min(COPY_LONGEST, len(tail)), 0, -1):
            for end in self._ends.get(tuple(tail[-n:]), ()):
                if 0 <= end < len(self.tokens) - 1:
                    return n, self.tokens[end + 1]
        return 0, -1
