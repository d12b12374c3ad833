"""The app as its screens see it: the state it owns and the few calls that change it.

Screens never import the app (that made an import circle). They read and write the app's
state through this interface and post the rest as messages (dflash_tui/messages.py); the
app (dflash_tui/app.py) implements it and is the one owner of the state.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from textual.dom import DOMNode

    from dflash_tui.config import ChatSettings, Settings
    from dflash_tui.store import Store, StoredMessage
    from dflash_tui.worker import EngineWorker


class ChatHost(Protocol):
    settings: Settings  # the config file's values: view, defaults, keymap
    store: Store
    worker: EngineWorker
    config_file: Path
    conversation_id: int | None  # the open conversation; None: a new chat, not stored yet
    start_conversation: int | None  # the one to show first (--conversation)

    def effective(self) -> ChatSettings:
        """The open conversation's settings over the defaults."""
        ...

    async def open_conversation(self, conversation_id: int | None) -> None: ...

    def begin_conversation(self, first_message: str) -> int:
        """The conversation a message goes to: the open one, or a new one named after it."""
        ...

    def add_turn(self, role: str, content: str, status: str = "done") -> StoredMessage: ...

    def save_turn(
        self, message_id: int, content: str, status: str | None = None, stats: dict | None = None
    ) -> None: ...

    def drop_turns(self, message_ids: list[int]) -> None: ...


def host_of(node: DOMNode) -> ChatHost:
    """The running app, as the ChatHost it implements."""
    return cast("ChatHost", node.app)
