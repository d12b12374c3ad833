"""Loop-aware draft metrics. Greedy replies of small targets often fall into loops, and a
loop is trivial to draft, so tokens/cycle over a loop flatters the draft. Pure Python."""

from __future__ import annotations

from collections.abc import Sequence

LOOP_WINDOW = 64
LOOP_THRESHOLD = 0.5

DEFINITIONS = {
    "repeat4_share": (
        "share of the 4-grams of the generated tokens that already occurred earlier in the "
        "same sequence (0 = no repeats, close to 1 = one long loop)"
    ),
    "loop_start": (
        f"first token position p (0-based, in the generated tokens) where the repeat4_share of "
        f"the trailing window tokens[max(0, p-{LOOP_WINDOW - 1}) : p+1] ({LOOP_WINDOW} tokens, "
        f"fewer at the start) exceeds {LOOP_THRESHOLD}; null when no window does"
    ),
    "tokens_per_cycle_nonloop": (
        "tokens/cycle over the cycles whose committed tokens all lie before loop_start (token 0 "
        "comes from prefill, cycle k commits positions 1+sum(earlier cycles) onwards); every "
        "cycle counts when there is no loop; null when no cycle qualifies"
    ),
}


def repeated_ngrams(tokens: Sequence[int], n: int = 4) -> list[bool]:
    """For each n-gram of `tokens` in order (the i-th ends at token i + n - 1): whether it
    already occurred earlier in the same sequence."""
    seen: set[tuple[int, ...]] = set()
    flags = []
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        flags.append(gram in seen)
        seen.add(gram)
    return flags


def repeated_ngram_share(tokens: Sequence[int], n: int = 4) -> float:
    """Share of the n-grams of `tokens` that already occurred earlier in the same sequence."""
    flags = repeated_ngrams(tokens, n)
    return sum(flags) / len(flags) if flags else 0.0


def loop_start(tokens: Sequence[int], window: int = LOOP_WINDOW,
               threshold: float = LOOP_THRESHOLD, n: int = 4) -> int | None:
    """First position p where the trailing window ending at p has repeated_ngram_share above
    `threshold` (see DEFINITIONS["loop_start"]); None when the sequence never loops."""
    for p in range(n, len(tokens)):
        if repeated_ngram_share(tokens[max(0, p - window + 1):p + 1], n) > threshold:
            return p
    return None


def split_at_loop(cycle_tokens: Sequence[int], start: int | None
                  ) -> tuple[list[int], list[int]]:
    """A reply's cycles (tokens each) -> (those that end before the loop starting at `start`,
    the rest: a cycle reaching into the loop counts as the loop's); all before when start is
    None."""
    if start is None:
        return list(cycle_tokens), []
    position = 1  # position 0 is the prefill token
    for i, committed in enumerate(cycle_tokens):
        if position + committed > start:  # this cycle reaches into the loop
            return list(cycle_tokens[:i]), list(cycle_tokens[i:])
        position += committed
    return list(cycle_tokens), []


def nonloop_tokens_per_cycle(cycle_tokens: Sequence[int], start: int | None) -> float | None:
    """Tokens/cycle over the cycles that end before `start` (all cycles when start is None)."""
    kept, _ = split_at_loop(cycle_tokens, start)
    return sum(kept) / len(kept) if kept else None


def lookup_cycle_share(runs: Sequence[dict]) -> float:
    """Looked-up cycles over all cycles of runs holding `lookup_cycles` and `cycles`."""
    return sum(r["lookup_cycles"] for r in runs) / max(1, sum(r["cycles"] for r in runs))
