"""One long-lived engine thread fed by a queue.

The UI never waits on it: jobs go in through `submit_*`, results come back as messages posted
to the app (thread-safe). Spans are coalesced and posted at most every `batch_interval`
seconds, so a fast engine cannot flood the event loop.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from textual.message import Message

from dflash_tui.backends import Backend, user_message
from dflash_tui.messages import EngineFailed, EngineProgress, EngineReady, ReplyFinished, SpanBatch
from engine.events import Finished, Span  # plain dataclasses: loads no MLX

log = logging.getLogger("dflash_tui.worker")


@dataclass
class LoadJob:
    model: str | None
    draft: str | None
    block_size: int = 0


@dataclass
class GenerateJob:
    request_id: int
    prompt: list[dict[str, str]]
    max_tokens: int
    block_size: int
    # generate()'s sampling keywords (temperature, top_p, top_k, min_p, seed); {}: greedy
    sampling: dict[str, Any] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)


_STOP = object()


class EngineWorker:
    def __init__(
        self,
        backend_factory: Callable[[], Backend],
        post: Callable[[Message], Any],
        batch_interval: float = 1 / 30,
    ) -> None:
        self._backend_factory = backend_factory
        self._post = post
        self.batch_interval = batch_interval
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="dflash-engine", daemon=True)
        self._current: GenerateJob | None = None
        self._backend: Backend | None = None

    def start(self) -> None:
        self._thread.start()

    def submit_load(self, model: str | None, draft: str | None, block_size: int = 0) -> None:
        self._jobs.put(LoadJob(model, draft, block_size))

    def submit_generate(self, job: GenerateJob) -> GenerateJob:
        self._jobs.put(job)
        return job

    def cancel(self, request_id: int | None = None) -> None:
        job = self._current
        if job is not None and (request_id is None or job.request_id == request_id):
            job.cancel.set()

    def shutdown(self, timeout: float = 2.0) -> None:
        self.cancel()
        self._jobs.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    # worker thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            try:
                if isinstance(job, LoadJob):
                    self._load(job)
                elif isinstance(job, GenerateJob):
                    self._generate(job)
            except Exception as exc:  # a job failing must never kill the engine thread
                log.exception("engine job failed")
                during = "load" if isinstance(job, LoadJob) else "generate"
                rid = getattr(job, "request_id", None)
                self._post(EngineFailed(user_message(exc), during, rid))

    def _load(self, job: LoadJob) -> None:
        self._backend = None  # a failed load must not leave a half-loaded pair in use
        backend = self._backend_factory()

        def progress(text: str, fraction: float | None) -> None:
            self._post(EngineProgress(text, fraction))

        info = backend.load(job.model, job.draft, job.block_size, progress)
        self._backend = backend
        self._post(EngineReady(info))

    def _generate(self, job: GenerateJob) -> None:
        if job.cancel.is_set():
            self._post(ReplyFinished(job.request_id, "cancelled", {}))
            return
        if self._backend is None:
            self._post(
                EngineFailed(
                    "No model is loaded. Pick a model pair with F2 (or fix the error shown "
                    "above) and send again; your message is saved.",
                    "generate",
                    job.request_id,
                )
            )
            return
        self._current = job
        gen = self._backend.stream(job.prompt, job.max_tokens, job.block_size, job.sampling)
        text: list[str] = []
        segments: list[tuple[str, bool]] = []
        cycles: list[int] = []
        stats = None
        last_post = time.monotonic()
        finish, summary = "cancelled", {}

        def flush() -> None:
            nonlocal text, segments, cycles, last_post
            if text:
                self._post(SpanBatch(job.request_id, "".join(text), segments, stats, cycles))
            text, segments, cycles = [], [], []
            last_post = time.monotonic()

        try:
            for event in gen:
                if job.cancel.is_set():
                    break
                if isinstance(event, Span):
                    text.append(event.text)
                    if event.draft_text:
                        segments.append((event.draft_text, True))
                    if event.target_text:
                        segments.append((event.target_text, False))
                    if event.cycle is not None and not getattr(event.cycle, "paused", False):
                        cycles.append(event.cycle.committed)  # the draft's cycles only
                    stats = event.stats
                    if time.monotonic() - last_post >= self.batch_interval:
                        flush()
                elif isinstance(event, Finished):
                    result = event.result
                    finish = result.finish_reason
                    summary = _summary(result)
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()  # stops the engine mid-reply and frees its caches
            self._current = None
        flush()
        if job.cancel.is_set():
            finish = "cancelled"
        self._post(ReplyFinished(job.request_id, finish, summary))


def _summary(result: Any) -> dict[str, Any]:
    return {
        "tokens": result.total_tokens,
        "tok_s": round(result.tokens_per_second, 2),
        "acceptance": round(result.acceptance_rate, 4),
        "tokens_per_cycle": round(result.tokens_per_cycle, 3),
        "cycles": result.cycles,
        "lookup_cycles": result.lookup_cycles,
        "pauses": getattr(result, "pauses", 0),
        "paused_tokens": getattr(result, "paused_tokens", 0),
        "ttft_s": round(result.ttft_s, 4),
        "speculative": result.speculative,
        "fallback_reason": result.fallback_reason,
        "block_size": result.block_size,
    }
