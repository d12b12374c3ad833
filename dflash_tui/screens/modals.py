"""Small dialogs: text prompt, confirmation, per-conversation settings."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea

from dflash_tui.config import (
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    validate_block_size,
    validate_max_tokens,
)

MODAL_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{ width: 70; max-width: 100%; height: auto; max-height: 100%;
    border: thick $accent; background: $surface; padding: 1 2; overflow-y: auto; }}
{name} .title {{ text-style: bold; margin-bottom: 1; }}
{name} .error {{ color: $error; height: auto; }}
{name} Horizontal {{ height: auto; margin-top: 1; }}
{name} Button {{ margin-right: 2; }}
"""


class TextPrompt(ModalScreen[str | None]):
    DEFAULT_CSS = MODAL_CSS.format(name="TextPrompt")
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", id="dialog.cancel")]

    def __init__(self, title: str, value: str = "") -> None:
        super().__init__()
        self.title_text, self.value = title, value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, classes="title", markup=False)
            yield Input(self.value, id="value")

    @on(Input.Submitted)
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)


class Confirm(ModalScreen[bool]):
    DEFAULT_CSS = MODAL_CSS.format(name="Confirm")
    BINDINGS = [
        Binding("escape", "dismiss(False)", "Cancel", id="dialog.cancel"),
        Binding("y", "dismiss(True)", "Yes", id="dialog.yes"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, classes="title", markup=False)
            with Horizontal():
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (Esc)", id="no")

    @on(Button.Pressed)
    def pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class SettingsScreen(ModalScreen[dict | None]):
    """System prompt, max tokens and block size for one conversation."""

    DEFAULT_CSS = (
        MODAL_CSS.format(name="SettingsScreen")
        + """
    SettingsScreen TextArea { height: 5; }
    """
    )
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Cancel", id="dialog.cancel"),
        Binding("ctrl+s", "save", "Save", id="settings.save"),
    ]

    def __init__(self, system_prompt: str, max_tokens: int, block_size: int) -> None:
        super().__init__()
        self.values = (system_prompt, max_tokens, block_size)

    def compose(self) -> ComposeResult:
        system_prompt, max_tokens, block_size = self.values
        with Vertical():
            yield Label("Conversation settings", classes="title")
            yield Label("System prompt")
            yield TextArea(system_prompt, id="system")
            yield Label("Max tokens per reply")
            yield Input(str(max_tokens), id="max-tokens")
            yield Label(
                f"Draft block size ({MIN_BLOCK_SIZE}-{MAX_BLOCK_SIZE}, 0 = the draft's own)"
            )
            yield Input(str(block_size), id="block-size")
            yield Label("", classes="error", id="error", markup=False)
            with Horizontal():
                yield Button("Save (Ctrl+S)", variant="primary", id="save")
                yield Button("Cancel (Esc)", id="cancel")

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        try:
            max_tokens = validate_max_tokens(self.query_one("#max-tokens", Input).value)
            block_size = validate_block_size(self.query_one("#block-size", Input).value)
        except ValueError as exc:
            self.query_one("#error", Label).update(str(exc))
            return
        self.dismiss(
            {
                "system_prompt": self.query_one("#system", TextArea).text,
                "max_tokens": max_tokens,
                "block_size": block_size,
            }
        )

    @on(Button.Pressed, "#cancel")
    def cancel(self) -> None:
        self.dismiss(None)
