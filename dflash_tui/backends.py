"""What the worker drives: a tiny protocol with the real DFlash engine and a deterministic fake.

The real backend imports `engine` only when `load` runs, which happens on the worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from dflash_tui.firstrun import fetch_offline_model, offline_key
from engine.errors import DFlashError  # no MLX: errors is plain Python

Progress = Callable[[str, "float | None"], None]


class Backend(Protocol):
    def load(
        self, model: str | None, draft: str | None, block_size: int, progress: Progress
    ) -> dict:
        """Load a pair; returns describe(). Raises with a user-readable message on failure."""

    def stream(
        self, prompt: list[dict[str, str]], max_tokens: int, block_size: int,
        sampling: dict[str, Any] | None = None,
    ) -> Iterator[Any]:
        """Yield engine.events.Span objects then one Finished; close() the iterator to stop.
        `sampling`: generate()'s temperature/top_p/top_k/min_p/seed keywords ({}: greedy)."""


class ContextTooLong(DFlashError):
    """The conversation no longer fits the model's context window."""


def check_context(prompt_tokens: int, max_ctx: int) -> None:
    """Refuse a prompt that leaves no room for a reply, saying what to do instead."""
    if prompt_tokens >= max_ctx:
        raise ContextTooLong(
            f"This conversation is {prompt_tokens} tokens, more than the model's context "
            f"window (max_ctx {max_ctx}), so there is no room for a reply. Your message is "
            "saved. Start a new chat (Ctrl+N), or export this one (Ctrl+E) and paste the part "
            "that matters into a new chat."
        )


def user_message(exc: BaseException) -> str:
    """The text to show for an engine error: DFlashError messages are already written for users."""
    if isinstance(exc, DFlashError | ValueError | FileNotFoundError):
        return str(exc)
    return (
        f"The engine failed with {type(exc).__name__}: {exc}. Your chat is saved; try another "
        "model pair (F2) or a smaller max tokens (F5). Details are in the log file."
    )


class RealBackend:
    def __init__(self, max_ctx: int | None = None, distributed: str | None = None) -> None:
        self.rt: Any = None
        self.max_ctx = max_ctx  # None: the engine's default
        self.distributed = distributed  # a backend name: the target is sharded over ranks

    def load(
        self, model: str | None, draft: str | None, block_size: int, progress: Progress
    ) -> dict:
        key = offline_key(model)
        if key is not None:
            # First use: fetch the target in a child process so pip never draws on the screen.
            fetch_offline_model(progress, key=key)
        from engine import DFlashConfig, DFlashRuntime  # imports MLX: worker thread only

        more = {} if self.max_ctx is None else {"max_ctx": self.max_ctx}
        config = DFlashConfig(draft_block_size=block_size or None, **more)
        if self.distributed:  # the other ranks load the same pair (engine/distributed.py)
            from engine.distributed import announce_load

            self.rt = None
            announce_load(model or None, draft or None, config, self.distributed)
        self.rt = DFlashRuntime.from_pretrained(
            model=model or None, draft=draft or None, config=config, progress=progress,
            distributed=self.distributed or False,
        )
        return dict(self.rt.describe())

    def close(self) -> None:
        """Let a sharded target's other ranks exit (called once, as the app exits)."""
        if self.rt is not None:
            self.rt.close_followers()

    def stream(
        self, prompt: list[dict[str, str]], max_tokens: int, block_size: int,
        sampling: dict[str, Any] | None = None,
    ) -> Iterator[Any]:
        check_context(len(self.rt.encode(prompt)), self.rt.config.max_ctx)
        # block_size 0 means the draft's own; the engine takes it and sampling per call.
        return self.rt.stream_generate(prompt, max_tokens=max_tokens,
                                       block_size=block_size or None, **(sampling or {}))


FAKE_REPLY = (
    "Speculative decoding lets a small **draft** model propose a block of tokens that the "
    "**target** model verifies in one pass.\n\n"
    "- accepted tokens are free\n- the target adds one bonus token per cycle\n\n"
    "```python\nprint('lossless')\n```\n"
)


class FakeBackend:
    """Deterministic stand-in: same prompt -> same spans and stats, no clocks, no MLX.

    `delay` sleeps between spans (to test streaming and cancellation); `reply` overrides the
    text; `load_error`, when given, is raised by every load (a pair that cannot be loaded);
    `pattern` is the tokens each cycle commits, repeated; `fallback` makes every reply run on
    the target alone for that reason, as the engine does past max_ctx; from cycle `paused_from`
    on, speculation pauses (one token a cycle, the target alone), as engine/pause.py does
    where the draft does not pay.
    """

    def __init__(
        self,
        delay: float = 0.0,
        reply: str | None = None,
        load_delay: float = 0.0,
        load_error: Exception | None = None,
        pattern: list[int] | None = None,
        fallback: str | None = None,
        max_ctx: int = 16384,
        paused_from: int | None = None,
    ):
        self.delay = delay
        self.reply = reply
        self.load_delay = load_delay
        self.load_error = load_error
        # Fixed acceptance pattern so snapshots are stable: 3, 1, 4, 2, 5 ... tokens per cycle.
        self.pattern = pattern or [3, 1, 4, 2, 5, 1, 3]
        self.fallback = fallback
        self.max_ctx = max_ctx
        self.paused_from = paused_from
        self.info: dict = {}
        self.block_size = 4
        self.held: list[dict[str, str]] = []  # the last conversation, as the engine caches it

    def load(
        self, model: str | None, draft: str | None, block_size: int, progress: Progress
    ) -> dict:
        for step in range(5):
            progress(f"Loading {model or 'default pair'}", step / 4)
            if self.load_delay:
                time.sleep(self.load_delay / 5)
        if self.load_error is not None:
            raise self.load_error
        self.block_size = block_size or 4
        self.info = {
            "target": model or "HuggingFaceTB/SmolLM2-135M-Instruct",
            "draft": draft or "smollm2-135m-instruct-dflash",
            "backend": "cpu",
            "dtype": "float32",
            "block_size": self.block_size,
            "max_ctx": self.max_ctx,
        }
        return dict(self.info)

    def stream(
        self, prompt: list[dict[str, str]], max_tokens: int, block_size: int,
        sampling: dict[str, Any] | None = None,
    ) -> Iterator[Any]:
        # `sampling` is accepted and not used: the fake's reply is fixed text.
        from engine.events import CycleStats, Finished, GenerationResult, RunningStats, Span

        text = self.reply if self.reply is not None else FAKE_REPLY
        words = [w + " " for w in text.split(" ")][:max_tokens]
        words[-1] = words[-1][:-1]
        def tokens(messages: list[dict[str, str]]) -> int:
            return sum(len(m["content"].split()) + 4 for m in messages)

        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        prompt_tokens = tokens(messages)
        check_context(prompt_tokens, self.max_ctx)
        # Like the engine's conversation cache: the turns this prompt shares with the last
        # conversation (its prompt and reply) are resumed, not prefilled again.
        shared = 0
        while shared < min(len(messages), len(self.held)) and messages[shared] == self.held[shared]:
            shared += 1
        cached = tokens(messages[:shared])
        generated, cycles, pos, paused_tokens = 0, 0, 0, 0
        committed: list[int] = []
        speculative = self.fallback is None
        pattern = self.pattern if speculative else [1]
        while pos < len(words):
            if self.delay:
                time.sleep(self.delay)
            paused = speculative and self.paused_from is not None and cycles >= self.paused_from
            n = pattern[cycles % len(pattern)] if generated and not paused else 1
            chunk = words[pos : pos + n]
            pos += len(chunk)
            n_draft = len(chunk) - 1 if generated and speculative else 0
            cycle = None
            if generated and speculative:
                cycle = CycleStats(cycles, 1 if paused else self.block_size, n_draft, 0.001,
                                   0.002, 0.0, paused=paused)
                paused_tokens += len(chunk) if paused else 0
                cycles += 1
                committed.append(len(chunk))
            generated += len(chunk)
            stats = RunningStats(
                prompt_tokens=prompt_tokens,
                generated=generated,
                cycles=cycles,
                elapsed_s=0.05 + generated * 0.01,
                decode_s=generated * 0.01,
                ttft_s=0.05,
                prefill_tokens_per_second=prompt_tokens / 0.05,
                ctx_used=prompt_tokens + generated,
                max_ctx=self.max_ctx,
                peak_memory_bytes=300_000_000 + generated * 1000,
                speculative=speculative,
                cached_tokens=cached,
                paused=paused and generated > 1,
                pauses=int(paused_tokens > 0),
                paused_tokens=paused_tokens,
            )
            yield Span(
                tokens=tuple(range(len(chunk))),
                n_draft=n_draft,
                text="".join(chunk),
                draft_text="".join(chunk[:n_draft]),
                stats=stats,
                cycle=cycle,
            )
        yield Finished(
            GenerationResult(
                text="".join(words),
                tokens=list(range(generated)),
                prompt_tokens=prompt_tokens,
                finish_reason="length" if len(words) >= max_tokens else "stop",
                speculative=speculative,
                fallback_reason=self.fallback,
                block_size=self.block_size,
                elapsed_s=0.05 + generated * 0.01,
                prefill_s=0.05,
                ttft_s=0.05,
                decode_s=generated * 0.01,
                peak_memory_bytes=300_000_000 + generated * 1000,
                cycle_tokens=committed,
                cached_tokens=cached,
            )
        )
        self.held = [*messages, {"role": "assistant", "content": "".join(words)}]
