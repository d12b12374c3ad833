"""Messages the engine worker posts to the app. Plain dataclasses; posting is thread-safe."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message


@dataclass
class EngineProgress(Message):
    """Loading or downloading: `fraction` is None when the total is unknown."""

    text: str
    fraction: float | None = None


@dataclass
class EngineReady(Message):
    info: dict[str, Any]  # DFlashRuntime.describe()


@dataclass
class EngineFailed(Message):
    """A user-readable problem and its fix; never a traceback."""

    error: str
    during: str  # "load" | "generate" | "download"
    request_id: int | None = None


@dataclass
class SpanBatch(Message):
    """Spans committed since the last batch, coalesced so the UI repaints at a bounded rate."""

    request_id: int
    text: str
    segments: list[tuple[str, bool]]  # (text, drafted) in order, for draft colouring
    stats: Any  # the latest engine.events.RunningStats
    cycle_tokens: list[int] = field(default_factory=list)  # committed per cycle in this batch


@dataclass
class ReplyFinished(Message):
    request_id: int
    finish_reason: str  # "stop" | "length" | "cancelled"
    summary: dict[str, Any]


@dataclass
class DownloadFinished(Message):
    target: str
    draft: str | None
