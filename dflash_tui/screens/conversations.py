"""List, open, create, rename, delete and search conversations."""

from __future__ import annotations

import datetime as dt

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Label

from dflash_tui.host import ChatHost, host_of
from dflash_tui.messages import DeleteConversation, OpenConversation, RenameConversation
from dflash_tui.screens.modals import Confirm, TextPrompt
from dflash_tui.widgets.ids import middle_ellipsis


class ConversationsScreen(ModalScreen[None]):
    """Posts OpenConversation (None: a new chat) to the app and closes."""

    DEFAULT_CSS = """
    ConversationsScreen { align: center middle; }
    ConversationsScreen > Vertical { width: 1fr; height: 80%; margin: 0 2; border: thick $accent;
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

    @property
    def host(self) -> ChatHost:
        return host_of(self)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Conversations  (Enter opens)", classes="title")
            yield Input(placeholder="Search titles and messages…", id="search")
            yield DataTable(cursor_type="row", zebra_stripes=True, id="list")
        yield Footer()

    def on_mount(self) -> None:
        self.reload()
        self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        self.reload()

    def _widths(self) -> dict[str, int]:
        # The screen minus the dialog's margin, border, padding and the table's scrollbar and
        # cell padding; the title takes what the fixed columns leave, so nothing scrolls.
        room = self.app.size.width - 4 - 2 - 2 - 2 - 2 * 4
        fixed = {"Messages": 8, "Model": min(22, max(8, room // 4)), "Updated": 16}
        return {"Title": max(12, room - sum(fixed.values())), **fixed}

    def reload(self) -> None:
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        widths = self._widths()
        table.clear(columns=True)
        for name, width in widths.items():
            table.add_column(name, width=width, key=name)
        store = self.host.store
        counts = store.message_counts()
        for conv in store.list_conversations(self.query_one("#search", Input).value.strip()):
            count = counts.get(conv.id, 0)
            when = dt.datetime.fromtimestamp(conv.updated_at).strftime("%Y-%m-%d %H:%M")
            model = (conv.model or "—").rsplit("/", 1)[-1]  # the pair it last talked to
            # Text, not str: DataTable reads a str as markup, and titles are user text.
            title = Text(conv.title, no_wrap=True, overflow="ellipsis")
            table.add_row(title, str(count), Text(middle_ellipsis(model, widths["Model"])), when,
                          key=str(conv.id))
        if table.row_count:
            table.move_cursor(row=min(cursor, table.row_count - 1))

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
        conv = self.host.store.get_conversation(cid)

        def done(title: str | None) -> None:
            if title is not None:
                self.post_message(RenameConversation(cid, title))  # the app reloads this list

        self.app.push_screen(TextPrompt("Rename conversation", conv.title if conv else ""), done)

    def action_delete(self) -> None:
        cid = self._selected()
        if cid is None:
            return
        conv = self.host.store.get_conversation(cid)

        def done(yes: bool | None) -> None:
            if yes:
                self.post_message(DeleteConversation(cid))  # the app reloads this list

        title = conv.title if conv else str(cid)
        self.app.push_screen(Confirm(f"Delete “{title}”? This cannot be undone."), done)
