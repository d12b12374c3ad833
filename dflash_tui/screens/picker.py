"""Model-pair picker: the registry with each pair's state, downloads, and custom pairs."""

from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Footer, Input, Label, ProgressBar

from dflash_tui.downloads import OFFLINE_HELP, PairRow, download_pair, registry_rows
from dflash_tui.messages import LoadPair

STATUS_STYLE = {
    "bundled": "[b green]bundled offline[/]",
    "cached": "[green]cached[/]",
    "downloadable": "[yellow]downloadable[/]",
    "unavailable offline": "[red]unavailable offline[/]",
}


class PickerScreen(ModalScreen[None]):
    """Posts LoadPair(target, draft) to the app and closes; draft None: the registry's."""

    DEFAULT_CSS = """
    PickerScreen { align: center middle; }
    PickerScreen > Vertical { width: 95%; height: 90%; border: thick $accent;
        background: $surface; padding: 0 1; }
    PickerScreen .title { text-style: bold; padding: 1 0 0 0; }
    PickerScreen DataTable { height: 1fr; }
    PickerScreen #message { height: auto; color: $warning; }
    PickerScreen #download-bar { display: none; }
    PickerScreen #download-bar.visible { display: block; }
    PickerScreen Horizontal { height: auto; }
    PickerScreen Horizontal Input { width: 1fr; }
    """
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close", id="picker.close"),
        Binding("d", "download", "Download", id="picker.download"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[PairRow] = []
        self.downloading = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Model pairs  (Enter loads · d downloads)", classes="title")
            yield DataTable(cursor_type="row", zebra_stripes=True, id="pairs")
            yield Label("", id="message")
            yield ProgressBar(total=1.0, id="download-bar")
            yield Label("Custom pair: target and draft as Hub ids or local folder paths")
            with Horizontal():
                yield Input(placeholder="target, e.g. Qwen/Qwen3-4B or ~/models/t", id="target")
                yield Input(placeholder="draft (empty: registry's draft)", id="draft")
                yield Button("Load custom", id="custom", variant="primary")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("Target", "Draft", "Family", "State", "Note")
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

    def _show_rows(self, rows: list[PairRow]) -> None:
        self.rows = rows
        table = self.query_one(DataTable)
        table.clear()
        for i, r in enumerate(rows):
            table.add_row(
                r.target,
                r.draft or "—",
                r.family,
                STATUS_STYLE.get(r.status, r.status),
                r.note,
                key=str(i),
            )
        self._message("")

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
        self.notify(error, title="Download failed", severity="error", timeout=8)

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
