"""Model-pair picker: the registry with each pair's state, downloads, and custom pairs."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Footer, Input, Label, ProgressBar, Static

from dflash_tui.downloads import (
    OFFLINE_HELP,
    PairRow,
    download_pair,
    registry_rows,
)
from dflash_tui.messages import LoadPair
from dflash_tui.widgets.ids import fit_id
from engine.registry import human_size  # plain data: no MLX

STATUS_STYLE = {
    "loaded": "[b reverse green] loaded [/]",
    "bundled": "[b green]bundled[/]",
    "cached": "[green]cached[/]",
    "downloadable": "[yellow]download[/]",
    "unavailable offline": "[red]no network[/]",
}
STATE_WIDTH = 10  # "no network"
FAMILY_WIDTH = 11  # "gated_delta"
ARCH_WIDTH = 7  # "DFlash2"
NOTE_WIDTH = (12, 24)  # the note wraps inside this
WIDE = 100  # from this many columns the Family column fits too
ARCH_WIDE = 120  # and from this many the Arch column
MIN_ID = 12


def column_widths(total: int, rows: list[PairRow]) -> dict[str, int]:
    """Cell widths that fill `total` columns (DataTable pads each cell by 1 on both sides).
    Narrower screens drop Arch, then Family and Note from the table: the line under it shows
    the highlighted pair's note, draft architecture and full ids."""
    wide, arch = total >= WIDE - 8, total >= ARCH_WIDE - 8
    names = ["Target", "Draft", *(["Arch"] if arch else []),
             *(["Family", "State", "Note"] if wide else ["State"])]
    room = (total - 2 * len(names) - STATE_WIDTH - (FAMILY_WIDTH if wide else 0)
            - (ARCH_WIDTH if arch else 0))
    note = 0
    if wide:
        longest_note = max((len(r.note) for r in rows), default=0)
        # The ids come first: the note wraps, and gets what the ids leave over.
        longest_ids = max((len(r.target) for r in rows), default=0) + max(
            (len(r.draft or "") for r in rows), default=0
        )
        note = max(NOTE_WIDTH[0], min(NOTE_WIDTH[1], longest_note, room - longest_ids))
        room -= note
    max_t = max((len(r.target) for r in rows), default=MIN_ID)
    max_d = max((len(r.draft or "") for r in rows), default=MIN_ID)
    target = max(MIN_ID, min(max_t, max(room // 2, room - max_d)))
    widths = {"Target": target, "Draft": max(MIN_ID, room - target), "Arch": ARCH_WIDTH,
              "Family": FAMILY_WIDTH, "State": STATE_WIDTH, "Note": note}
    return {name: widths[name] for name in names}


def state_cell(row: PairRow, loaded: bool = False) -> Text:
    """The State column: the pair in use says so; a pair fetched from PyPI shows its
    download size instead of "download"."""
    if loaded:
        return Text.from_markup(STATUS_STYLE["loaded"])
    if row.status == "downloadable" and row.size:
        return Text.from_markup(f"[yellow]{human_size(row.size)}[/]")
    return Text.from_markup(STATUS_STYLE.get(row.status, row.status))


class PickerScreen(ModalScreen[None]):
    """Posts LoadPair(target, draft) to the app and closes; draft None: the registry's.
    `loaded_target`: the target in use (the app's), whose row the cursor starts on."""

    DEFAULT_CSS = """
    PickerScreen { align: center middle; }
    PickerScreen > Vertical { width: 1fr; height: 1fr; margin: 1 1; border: thick $accent;
        background: $surface; padding: 0 1; }
    PickerScreen .title { text-style: bold; padding: 1 0 0 0; }
    PickerScreen DataTable { height: 1fr; }
    PickerScreen #message { height: auto; color: $warning; }
    PickerScreen #detail { height: auto; color: $text-muted; }
    PickerScreen #download-bar { display: none; }
    PickerScreen #download-bar.visible { display: block; }
    PickerScreen Horizontal { height: auto; }
    PickerScreen Horizontal Input { width: 1fr; }
    """
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close", id="picker.close"),
        Binding("d", "download", "Download", id="picker.download"),
    ]

    def __init__(self, loaded_target: str | None = None) -> None:
        super().__init__()
        self.loaded_target = (loaded_target or "").lower()
        self.rows: list[PairRow] = []
        self.downloading = False
        self._widths: dict[str, int] = {}

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Model pairs  (Enter loads · d downloads)", classes="title")
            yield DataTable(cursor_type="row", zebra_stripes=True, id="pairs")
            yield Static("", id="detail")  # the highlighted pair's full ids
            yield Label("", id="message", markup=False)
            yield ProgressBar(total=1.0, id="download-bar")
            yield Label("Custom pair: Hub ids or local folders (no draft: the registry's)")
            with Horizontal():
                yield Input(placeholder="target id or folder", id="target")
                yield Input(placeholder="draft (optional)", id="draft")
                yield Button("Load custom", id="custom", variant="primary")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        self._widths = column_widths(self._table_width(), [])
        for name, width in self._widths.items():
            table.add_column(name, width=width, key=name)
        self.query_one("#message", Label).update("Checking the local cache…")
        self.load_rows()
        table.focus()

    @work(thread=True, exclusive=True, group="picker-rows")
    def load_rows(self) -> None:
        try:
            rows = registry_rows()
        except Exception as exc:  # registry missing or broken: say so, keep custom usable
            self.app.call_from_thread(self._message, f"Model registry unavailable: {exc}")
            return
        self.app.call_from_thread(self._show_rows, rows)

    def _table_width(self) -> int:
        # The screen minus the dialog's margin, border and padding and the table's scrollbar.
        return self.app.size.width - 2 - 2 - 2 - 2

    def on_resize(self) -> None:
        if self.rows and column_widths(self._table_width(), self.rows) != self._widths:
            self._show_rows(self.rows)

    def _loaded_row(self, rows: list[PairRow]) -> int | None:
        return next((i for i, r in enumerate(rows)
                     if self.loaded_target and r.target.lower() == self.loaded_target), None)

    def _show_rows(self, rows: list[PairRow]) -> None:
        first = not self.rows
        self.rows = rows
        table = self.query_one(DataTable)
        loaded = self._loaded_row(rows)
        # opened: on the pair in use; redrawn (a resize, a download): where the user was
        cursor = (loaded or 0) if first else table.cursor_row
        self._widths = column_widths(self._table_width(), rows)
        table.clear(columns=True)
        for name, width in self._widths.items():
            table.add_column(name, width=width, key=name)
        for i, r in enumerate(rows):
            cells = {
                "Target": Text(fit_id(r.target, self._widths["Target"])),
                "Draft": Text(fit_id(r.draft or "—", self._widths["Draft"])),
                "Arch": r.architecture,
                "Family": r.family,
                "State": state_cell(r, loaded=i == loaded),
                "Note": Text(r.note, overflow="fold"),
            }
            table.add_row(*(cells[name] for name in self._widths), key=str(i), height=None)
        if rows:
            table.move_cursor(row=min(cursor, len(rows) - 1))
        self._show_detail()
        self._message("")

    @on(DataTable.RowHighlighted)
    def _show_detail(self) -> None:
        row = self._selected()
        text = Text()
        if row is not None:
            text.append("target ", style="dim")
            text.append(row.target)
            text.append("\ndraft  ", style="dim")
            text.append(row.draft or "—")
            if row.draft:
                text.append(f"  ({row.architecture})", style="dim")
            if row.note:
                text.append("\nnote   ", style="dim")
                text.append(row.note)
            if row.size and row.status == "downloadable":
                text.append("\nfirst  ", style="dim")
                text.append(f"downloads {human_size(row.size)} from PyPI, once")
        self.query_one("#detail", Static).update(text)

    def _message(self, text: str) -> None:
        self.query_one("#message", Label).update(text)

    def _selected(self) -> PairRow | None:
        table = self.query_one(DataTable)
        if not self.rows or table.row_count == 0:
            return None
        return self.rows[table.cursor_row]

    @on(DataTable.RowSelected)
    def choose(self) -> None:
        row = self._selected()
        if row is None:
            return
        if row.status in ("bundled", "cached"):
            self.choose_pair(row.target, row.draft)
        elif row.status == "downloadable":
            self.action_download()
        else:
            self._message(OFFLINE_HELP.format(what=row.target))

    def action_download(self) -> None:
        row = self._selected()
        if row is None or self.downloading:
            return
        if row.status in ("bundled", "cached"):
            self._message(f"{row.target} is already available: press Enter to load it.")
            return
        if row.status == "unavailable offline":
            self._message(OFFLINE_HELP.format(what=row.target))
            return
        self.downloading = True
        self.query_one("#download-bar").add_class("visible")
        self.download(row)

    @work(thread=True, exclusive=True, group="download")
    def download(self, row: PairRow) -> None:
        def progress(text: str, fraction: float | None) -> None:
            self.app.call_from_thread(self._progress, text, fraction)

        try:
            download_pair(row.target, row.draft, progress)
        except Exception as exc:  # shown in the dialog; the table stays usable
            self.app.call_from_thread(self._download_failed, str(exc))
            return
        self.app.call_from_thread(self.choose_pair, row.target, row.draft)

    def _progress(self, text: str, fraction: float | None) -> None:
        self._message(text)
        bar = self.query_one("#download-bar", ProgressBar)
        bar.update(total=None if fraction is None else 1.0, progress=fraction or 0)

    def _download_failed(self, error: str) -> None:
        self.downloading = False
        self.query_one("#download-bar").remove_class("visible")
        self._message(error)
        self.notify(error, title="Download failed", severity="error", timeout=8, markup=False)

    @on(Button.Pressed, "#custom")
    @on(Input.Submitted)
    def custom(self) -> None:
        target = self.query_one("#target", Input).value.strip()
        draft = self.query_one("#draft", Input).value.strip()
        if not target:
            self._message("Type a target model id or folder path first (the draft is optional).")
            self.query_one("#target", Input).focus()
            return
        self.choose_pair(target, draft or None)

    def choose_pair(self, target: str, draft: str | None) -> None:
        self.app.post_message(LoadPair(target, draft))
        self.dismiss()
