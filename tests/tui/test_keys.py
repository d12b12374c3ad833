"""Prompt editing keys and one-key copy."""

from __future__ import annotations

import pytest

from dflash_tui.app import DFlashChatApp
from dflash_tui.backends import FakeBackend
from dflash_tui.widgets.prompt import PromptInput

from .conftest import engine_ready, replies, send, type_at_once, wait_for

pytestmark = pytest.mark.asyncio


async def test_shift_enter_and_ctrl_j_insert_newlines_enter_sends():
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(reply="ok then"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        prompt = app.chat.query_one(PromptInput)
        assert prompt.has_focus
        await pilot.press("a", "shift+enter", "b", "ctrl+j", "c")
        assert prompt.text == "a\nb\nc"
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(replies(app)) and replies(app)[-1].status != "streaming"
                       and bool(replies(app)[-1].content))
        assert prompt.text == ""
        users = [m for m in app.store.messages(app.conversation_id) if m.role == "user"]
        assert users[-1].content == "a\nb\nc"


async def test_ctrl_y_copies_the_last_reply():
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(reply="copy this reply"))
    copied: list[str] = []
    app.copy_to_clipboard = copied.append  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "hi")
        await wait_for(pilot, lambda: bool(replies(app)) and replies(app)[-1].status != "streaming"
                       and bool(replies(app)[-1].content))
        await pilot.press("ctrl+y")
        assert copied == [replies(app)[-1].content] and "copy this reply" in copied[0]



def sent(app) -> list[str]:
    return [m.content for m in app.store.messages(app.conversation_id) if m.role == "user"]


@pytest.mark.parametrize("typed, message", [("question\r", "question"),
                                            ("two\nlines\r", "two\nlines")])
async def test_enter_right_after_typed_text_sends_it(typed, message):
    """`tmux send-keys "question" Enter`: the characters and Enter (and a Ctrl+J newline
    between them) arrive in one burst, before the prompt has taken the characters."""
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(reply="an answer"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        prompt = app.chat.query_one(PromptInput)
        type_at_once(app, typed)
        try:
            await wait_for(pilot, lambda: bool(replies(app)) and replies(app)[-1].status
                           != "streaming" and bool(replies(app)[-1].content), timeout=10)
        except AssertionError:
            raise AssertionError(f"nothing was sent; the prompt holds {prompt.text!r}") from None
        assert sent(app) == [message]
        assert prompt.text == ""
