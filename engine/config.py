"""Engine settings: one plain dataclass, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

MIN_BLOCK_SIZE = 2
MAX_BLOCK_SIZE = 16


@dataclass
class DFlashConfig:
    # None: use the draft checkpoint's block_size (16 for the published drafts).
    draft_block_size: int | None = None
    # Pick each cycle's block size (2..draft_block_size) from the recent accepted runs.
    adaptive_block: bool = False
    # Verify drafts only up to the first one the draft gives less than this probability
    # (0 < p <= 1; None verifies the whole block). Shorter verifies pay off on CPU.
    min_draft_confidence: float | None = None
    # Prompt + max_tokens beyond this decodes with the target alone (stats say so).
    max_ctx: int = 16384
    # GatedDeltaNet rollback: replay the recorded tape (True) or re-run accepted steps.
    enable_tape_replay: bool = True
    # Prefill in chunks of this many tokens to bound peak memory.
    prefill_chunk: int = 512
    # "float32" | "bfloat16" | "float16" | None. None keeps an mlx-lm checkpoint's own dtype
    # (as mlx_lm.load does); the offline GGUF target is dequantized to float32 on CPU.
    dtype: str | None = None
    # Evaluate each cycle phase on its own for exact per-phase device times (benchmarks). Off,
    # phases overlap (async_eval) and the profile holds host-side times only.
    sync_phases: bool = False
    # "auto" picks a fused kernel for the backend when one is proven; "portable" never does.
    kernels: str = "auto"

    def __post_init__(self) -> None:
        bs = self.draft_block_size
        if bs is not None and not (MIN_BLOCK_SIZE <= bs <= MAX_BLOCK_SIZE):
            raise ConfigError(
                f"draft_block_size={bs} is out of range: use {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE} "
                "(or None for the checkpoint's own block size)"
            )
        if self.max_ctx < 16:
            raise ConfigError(f"max_ctx={self.max_ctx} is too small: use at least 16 tokens")
        if self.prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk={self.prefill_chunk} must be at least 1")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ConfigError(
                f"dtype={self.dtype!r} is not supported: use float32, bfloat16, float16 or None"
            )
        c = self.min_draft_confidence
        if c is not None and not 0.0 < c <= 1.0:
            raise ConfigError(f"min_draft_confidence={c}: use a probability in (0, 1], or None")
        if self.kernels not in ("auto", "portable"):
            raise ConfigError(f"kernels={self.kernels!r}: use 'auto' or 'portable'")
