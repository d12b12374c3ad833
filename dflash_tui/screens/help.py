"""Every key binding, read from the bindings themselves so it never drifts."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.dom import DOMNode
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Static

BindingRow = tuple[str, str, str, str]  # (id, keys, action, where)


def rows_of(
    sources: Iterable[tuple[str, type[DOMNode]]], keymap: dict[str, str] | None = None
) -> list[BindingRow]:
    """A row for every binding with an id of each (where, class) in `sources`; `keymap`
    overrides keys by id. The app names the sources: this screen imports none of them."""
    keymap = keymap or {}
    rows = []
    for where, cls in sources:
        for b in cls.BINDINGS:
            if isinstance(b, Binding) and b.id:
                rows.append((b.id, keymap.get(b.id, b.key), b.description, where))
    return rows


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical { width: 100%; max-width: 92; height: 85%; border: thick $accent;
        background: $surface; padding: 0 1; }
    HelpScreen .title { text-style: bold; padding: 1 0 0 0; }
    HelpScreen .hint { color: $text-muted; padding: 0 0 1 0; }
    HelpScreen DataTable { height: 1fr; }
    """
    BINDINGS = [
        Binding("escape", "dismiss", "Close", id="help.close"),
        Binding("f1", "dismiss", "Close", show=False, id="help.close_f1"),
    ]

    def __init__(self, rows: list[BindingRow], config_file: Path) -> None:
        super().__init__()
        self.rows, self.config_file = rows, config_file

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("dflash-chat keys  (Esc closes)", classes="title")
            yield Static(
                Text.assemble(
                    "Rebind a key by its id: ",
                    ('"chat.stop" = "ctrl+s"', "bold"),
                    " under [keymap] in ",
                    (str(self.config_file), "bold"),
                ),
                classes="hint",
            )
            yield DataTable(cursor_type="row", id="keys")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        # Key and id first: on a narrow terminal "Where" is what scrolls out of view.
        table.add_columns("Key", "Action", "Binding id", "Where")
        for binding_id, key, action, where in self.rows:
            table.add_row(key, action, binding_id, where)
        table.focus()
