"""The autoregressive draft of `dflash benchmark --ar-draft`: mlx-lm's own speculative
decoding (a small model of the target's tokenizer proposes K tokens, the target checks them in
one forward), the alternative an MLX user has. It runs on the benchmark's loaded target, under
the same numerics policy (the same dtype asked for, or the machine's default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .suites import BenchError

DEFAULT_KS = (2, 3, 4, 5, 6)
MAX_K = 32


@dataclass
class ArDraft:
    name: str  # as the user gave it
    resolved: str
    model: Any  # an mlx-lm model
    ks: tuple[int, ...]  # num_draft_tokens values, one benchmark row each

    def describe(self) -> dict:
        from ..loading import quantization
        from ..runtime import target_model_dtype

        return {"model": self.name, "resolved": self.resolved,
                "dtype": str(target_model_dtype(self.model)).removeprefix("mlx.core."),
                "quantization": quantization(self.model), "num_draft_tokens": list(self.ks),
                "function": "mlx_lm.stream_generate(draft_model=..., num_draft_tokens=K)"}


def parse_ks(text: str) -> tuple[int, ...]:
    """"3", "2,4,6" or "2-6" -> the Ks, sorted and distinct."""
    ks: set[int] = set()
    try:
        for item in filter(None, (x.strip() for x in text.split(","))):
            low, _, high = item.partition("-")
            ks.update(range(int(low), int(high or low) + 1))
    except ValueError:
        ks = set()
    if not ks or min(ks) < 1 or max(ks) > MAX_K:
        raise BenchError(f"--num-draft-tokens {text!r}: give K from 1 to {MAX_K}, e.g. 3, "
                         "2,4 or 2-6.")
    return tuple(sorted(ks))


def load_ar_draft(name: str, rt: Any, ks: tuple[int, ...] = DEFAULT_KS) -> ArDraft:
    """`name` (a folder, hub id, .gguf file or offline model such as qwen2.5-coder-0.5b),
    loaded as the runtime's target was, checked to share its tokenizer."""
    from ..loading import load_target

    model, tokenizer, resolved = load_target(name, rt.config.dtype)
    check_same_tokenizer(rt.tokenizer, tokenizer, name)
    return ArDraft(name, resolved, model, ks)


def check_same_tokenizer(target: Any, draft: Any, name: str) -> None:
    """mlx-lm's speculative decoding compares token ids: both must mean the same text."""
    a, b = (getattr(t, "_tokenizer", t) for t in (target, draft))
    if a.get_vocab() != b.get_vocab():
        raise BenchError(f"--ar-draft {name}: its tokenizer differs from the target's, so its "
                         "token ids mean other text. Fix: pick a smaller model of the target's "
                         "own family (e.g. Qwen2.5-Coder-0.5B for Qwen2.5-Coder-1.5B).")
