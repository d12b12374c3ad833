"""An oracle proposer for cost benchmarks: the target's own continuation, wrong at a drawn
place, so the mean tokens/cycle is chosen and not the draft's quality.

The reference must be what the verify forward itself chooses. In float32 that is plain
greedy decoding (bit-identical); in bf16, fp16 or quantized runs a batched verify may round a
near-tie the other way, after which a reference from plain decoding no longer matches
anything and tokens/cycle collapses. `consistent_reference` therefore records speculative
runs with the oracle until one reproduces its own reference (a fixed point), so tokens/cycle
is set by the oracle in every dtype.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import mlx.core as mx

from ..cycle import DraftProposer
from ..draft import DFlashDraft
from ..draft_head import DraftHead
from ..plan import Plan
from ..targets.base import TargetAdapter

RECORD_ROUNDS = 6  # speculative runs that may be needed to reach the fixed point
ROUND = 8  # cycles whose drawn counts add up to exactly ROUND x (tokens_per_cycle - 1)


class Oracle:
    """Proposals that match `reference` (the tokens after the prefill's, in order: index 0
    is the prefill's token) for a drawn number of drafts, then one wrong token. Accept
    counts follow Binomial(B-1, p) with p chosen so the mean is tokens_per_cycle - 1 (capped
    by the cycle's size), drawn in rounds of ROUND stratified quantiles whose sum is exact:
    a run's mean is the chosen one, not one seed's luck (the same seed serves every prompt).
    Positions count from the first call (the prefill's token staged)."""

    def __init__(self, reference: Sequence[int], tokens_per_cycle: float, block_size: int,
                 vocab: int, seed: int = 0) -> None:
        self.reference = list(reference)
        self.block_size, self.vocab = block_size, vocab
        self.rng = random.Random(seed)
        self.p = min(max((tokens_per_cycle - 1) / (block_size - 1), 0.0), 1.0)
        n = block_size - 1  # the accept counts' distribution function, Binomial(n, p)
        self._cdf = list(accumulate(math.comb(n, k) * self.p ** k * (1 - self.p) ** (n - k)
                                    for k in range(n + 1)))
        self._drawn: list[int] = []  # what is left of the current round
        self._rounds = self._total = 0  # rounds drawn, and their counts' sum
        self.base: int | None = None  # the first position

    def __call__(self, staged: int, size: int, position: int) -> list[int]:
        """-> the verify input: `staged`, then size - 1 drafted tokens."""
        if self.base is None:
            self.base = position
        emitted = position - self.base + 1  # staged is reference[emitted - 1]
        a = self._accepts(size)
        drafted = self.reference[emitted:emitted + size - 1]
        drafted += [0] * (size - 1 - len(drafted))  # past the reference: any token will do
        if a < size - 1:
            drafted[a] = (drafted[a] + 1) % self.vocab  # the target's argmax differs here
        return [staged] + drafted

    def _accepts(self, size: int) -> int:
        """The next cycle's drawn count of right drafts (the wrong one follows them)."""
        if not self._drawn:
            self._drawn = self._round()
        return min(self._drawn.pop(), size - 1)

    def _round(self) -> list[int]:
        """ROUND counts: Binomial(B-1, p) quantiles at one stratified point per 1/ROUND of
        probability, nudged by ones until all rounds' sum is the nearest integer to their
        count x the mean, in a drawn order."""
        n = self.block_size - 1
        points = [(j + self.rng.random()) / ROUND for j in range(ROUND)]
        counts = [next((k for k, c in enumerate(self._cdf) if c >= u), n) for u in points]
        self._rounds += 1  # the sum so far stays the nearest integer to the mean's
        want = round(self._rounds * ROUND * n * self.p) - self._total
        self._total += want
        while (gap := want - sum(counts)) != 0:
            step = 1 if gap > 0 else -1
            movable = [i for i, c in enumerate(counts) if 0 <= c + step <= n]
            counts[self.rng.choice(movable)] += step
        self.rng.shuffle(counts)
        return counts


class OracleProposer(DraftProposer):
    """The oracle's tokens in place of the draft's; whole blocks. With `draft_cost`, the real
    draft forward still runs every cycle (its output is discarded) so its cost is timed."""

    def __init__(self, target: TargetAdapter, draft: DFlashDraft, oracle: Oracle,
                 draft_cost: bool = True, head: DraftHead | None = None,
                 cache: list[Any] | None = None, prefetch: bool = False) -> None:
        super().__init__(target, draft, head, Plan(prefetch=prefetch and draft_cost),
                         cache or [])
        self.oracle, self.draft_cost = oracle, draft_cost

    def propose(self, staged: int, size: int, position: int) -> mx.array:
        if self.draft_cost:
            mx.async_eval(super().propose(staged, size, position))  # queued with the verify
        return mx.array([self.oracle(staged, size, position)])


def consistent_reference(run: Callable[[list[int]], list[int]], reference: Sequence[int]
                         ) -> tuple[list[int], int]:
    """Re-run `run(reference) -> committed tokens` (an oracle run on that reference) until
    its output is its reference -> (that reference, the runs it took). Each run keeps the
    agreed prefix and moves the first near-tie flip further; the last output is returned
    even when RECORD_ROUNDS runs do not settle."""
    reference = list(reference)
    for rounds in range(1, RECORD_ROUNDS + 1):
        got = run(reference)
        if got == reference:
            return reference, rounds
        reference = got
    return reference, RECORD_ROUNDS
