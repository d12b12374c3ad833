"""Engine settings: one plain dataclass, validated once; engine/plan.py resolves its "auto"s."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .lookup import MIN_MATCH

MIN_BLOCK_SIZE = 2
MAX_BLOCK_SIZE = 16
DEFAULT_MIN_CONFIDENCE = 0.4
CPU_DRAFT_VOCAB = 8192
MIN_DRAFT_VOCAB = 256
CPU_COPY_ODDS = 0.1  # --copy-odds auto's odds where the verify cut is on
# --stream-verify auto's layer count on CUDA: the oracle-4 A/B on the H200 (benchmarks/stage33/)
# cost fewer plain steps a cycle at 2-4 than at 6, whose last chunk the device runs after the
# host has built everything
GPU_STREAM_EVERY = 4
PREFILL_CHUNK = 512  # prompts are prefilled in chunks of this many tokens (bounds peak memory)


@dataclass
class DFlashConfig:
    """The knobs a user turns; "auto" leaves the choice to `engine.plan.make_plan`, per device
    and pair. Per-call options (profiling) live on `generate`, the target's rollback options
    on the adapter (`engine.targets.adapter_for`)."""

    # None: use the draft checkpoint's block_size (16 for the published drafts).
    draft_block_size: int | None = None
    # Verify drafts only up to the first one the draft gives less than this probability
    # (0 < p <= 1; None verifies the whole block): a verify's cost grows with its length, and
    # a run rarely survives a draft the draft itself doubts. Lossless either way. The cut
    # costs a second host sync per cycle (the verify's length is read back before it runs).
    # "auto": DEFAULT_MIN_CONFIDENCE on the CPU, whole blocks on GPUs and Metal.
    min_draft_confidence: float | str | None = "auto"
    # With the cut on, verify the cheapest length at or above the cut's instead of exactly it:
    # a CPU's matmuls cost more at some token counts than at longer ones. Measured once per
    # target shape and machine, kept in the cache folder (engine/verify_lengths.py).
    # Lossless: the extra drafts are verified like any other. False: the cut's own length.
    padded_verify: bool = True
    # The draft proposes from its ranking's top K tokens plus the prompt's own (lossless: the
    # target verifies every proposal; a next token outside the subset only ends the accepted
    # run). Needs the draft's token_ranking.json; without one the full head is used. "auto":
    # CPU_DRAFT_VOCAB on CPU, the full head on GPUs until measured there. None: the full head.
    draft_vocab: int | str | None = "auto"
    # Where the context's last N tokens (N >= this) occurred before, a cycle proposes what
    # followed them (engine/lookup.py) instead of running the draft: replies repeat their
    # prompt and themselves, and there the repeat runs further than the draft reaches.
    # Lossless: the target verifies it like a draft. None: the draft proposes every cycle.
    lookup_min_match: int | None = MIN_MATCH
    # Queue each cycle's next draft forward before the cycle's one host sync, on the verify's
    # outputs still on the device, so that the device can draft while the host reads the
    # commit and builds the next verify (engine/cycle.py: DraftProposer.prefetch). Whole
    # blocks only; meant for GPUs and Metal, where a cycle waits on host work. "auto": on
    # CUDA. Lossless: the target verifies every proposal.
    prefetch_draft: bool | str = "auto"
    # Queue each target forward's work every N decoder layers while the host builds the rest
    # of its graph (mx.async_eval), so that the device starts on the first layers instead of
    # idling until the whole verify is built. "auto": every GPU_STREAM_EVERY layers on CUDA,
    # off on CPU and on Metal until measured there. The same graph either way: the output
    # does not change.
    stream_verify: int | str | None = "auto"
    # Finish greedy one-row draft proposals from the context (engine/cycle.py:
    # copied_proposal): slot by slot, the token that followed the longest earlier n-gram the
    # context and the block so far end with replaces the draft's top token where the draft
    # gives it at least these odds of that token's probability. "auto": CPU_COPY_ODDS on CPU
    # with the verify cut on, off otherwise. None: off. Lossless: the target verifies every
    # proposal.
    copy_odds: float | str | None = "auto"
    # Prompt + max_tokens beyond this decodes with the target alone (stats say so).
    max_ctx: int = 16384
    # Pause speculation where it does not pay (engine/pause.py): when the recent cycles'
    # tokens fall below their cost in plain steps, decode with the target alone (no draft
    # forward, no wide verify) and probe again after a back-off. The same output either way.
    # Off for sharded targets (each rank would time its own). False: speculate every cycle.
    pause_speculation: bool = True
    # Numerics policy. None: on GPUs and Metal the target runs as its checkpoint stores it
    # (an MLX checkpoint's bf16 or 4-bit weights as mlx_lm.load gives them; the SmolLM2 GGUF's
    # Q4_1/Q8_0 blocks as MLX affine 4/8-bit layers, float16 activations like its scales);
    # on the CPU it runs float32, the fast dtype there (quantized layers dequantized).
    # "float32" | "bfloat16" | "float16" overrides that: every float weight in that dtype
    # (quantized ones dequantized). The benchmark's baseline always runs the same weights.
    # Lossless: every token is the target's argmax as the verify forward computes it; fp32
    # output is bit-identical to plain decoding, lower precision may flip near-ties.
    dtype: str | None = None
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
        if not isinstance(self.pause_speculation, bool):
            raise ConfigError(f"pause_speculation={self.pause_speculation!r}: use True (pause "
                              "speculation where the draft does not pay) or False")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ConfigError(
                f"dtype={self.dtype!r} is not supported: use float32, bfloat16, float16 or None"
            )
        c = self.min_draft_confidence
        if c != "auto" and c is not None and (
                isinstance(c, str) or not 0.0 < c <= 1.0):
            raise ConfigError(f"min_draft_confidence={c!r}: use a probability in (0, 1], "
                              "'auto' or None (verify whole blocks)")
        if not isinstance(self.padded_verify, bool):
            raise ConfigError(f"padded_verify={self.padded_verify!r}: use True (verify the "
                              "measured fastest length at or above the cut's) or False")
        v = self.draft_vocab
        if v != "auto" and v is not None and (
                not isinstance(v, int) or isinstance(v, bool) or v < MIN_DRAFT_VOCAB):
            raise ConfigError(f"draft_vocab={v!r}: use a token count of at least "
                              f"{MIN_DRAFT_VOCAB}, 'auto' or None (the full vocabulary)")
        m = self.lookup_min_match
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 2):
            raise ConfigError(f"lookup_min_match={m!r}: use a token count of at least 2, or "
                              "None (no lookup: the draft proposes every cycle)")
        if self.prefetch_draft != "auto" and not isinstance(self.prefetch_draft, bool):
            raise ConfigError(f"prefetch_draft={self.prefetch_draft!r}: use True (queue the "
                              "next draft forward before each cycle's sync), False or 'auto'")
        co = self.copy_odds
        if co not in ("auto", None) and not in_unit_interval(co):
            raise ConfigError(f"copy_odds={co!r}: use odds in (0, 1], e.g. 0.1 (a context "
                              "token replaces the draft's where the draft gives it at least "
                              "that share of its top token's probability), 'auto' or None "
                              "(off)")
        sv = self.stream_verify
        if sv != "auto" and sv is not None and (
                not isinstance(sv, int) or isinstance(sv, bool) or sv < 1):
            raise ConfigError(f"stream_verify={sv!r}: use a layer count of at least 1 (queue "
                              "the forward's work every that many layers), 'auto' or None "
                              "(off)")
        if self.chat_template_args is not None and not isinstance(self.chat_template_args, dict):
            raise ConfigError(f"chat_template_args={self.chat_template_args!r}: use a dict of "
                              "template keyword arguments, e.g. {'enable_thinking': False}")
        pc = self.prompt_cache_bytes
        if pc != "auto" and (not isinstance(pc, int) or isinstance(pc, bool) or pc < 0):
            raise ConfigError(f"prompt_cache_bytes={pc!r}: use a byte count (0: off) or 'auto'")

def in_unit_interval(value: Any) -> bool:
    """Whether a setting is a number in (0, 1] (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The DFlashConfig flags `dflash generate` and `dflash benchmark` share."""
    p.add_argument("--block-size", type=int, default=None, help="2..16 (default: the draft's)")
    p.add_argument("--max-ctx", "--dflash-max-ctx", type=int, default=16384,
                   help="prompt + max tokens beyond this: the target alone (--dflash-max-ctx: "
                        "dflash-mlx's name)")
    p.add_argument("--min-confidence", type=confidence_arg, default="auto", metavar="P",
                   help="verify drafts only up to the first the draft gives probability < P; "
                        "'auto' (default): 0.4 on CPU, whole blocks on GPUs; 'off': whole "
                        "blocks")
    p.add_argument("--verify-padding", choices=["on", "off"], default="on",
                   help="with the verify cut on, verify the cheapest length at or above the "
                        "cut's, measured once per machine (default on); 'off': the cut's own")
    add_queueing_args(p)
    p.add_argument("--draft-vocab", type=vocab_arg, default="auto", metavar="auto|off|N",
                   help="the draft proposes from its N most frequent tokens (needs the draft's "
                        f"token_ranking.json) plus the prompt's; 'auto' (default): "
                        f"{CPU_DRAFT_VOCAB} on CPU, off on GPUs; 'off': the full vocabulary")
    p.add_argument("--lookup", type=lookup_arg, default=MIN_MATCH, metavar="N|off",
                   help="where the last N or more tokens occurred before in the prompt or "
                        "reply, propose what followed them instead of a draft forward "
                        f"(default {MIN_MATCH}); 'off': the draft every cycle")
    p.add_argument("--copy-odds", type=copy_odds_arg, default="auto", metavar="auto|P|off",
                   help="finish greedy draft proposals from the context: slot by slot, the "
                        "token that followed the longest earlier n-gram the reply so far "
                        "ends with replaces the draft's where the draft gives it at least P "
                        f"times its top token's probability; 'auto' (default): {CPU_COPY_ODDS} "
                        "on CPU with the verify cut on, off otherwise")
    p.add_argument("--pause", choices=["on", "off"], default="on",
                   help="pause speculation where the draft does not pay: the target alone "
                        "until a probe says it pays again, the same output (default on)")
    p.add_argument("--chat-template-args", type=json_object_arg, default=None, metavar="JSON",
                   help="JSON object passed to the chat template, e.g. "
                        "'{\"enable_thinking\": false}'")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="target dtype, weights dequantized (default: the checkpoint's own "
                        "precision on a GPU, e.g. the GGUF's 4-bit blocks; float32 on CPU)")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy (the target's argmax), the lossless default
    top_p: float = 1.0  # keep the most likely tokens up to this total probability; 1: off
    top_k: int = 0  # keep the k most likely tokens; 0: off
    min_p: float = 0.0  # keep tokens at least this fraction of the top one's probability; 0: off
    seed: int | None = None  # None: a fresh seed per call

    def __post_init__(self) -> None:
        checks = (
            ("temperature", self.temperature, self.temperature >= 0, "0 (greedy) or more"),
            ("top_p", self.top_p, 0 < self.top_p <= 1, "a probability in (0, 1]"),
            ("top_k", self.top_k, isinstance(self.top_k, int) and self.top_k >= 0,
             "a whole number, 0 for off"),
            ("min_p", self.min_p, 0 <= self.min_p < 1, "a fraction in [0, 1)"),
        )
        for name, value, ok, expected in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok:
                raise ConfigError(f"{name}={value!r} is invalid. Fix: use {expected}.")
        if self.seed is not None and (isinstance(self.seed, bool)
                                      or not isinstance(self.seed, int)):
            raise ConfigError(f"seed={self.seed!r} is invalid. Fix: use a whole number.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def add_distributed_arg(p: argparse.ArgumentParser) -> None:
    """`--distributed [BACKEND]` of `dflash generate` and `dflash serve` (engine/distributed.py)."""
    p.add_argument("--distributed", nargs="?", const="any", default=None, metavar="BACKEND",
                   help="shard the target over the ranks mlx.launch started (backend: any, "
                        "ring, jaccl, mpi, nccl; default any); rank 0 prints or serves, the "
                        "others follow it. See the README's sharded targets")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The per-call sampling flags (`generate(..., temperature=, top_p=, top_k=, min_p=,
    seed=)`); checked by SamplingParams."""
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy, exact; above 0: sample, with the target's own "
                        "distribution kept by speculative sampling")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus filter (1: off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0: off)")
    p.add_argument("--min-p", type=float, default=0.0,
                   help="drop tokens under this fraction of the top one's probability (0: off)")
    p.add_argument("--seed", type=int, default=None, help="repeatable sampling")


def add_queueing_args(p: argparse.ArgumentParser) -> None:
    """The flags for work queued before the host needs it (also `dflash benchmark
    --synthetic`'s)."""
    p.add_argument("--prefetch-draft", choices=["auto", "on", "off"], default="auto",
                   help="queue the next cycle's draft forward before the cycle's host sync "
                        "(whole blocks: on a CPU add --min-confidence off); 'auto' "
                        "(default): on CUDA GPUs, off on CPU and Metal")
    p.add_argument("--stream-verify", type=stream_arg, default="auto", metavar="auto|N|off",
                   help="queue each target forward's work every N layers while the rest of "
                        "its graph is built, so a GPU starts early; 'auto' (default): "
                        f"{GPU_STREAM_EVERY} on CUDA GPUs, off on CPU and Metal")


def queueing_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """add_queueing_args' flags as DFlashConfig fields."""
    return {"prefetch_draft": on_off_auto(args.prefetch_draft),
            "stream_verify": args.stream_verify}


def sampling_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """add_sampling_args' flags as generate() keyword arguments."""
    return {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
            "min_p": args.min_p, "seed": args.seed}


def config_from_args(args: argparse.Namespace, **more: Any) -> DFlashConfig:
    """DFlashConfig from add_engine_args' flags (plus `more` fields); raises ConfigError."""
    return DFlashConfig(draft_block_size=args.block_size, max_ctx=args.max_ctx,
                        dtype=args.dtype,
                        min_draft_confidence=args.min_confidence,
                        padded_verify=args.verify_padding == "on",
                        **queueing_from_args(args),
                        draft_vocab=args.draft_vocab, lookup_min_match=args.lookup,
                        copy_odds=args.copy_odds, pause_speculation=args.pause == "on",
                        chat_template_args=args.chat_template_args, **more)


def _auto_off_or(text: str, parse: Callable[[str], Any], valid: Callable[[Any], bool],
                 expected: str, auto: bool = True) -> Any:
    """'auto' -> 'auto' (where `auto`), 'off' -> None, else parse(text) if valid: the shape of
    the flags below."""
    if text == "off" or (auto and text == "auto"):
        return None if text == "off" else text
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        choices = "'auto' or 'off'" if auto else "or 'off'"
        raise argparse.ArgumentTypeError(f"{text!r}: give {expected}, {choices}")
    return value


def confidence_arg(text: str) -> float | str | None:
    """argparse type for --min-confidence: a probability, 'auto' or 'off'."""
    return _auto_off_or(text, float, in_unit_interval, "a probability in (0, 1]")


def vocab_arg(text: str) -> int | str | None:
    """argparse type for --draft-vocab: a token count, 'auto' or 'off'."""
    return _auto_off_or(text, int, lambda v: v >= MIN_DRAFT_VOCAB,
                        f"a token count of at least {MIN_DRAFT_VOCAB}")


def _count_or_off(text: str, least: int, what: str) -> int | None:
    """'off' -> None, else a whole number of at least `least` (`what` it counts)."""
    if text == "off":
        return None
    if not text.isdigit() or int(text) < least:
        raise argparse.ArgumentTypeError(f"{text!r}: give a {what} count of at least {least}, "
                                         "or 'off'")
    return int(text)


def on_off_auto(choice: str) -> bool | str:
    """An on|off|auto flag's value as a config field takes it: True, False or "auto"."""
    return {"on": True, "off": False}.get(choice, choice)


def copy_odds_arg(text: str) -> float | str | None:
    """argparse type for --copy-odds: odds in (0, 1], 'auto' or 'off'."""
    return _auto_off_or(text, float, in_unit_interval, "odds in (0, 1], e.g. 0.1")


def lookup_arg(text: str) -> int | None:
    """argparse type for --lookup: a match length of at least 2, or 'off'."""
    return _count_or_off(text, 2, "token")


def stream_arg(text: str) -> int | str | None:
    """argparse type for --stream-verify: a layer count of at least 1, 'auto' or 'off'."""
    return _auto_off_or(text, int, lambda v: v >= 1, "a layer count of at least 1")


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
