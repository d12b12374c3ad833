"""Messages posted to the app. Plain dataclasses; posting is thread-safe.

The engine worker posts the Engine*/Span*/Reply* messages; screens post the rest instead of
writing app state, and the app (the one owner of the current conversation and the settings)
applies them.
"""

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


# -- screens -> app -----------------------------------------------------------------------


@dataclass
class OpenConversation(Message):
    """Show a stored conversation; None starts an empty new chat."""

    conversation_id: int | None


@dataclass
class RenameConversation(Message):
    conversation_id: int
    title: str


@dataclass
class DeleteConversation(Message):
    conversation_id: int


@dataclass
class ToggleView(Message):
    """Flip one of the view settings: "draft_colours", "show_sidebar" or "compact"."""

    setting: str


@dataclass
class LoadPair(Message):
    """Load this target/draft pair (None: the offline default / the registry's draft)."""

    model: str | None
    draft: str | None


@dataclass
class SaveSettings(Message):
    """Conversation settings from the settings screen, checked: system_prompt, max_tokens,
    block_size and the sampling fields (engine.config.SamplingParams')."""

    values: dict[str, Any]
