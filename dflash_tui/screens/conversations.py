"""List, open, create, rename, delete and search conversations."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Label

from dflash_tui.messages import DeleteConversation, OpenConversation, RenameConversation
from dflash_tui.screens.modals import Confirm, TextPrompt

if TYPE_CHECKING:
    from dflash_tui.app import DFlashChatApp

class ConversationsScreen(ModalScreen[None]):
    """Posts OpenConversation (None: a new chat) to the app and closes."""

    app: DFlashChatApp

    DEFAULT_CSS = """
    ConversationsScreen { align: center middle; }
    ConversationsScreen > Vertical { width: 90%; height: 80%; border: thick $accent;
        background: $surface; padding: 0 1; }
    ConversationsScreen .title { text-style: bold; padding: 1 0 0 0; }
    ConversationsScreen DataTable { height: 1fr; }
    """
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close", id="conversations.close"),
        Binding("n", "new", "New", id="conversations.new"),
        Binding("r", "rename", "Rename", id="conversations.rename"),
        Binding("d", "delete", "Delete", id="conversations.delete"),
        Binding("slash", "search", "Search", id="conversations.search"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Conversations  (Enter opens)", classes="title")
            yield Input(placeholder="Search titles and messages…", id="search")
            yield DataTable(cursor_type="row", zebra_stripes=True, id="list")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("Title", "Messages", "Model", "Updated")
        self.reload()
        table.focus()

    def reload(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        store = self.app.store
        for conv in store.list_conversations(self.query_one("#search", Input).value.strip()):
            count = len(store.messages(conv.id))
            when = dt.datetime.fromtimestamp(conv.updated_at).strftime("%Y-%m-%d %H:%M")
            model = (conv.model or "—").rsplit("/", 1)[-1]  # the pair it last talked to
            # Text, not str: DataTable reads a str as markup, and titles are user text.
            table.add_row(Text(conv.title), str(count), Text(model), when, key=str(conv.id))

    def _selected(self) -> int | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return int(key.value) if key.value is not None else None

    @on(Input.Changed, "#search")
    def search_changed(self) -> None:
        self.reload()

    @on(Input.Submitted, "#search")
    def search_done(self) -> None:
        self.query_one(DataTable).focus()

    @on(DataTable.RowSelected)
    def open_row(self, event: DataTable.RowSelected) -> None:
        self._open(int(event.row_key.value))  # type: ignore[arg-type]

    def _open(self, conversation_id: int | None) -> None:
        self.app.post_message(OpenConversation(conversation_id))
        self.dismiss()

    def action_search(self) -> None:
        self.query_one("#search", Input).focus()

    def action_new(self) -> None:
        self._open(None)

    def action_rename(self) -> None:
        cid = self._selected()
        if cid is None:
            return
        conv = self.app.store.get_conversation(cid)

        def done(title: str | None) -> None:
            if title is not None:
                self.post_message(RenameConversation(cid, title))  # the app reloads this list

        self.app.push_screen(TextPrompt("Rename conversation", conv.title if conv else ""), done)

    def action_delete(self) -> None:
        cid = self._selected()
        if cid is None:
            return
        conv = self.app.store.get_conversation(cid)

        def done(yes: bool | None) -> None:
            if yes:
                self.post_message(DeleteConversation(cid))  # the app reloads this list

        title = conv.title if conv else str(cid)
        self.app.push_screen(Confirm(f"Delete “{title}”? This cannot be undone."), done)
