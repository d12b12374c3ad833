"""What the engine streams to callers: plain frozen dataclasses, no MLX types."""

from __future__ import annotations

from dataclasses import dataclass, field


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def acceptance_rate(speculative: bool, cycles: int, tokens: int) -> float:
    """accepted / generated = 1 - cycles / tokens, as dflash-mlx reports it."""
    if not speculative or tokens == 0:
        return 0.0
    return max(0.0, 1.0 - cycles / tokens)


@dataclass(frozen=True)
class CycleStats:
    """One draft -> verify -> accept cycle."""

    index: int
    block_size: int  # tokens verified (staged + drafted)
    accepted: int  # drafted tokens the target agreed with
    draft_s: float
    verify_s: float
    rollback_s: float
    looked_up: bool = False  # proposed by the suffix lookup (engine/lookup.py), not the draft
    paused: bool = False  # speculation paused (engine/pause.py): the target alone, or a lookup

    @property
    def committed(self) -> int:
        """Tokens this cycle produced: the accepted draft tokens plus the target's bonus."""
        return self.accepted + 1


@dataclass
class Commit:
    """What one cycle of the decode loop (engine/cycle.py) commits."""

    tokens: list[int]
    n_draft: int  # leading tokens that came from the draft
    cycle: CycleStats | None = None


@dataclass(frozen=True)
class RunningStats:
    """Totals so far in one generation, for live displays."""

    prompt_tokens: int
    generated: int
    cycles: int
    elapsed_s: float  # since the request started (prefill included)
    decode_s: float  # since the first token
    ttft_s: float
    prefill_tokens_per_second: float
    ctx_used: int
    max_ctx: int
    peak_memory_bytes: int
    speculative: bool
    cached_tokens: int = 0  # prompt tokens resumed from the conversation cache, not prefilled
    lookup_cycles: int = 0  # cycles the suffix lookup proposed (the draft the others)
    paused: bool = False  # speculation is paused now: the draft was not paying (pause.py)
    pauses: int = 0  # times this reply paused speculation so far
    paused_tokens: int = 0  # tokens decoded while paused (the target alone)

    @property
    def tokens_per_second(self) -> float:
        return ratio(self.generated, self.elapsed_s)

    @property
    def decode_tokens_per_second(self) -> float:
        # Tokens after the first over the time after the first.
        return ratio(self.generated - 1, self.decode_s)

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.speculative, self.cycles, self.generated)

    @property
    def tokens_per_cycle(self) -> float:
        # The first token comes from prefill, not from a cycle.
        return ratio(self.generated - 1, self.cycles)


@dataclass(frozen=True)
class Span:
    """Tokens committed together. The first `n_draft` were proposed by the draft and
    confirmed by the target; the rest are the target's own (bonus / first token)."""

    tokens: tuple[int, ...]
    n_draft: int
    text: str  # the text these tokens add (may lag a token for multi-byte characters)
    draft_text: str  # the prefix of `text` that the draft tokens produced
    stats: RunningStats
    cycle: CycleStats | None = None  # None for the prefill token and plain decoding

    @property
    def target_text(self) -> str:
        return self.text[len(self.draft_text):]


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS) | "length" | "cancelled"
    speculative: bool  # False when decoded by the target alone
    fallback_reason: str | None  # why speculation was off, if it was
    block_size: int
    elapsed_s: float
    prefill_s: float
    ttft_s: float
    decode_s: float
    peak_memory_bytes: int
    cycle_tokens: list[int] = field(default_factory=list)  # tokens per cycle, in order
    cycle_profile: dict[str, float] = field(default_factory=dict)  # summed seconds by phase
    cached_tokens: int = 0  # prompt tokens resumed from the conversation cache (0: fresh)
    lookup_cycles: int = 0  # cycles the suffix lookup proposed (the draft the others)
    pauses: int = 0  # times speculation paused (engine/pause.py: the draft was not paying)
    paused_tokens: int = 0  # tokens decoded while paused (the target alone, or lookups)
    pause_reason: str | None = None  # why it last paused (tokens/cycle vs cycle cost)

    @property
    def total_tokens(self) -> int:
        return len(self.tokens)

    @property
    def cycles(self) -> int:
        return len(self.cycle_tokens)

    @property
    def tokens_per_second(self) -> float:
        return ratio(self.total_tokens, self.elapsed_s)

    @property
    def decode_tokens_per_second(self) -> float:
        return ratio(self.total_tokens - 1, self.decode_s)

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.speculative, self.cycles, self.total_tokens)

    @property
    def tokens_per_cycle(self) -> float:
        return ratio(sum(self.cycle_tokens), len(self.cycle_tokens))


@dataclass(frozen=True)
class Finished:
    """Last event of a stream."""

    result: GenerationResult
