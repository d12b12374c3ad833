"""Chat transcript: one MessageView per turn; replies stream through MarkdownStream."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Label, Markdown, Static
from textual.widgets._markdown import MarkdownStream

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System", "error": "Error"}
STATUS_NOTES = {
    "streaming": "streaming…",
    "stopped": "■ stopped",
    "length": "max tokens reached",
    "error": "✗ error",
    "interrupted": "interrupted (app closed mid-reply)",
}


class MessageView(Widget, can_focus=True):
    """One turn. Focus it (Tab or click) and press c to copy it."""

    BINDINGS = [Binding("c", "copy", "Copy message", id="message.copy")]

    DEFAULT_CSS = """
    MessageView { height: auto; margin: 0 1 1 1; padding: 0 1; border-left: thick $panel; }
    MessageView.user { border-left: thick $primary; background: $boost; }
    MessageView.assistant { border-left: thick $accent; }
    MessageView.stopped, MessageView.interrupted { border-left: thick $warning; }
    MessageView.error { border-left: thick $error; }
    MessageView:focus { background: $surface-lighten-1; }
    MessageView .role { color: $text-muted; text-style: bold; }
    MessageView Markdown { margin: 0; padding: 0; background: transparent; }
    MessageView .coloured { display: none; }
    MessageView.show-colours.has-segments .coloured { display: block; }
    MessageView.show-colours.has-segments Markdown { display: none; }
    MessageView .footer { color: $text-muted; }
    """

    def __init__(self, role: str, content: str = "", status: str = "done", **kwargs) -> None:
        super().__init__(classes=role, **kwargs)
        self.role = role
        self.content = content
        self.status = status
        self.segments: list[tuple[str, bool]] = []
        self.footer_text = ""
        self._stream: MarkdownStream | None = None
        self.message_id: int | None = None
        if status != "done":
            self.add_class(status)

    def compose(self) -> ComposeResult:
        yield Label(self._role_line(), classes="role")
        yield Markdown(self.content)
        yield Static("", classes="coloured")
        yield Label("", classes="footer", markup=False)

    def _role_line(self) -> str:
        note = STATUS_NOTES.get(self.status)
        title = ROLE_TITLES.get(self.role, self.role)
        return f"{title}  · {note}" if note else title

    def on_mount(self) -> None:
        if self.status == "streaming":
            self._stream = Markdown.get_stream(self.query_one(Markdown))

    async def append(self, text: str, segments: list[tuple[str, bool]]) -> None:
        """Add streamed text: the Markdown widget only re-parses the tail, never the whole reply."""
        self.content += text
        self.segments.extend(segments)
        if segments:
            self.add_class("has-segments")
        if self._stream is not None:
            await self._stream.write(text)
        if self.has_class("show-colours"):
            self._render_colours()

    async def finish(self, status: str, footer: str = "") -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        for old in STATUS_NOTES:
            self.remove_class(old)
        self.status = status
        if status != "done":
            self.add_class(status)
        self.query_one(".role", Label).update(self._role_line())
        self.set_footer(footer)

    def set_footer(self, footer: str) -> None:
        self.footer_text = footer
        self.query_one(".footer", Label).update(footer)

    def set_colours(self, on: bool) -> None:
        self.set_class(on, "show-colours")
        if on:
            self._render_colours()

    def _render_colours(self) -> None:
        text = Text()
        for chunk, drafted in self.segments:
            text.append(chunk, style="bold green" if drafted else "")
        self.query_one(".coloured", Static).update(text)

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.content)
        self.app.notify(f"Copied {len(self.content)} characters", timeout=2)


class Transcript(VerticalScroll):
    """Anchored to the bottom while streaming; scrolling up releases the anchor (Textual's own
    anchor semantics), so the view stops following until the user returns to the end."""

    DEFAULT_CSS = """
    Transcript { height: 1fr; }
    Transcript #empty { color: $text-muted; margin: 1 2; }
    Transcript .notice { margin: 0 1 1 1; padding: 0 1; border: round $error; color: $text; }
    """

    def on_mount(self) -> None:
        self.anchor()

    async def add(self, view: Widget) -> None:
        empty = self.query("#empty")
        if empty:
            await empty.remove()
        await self.mount(view)

    def messages(self) -> list[MessageView]:
        return list(self.query(MessageView))
