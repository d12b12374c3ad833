"""The prompt box: Enter sends, Shift+Enter / Ctrl+J insert a newline."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    # priority: TextArea handles Enter itself (a newline) before ordinary bindings are seen.
    BINDINGS = [
        Binding("enter", "submit", "Send", id="prompt.send", priority=True, show=False),
        Binding(
            "shift+enter,ctrl+j", "newline", "Newline", id="prompt.newline", priority=True,
            show=False,
        ),
    ]
    DEFAULT_CSS = """
    PromptInput { height: auto; min-height: 3; max-height: 10; }
    """

    @dataclass
    class Submitted(Message):
        prompt: PromptInput
        text: str

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.placeholder = "Message  (Enter sends · Shift+Enter / Ctrl+J newline · Esc stops)"

    # A priority binding runs as the app reads the key, while keys typed just before it (a
    # fast typist, a paste tool, `tmux send-keys "hi" Enter`) may still wait in this widget's
    # queue. call_later queues the action behind them, so it sees the text typed before it.

    def action_submit(self) -> None:
        self.call_later(self._submit)

    def _submit(self) -> None:
        if self.text.strip():
            self.post_message(self.Submitted(self, self.text))

    def action_newline(self) -> None:
        self.call_later(self.insert, "\n")
