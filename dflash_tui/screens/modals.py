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
    ChatSettings,
    validate_block_size,
    validate_max_tokens,
    validate_sampling,
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
    """One conversation's settings: system prompt, reply length, block size and sampling.
    Save checks every field; a bad one keeps the screen open with what was typed, names the
    field and its valid range, and takes the focus."""

    DEFAULT_CSS = (
        MODAL_CSS.format(name="SettingsScreen")
        + """
    SettingsScreen > Vertical { padding: 0 2; }
    SettingsScreen .title { margin: 1 0 0 0; }
    SettingsScreen TextArea { height: 4; }
    SettingsScreen .field { height: 1; margin: 0; }
    SettingsScreen .field Label { width: 36; }
    SettingsScreen .field Input { width: 1fr; background: $boost; }
    SettingsScreen .note { color: $text-muted; width: 100%; }
    SettingsScreen Horizontal.buttons { margin: 1 0; }
    """
    )
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Cancel", id="dialog.cancel"),
        Binding("ctrl+s", "save", "Save", id="settings.save"),
    ]
    # (field, label) for the one-line fields below the system prompt, in order.
    FIELDS = (
        ("max_tokens", "Max tokens per reply"),
        ("block_size", f"Block size ({MIN_BLOCK_SIZE}-{MAX_BLOCK_SIZE}; 0 = the draft's)"),
        ("temperature", "temperature (0 = greedy, exact)"),
        ("top_p", "top_p (0 < p <= 1; 1 = off)"),
        ("top_k", "top_k (0 = off)"),
        ("min_p", "min_p (0 <= p < 1; 0 = off)"),
        ("seed", "seed (empty = a new one per reply)"),
    )

    def __init__(self, current: ChatSettings) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Conversation settings", classes="title")
            yield Label("System prompt")
            yield TextArea(self.current.system_prompt, id="system")
            for name, label in self.FIELDS:
                value = getattr(self.current, name)
                with Horizontal(classes="field"):
                    yield Label(label, markup=False)
                    yield Input("" if value is None else str(value), id=name.replace("_", "-"),
                                compact=True)
            yield Label("A temperature above 0 samples the reply; the draft keeps the "
                        "target's distribution exactly.", classes="note")
            yield Label("", classes="error", id="error", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save (Ctrl+S)", variant="primary", id="save", compact=True)
                yield Button("Cancel (Esc)", id="cancel", compact=True)

    def field(self, name: str) -> Input:
        return self.query_one(f"#{name.replace('_', '-')}", Input)

    def check(self) -> dict | None:
        """Every field's value, or None after showing the first bad one's problem."""
        values: dict = {"system_prompt": self.query_one("#system", TextArea).text}
        parse = {"max_tokens": validate_max_tokens, "block_size": validate_block_size}
        for name, _ in self.FIELDS:
            text = self.field(name).value
            try:
                values[name] = (parse[name](text) if name in parse
                                else validate_sampling(name, text))
            except ValueError as exc:
                self.query_one("#error", Label).update(str(exc))
                self.field(name).focus()
                return None
        return values

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        values = self.check()
        if values is not None:
            self.dismiss(values)

    @on(Input.Submitted)
    def submitted(self) -> None:
        self.action_save()

    @on(Button.Pressed, "#cancel")
    def cancel(self) -> None:
        self.dismiss(None)
