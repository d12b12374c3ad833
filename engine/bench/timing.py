"""One timed generation (`Side`), the mlx-lm greedy baseline both benchmarks time DFlash
against, and where two token sequences first differ."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Side:
    """One timed generation: what it produced and how long it took."""

    tokens: list[int]
    elapsed_s: float  # prefill included
    prefill_s: float  # until the first token
    peak_memory_bytes: int
    finish_reason: str
    from_draft: int | None = None  # tokens an autoregressive draft proposed and the target kept

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # Same definition as GenerationResult: tokens after the first over time after it.
        decode_s = self.elapsed_s - self.prefill_s
        return (len(self.tokens) - 1) / decode_s if decode_s > 0 else 0.0

    def summary(self) -> dict:
        """The report's fields for this side (the tokens themselves are left out)."""
        return {
            "generated_tokens": len(self.tokens),
            "tokens_per_second": self.tokens_per_second,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "elapsed_s": self.elapsed_s,
            "prefill_s": self.prefill_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "finish_reason": self.finish_reason,
            **({} if self.from_draft is None else {"from_draft": self.from_draft}),
        }


def baseline_function(no_eos: bool) -> str:
    return "mlx_lm.generate.generate_step" if no_eos else "mlx_lm.stream_generate"


def run_baseline(model: Any, ids: list[int], max_tokens: int, prefill_step: int,
                 tokenizer: Any = None, sampler: Any = None, draft_model: Any = None,
                 num_draft_tokens: int = 2) -> Side:
    """Plain mlx-lm decoding: greedy (the reference DFlash must equal token for token), or
    with an mlx-lm `sampler` (make_sampler) at temperature > 0. With `draft_model`: mlx-lm's
    own speculative decoding, that autoregressive draft proposing `num_draft_tokens` a step.

    With a tokenizer: mlx_lm.stream_generate, which stops at EOS. Without one (--no-eos, or
    a synthetic model that has no tokenizer): generate_step (speculative_generate_step), what
    stream_generate wraps, for exactly `max_tokens`. Same prefill step as DFlash."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step, speculative_generate_step, stream_generate

    mx.reset_peak_memory()
    tokens: list[int] = []
    kept = 0
    first = None
    finish = "length"
    spec = ({} if draft_model is None else
            {"draft_model": draft_model, "num_draft_tokens": num_draft_tokens})
    start = time.perf_counter()
    if tokenizer is None:
        steps = (generate_step(mx.array(ids), model, max_tokens=max_tokens,
                               prefill_step_size=prefill_step, sampler=sampler)
                 if draft_model is None else
                 speculative_generate_step(mx.array(ids), model, max_tokens=max_tokens,
                                           prefill_step_size=prefill_step, sampler=sampler,
                                           **spec))
        for token, *rest in steps:
            first = first or time.perf_counter()
            tokens.append(int(token))
            kept += bool(rest[1]) if len(rest) > 1 else 0
    else:
        for resp in stream_generate(model, tokenizer, mx.array(ids), max_tokens,
                                    prefill_step_size=prefill_step, sampler=sampler, **spec):
            first = first or time.perf_counter()
            if resp.finish_reason == "stop":  # the EOS token itself is not output
                finish = "stop"
                break
            tokens.append(int(resp.token))
            kept += bool(resp.from_draft)
    end = time.perf_counter()
    return Side(tokens, end - start, (first or end) - start, int(mx.get_peak_memory()), finish,
                None if draft_model is None else kept)


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where `a` and `b` differ (the shorter one's length when one is a
    prefix of the other); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def versus(base: Side, flash: Side) -> dict:
    """A DFlash run against its baseline: end-to-end and decode speed-ups, token match."""
    mismatch = first_mismatch(base.tokens, flash.tokens)
    return {"speedup": flash.tokens_per_second / base.tokens_per_second,
            "decode_speedup": (flash.decode_tokens_per_second / base.decode_tokens_per_second
                               if base.decode_tokens_per_second else None),
            "token_match": mismatch is None, "first_mismatch": mismatch}


# Activations in these dtypes may round a near-tie differently in a batched verify than in
# 1-token decoding; a top-1 minus top-2 gap below NEAR_TIE_GAP is such a near-tie.
LOW_PRECISION = ("bfloat16", "float16")
NEAR_TIE_GAP = 0.25


def divergence(model: Any, ids: list[int], baseline: Sequence[int], other: Sequence[int],
               prefill_step: int) -> dict | None:
    """Where `other` first differs from the greedy `baseline` (None: nowhere), with the
    baseline's top-1 minus top-2 logit gap there. The baseline's decoding (generate_step, same
    prefill step) is replayed up to that token, untimed, so the gap is its own numerics'."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    index = first_mismatch(baseline, other)
    if index is None:
        return None
    found = {"index": index,
             "baseline_token": baseline[index] if index < len(baseline) else None,
             "dflash_token": other[index] if index < len(other) else None,
             "gap": None, "dflash_gap": None}
    steps = generate_step(mx.array(ids), model, max_tokens=index + 1,
                          prefill_step_size=prefill_step)
    for n, (_, logprobs) in enumerate(steps):
        if n == index:
            lp = logprobs.astype(mx.float32)  # logits minus a constant: the same gaps
            second, first = mx.sort(mx.topk(lp, 2)).tolist()
            found["gap"] = first - second
            if found["dflash_token"] is not None:
                found["dflash_gap"] = first - lp[found["dflash_token"]].item()
    return found


def near_tie(found: dict | None, dtype: str) -> bool:
    """Whether a divergence is allowed by the numerics policy: a near-tie with bf16/fp16
    activations. In float32 the output is bit-identical to plain decoding: none is."""
    return (found is not None and found["gap"] is not None and dtype in LOW_PRECISION
            and found["gap"] < NEAR_TIE_GAP)
