"""Engine settings: one plain dataclass, validated once."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

MIN_BLOCK_SIZE = 2
MAX_BLOCK_SIZE = 16
DEFAULT_MIN_CONFIDENCE = 0.4
CPU_DRAFT_VOCAB = 8192
MIN_DRAFT_VOCAB = 256


@dataclass
class DFlashConfig:
    # None: use the draft checkpoint's block_size (16 for the published drafts).
    draft_block_size: int | None = None
    # Pick each cycle's block size (2..draft_block_size) from the recent accepted runs.
    adaptive_block: bool = False
    # Verify drafts only up to the first one the draft gives less than this probability
    # (0 < p <= 1; None verifies the whole block). "auto": DEFAULT_MIN_CONFIDENCE on every
    # backend: a verify's cost grows with its length, and a run rarely survives a draft the
    # draft itself doubts. Measured with the SmolLM2 pair, MT-Bench / HumanEval / GSM8K: 2-core
    # CPU (stage-3 draft) 0.73x -> 0.91x, 0.84x -> 0.94x, 0.94x -> 1.05x; H200 (stage-4 draft)
    # 0.52x -> 0.73x, 0.69x -> 0.70x, 0.63x -> 0.80x. Metal follows, unmeasured.
    min_draft_confidence: float | str | None = "auto"
    # The draft proposes from its ranking's top K tokens plus the prompt's own (lossless: the
    # target verifies every proposal; a next token outside the subset only ends the accepted
    # run). Needs the draft's token_ranking.json; without one the full head is used. "auto":
    # CPU_DRAFT_VOCAB on CPU, where the full head costs twice the draft's layers (SmolLM2:
    # 28 ms vs 14 ms per cycle; top 8192 + prompt tokens cover ~99% of answer tokens), the
    # full head on GPUs until measured there. None: the full head.
    draft_vocab: int | str | None = "auto"
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
    # Bytes of recent conversation states (target + draft caches) kept for reuse across turns;
    # "auto": an eighth of the machine's memory, at most 8 GiB; 0 turns reuse off.
    prompt_cache_bytes: int | str = "auto"
    # Keyword arguments for the chat template of every chat prompt (e.g. {"enable_thinking":
    # false}); a call's own chat_template_args are merged over them.
    chat_template_args: dict | None = None

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
        if c != "auto" and c is not None and (
                isinstance(c, str) or not 0.0 < c <= 1.0):
            raise ConfigError(f"min_draft_confidence={c!r}: use a probability in (0, 1], "
                              "'auto' or None (verify whole blocks)")
        v = self.draft_vocab
        if v != "auto" and v is not None and (
                not isinstance(v, int) or isinstance(v, bool) or v < MIN_DRAFT_VOCAB):
            raise ConfigError(f"draft_vocab={v!r}: use a token count of at least "
                              f"{MIN_DRAFT_VOCAB}, 'auto' or None (the full vocabulary)")
        if self.chat_template_args is not None and not isinstance(self.chat_template_args, dict):
            raise ConfigError(f"chat_template_args={self.chat_template_args!r}: use a dict of "
                              "template keyword arguments, e.g. {'enable_thinking': False}")
        pc = self.prompt_cache_bytes
        if pc != "auto" and (not isinstance(pc, int) or isinstance(pc, bool) or pc < 0):
            raise ConfigError(f"prompt_cache_bytes={pc!r}: use a byte count (0: off) or 'auto'")
        if self.kernels not in ("auto", "portable"):
            raise ConfigError(f"kernels={self.kernels!r}: use 'auto' or 'portable'")

    def min_confidence_for(self, backend: str) -> float | None:
        """The verify cut for a backend ("cpu", "cuda", "metal"), "auto" resolved."""
        if self.min_draft_confidence == "auto":
            return DEFAULT_MIN_CONFIDENCE
        return self.min_draft_confidence  # type: ignore[return-value]

    def draft_vocab_for(self, backend: str, has_ranking: bool) -> int | None:
        """The draft's top-K token count for a backend, "auto" resolved; None: full head."""
        if not has_ranking:
            return None
        if self.draft_vocab == "auto":
            return CPU_DRAFT_VOCAB if backend == "cpu" else None
        return self.draft_vocab  # type: ignore[return-value]


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The DFlashConfig flags `dflash generate` and `dflash benchmark` share."""
    p.add_argument("--block-size", type=int, default=None, help="2..16 (default: the draft's)")
    p.add_argument("--max-ctx", "--dflash-max-ctx", type=int, default=16384,
                   help="prompt + max tokens beyond this: the target alone (--dflash-max-ctx: "
                        "dflash-mlx's name)")
    p.add_argument("--adaptive-block", action="store_true",
                   help="size each cycle's block from recent acceptance (up to --block-size)")
    p.add_argument("--min-confidence", type=confidence_arg, default="auto", metavar="P",
                   help="verify drafts only up to the first the draft gives probability < P; "
                        "'auto' (default): 0.4; 'off': whole blocks")
    p.add_argument("--draft-vocab", type=vocab_arg, default="auto", metavar="auto|off|N",
                   help="the draft proposes from its N most frequent tokens (needs the draft's "
                        f"token_ranking.json) plus the prompt's; 'auto' (default): "
                        f"{CPU_DRAFT_VOCAB} on CPU, off on GPUs; 'off': the full vocabulary")
    p.add_argument("--chat-template-args", type=json_object_arg, default=None, metavar="JSON",
                   help="JSON object passed to the chat template, e.g. "
                        "'{\"enable_thinking\": false}'")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="target dtype (default: the checkpoint's own; the GGUF target: "
                        "float32, the fast one on CPU)")


def config_from_args(args: argparse.Namespace, **more: Any) -> DFlashConfig:
    """DFlashConfig from add_engine_args' flags (plus `more` fields); raises ConfigError."""
    return DFlashConfig(draft_block_size=args.block_size, max_ctx=args.max_ctx,
                        dtype=args.dtype, adaptive_block=args.adaptive_block,
                        min_draft_confidence=args.min_confidence,
                        draft_vocab=args.draft_vocab,
                        chat_template_args=args.chat_template_args, **more)


def _auto_off_or(text: str, parse: Callable[[str], Any], valid: Callable[[Any], bool],
                 expected: str) -> Any:
    """'auto' -> 'auto', 'off' -> None, else parse(text) if valid: the shape of the flags below."""
    if text in ("auto", "off"):
        return None if text == "off" else text
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give {expected}, 'auto' or 'off'")
    return value


def confidence_arg(text: str) -> float | str | None:
    """argparse type for --min-confidence: a probability, 'auto' or 'off'."""
    return _auto_off_or(text, float, lambda v: 0.0 < v <= 1.0, "a probability in (0, 1]")


def vocab_arg(text: str) -> int | str | None:
    """argparse type for --draft-vocab: a token count, 'auto' or 'off'."""
    return _auto_off_or(text, int, lambda v: v >= MIN_DRAFT_VOCAB,
                        f"a token count of at least {MIN_DRAFT_VOCAB}")


def json_object_arg(text: str) -> dict:
    """argparse type for --chat-template-args: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            "must be a JSON object, e.g. '{\"enable_thinking\": false}'"
        )
    return value
