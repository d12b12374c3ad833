"""Screens post messages and the app, the one owner of the open conversation and the
settings, applies them: rename, delete, open, view toggles. Fake engine only (fast)."""

from __future__ import annotations

import pytest

from dflash_tui import config
from dflash_tui.app import DFlashChatApp
from dflash_tui.backends import FakeBackend
from dflash_tui.screens.conversations import ConversationsScreen

from .conftest import engine_ready, replies, reply_settled, send, wait_for

pytestmark = pytest.mark.asyncio


async def chat(pilot, app, text: str) -> None:
    await send(pilot, text)
    await wait_for(pilot, lambda: reply_settled(app))


def titles(screen: ConversationsScreen) -> list[str]:
    table = screen.query_one("#list")
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


async def test_rename_and_delete_go_through_the_app():
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(reply="ok"))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await chat(pilot, app, "first chat")
        first = app.conversation_id
        await pilot.press("ctrl+n")
        await chat(pilot, app, "second chat")
        second = app.conversation_id
        assert first != second and app.sub_title == "second chat"

        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationsScreen))
        listing = app.screen
        assert titles(listing) == ["second chat", "first chat"]
        await pilot.press("r")  # the open one (newest first): the header follows
        await pilot.pause()
        app.screen.query_one("Input").value = "renamed"
        await pilot.press("enter")
        await wait_for(pilot, lambda: titles(listing)[0] == "renamed")
        assert app.sub_title == "renamed"
        assert app.store.get_conversation(second).title == "renamed"

        await pilot.press("down", "d", "y")  # delete the other one: the open chat stays
        await wait_for(pilot, lambda: titles(listing) == ["renamed"])
        assert app.conversation_id == second and app.store.get_conversation(first) is None

        await pilot.press("d", "y")  # delete the open one: the app starts a new chat
        await wait_for(pilot, lambda: titles(listing) == [])
        await wait_for(pilot, lambda: app.conversation_id is None)
        assert app.sub_title == "New chat" and not replies(app)

        await pilot.press("n")  # n in the list: a new chat, list closed
        await wait_for(pilot, lambda: not isinstance(app.screen, ConversationsScreen))
        assert app.conversation_id is None and app.chat.query("#empty")


async def test_view_toggles_are_applied_and_saved_by_the_app(isolated_dirs):
    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await pilot.press("ctrl+t", "ctrl+b")
        await pilot.pause()
        assert app.settings.draft_colours and not app.settings.show_sidebar
        assert app.chat.has_class("no-sidebar")
    saved, problem = config.load_settings(config.config_path())
    assert problem is None and saved.draft_colours and not saved.show_sidebar


async def test_picker_posts_the_chosen_pair_and_the_app_loads_it():
    loads: list[tuple] = []

    class Recording(FakeBackend):
        def load(self, model, draft, block_size, progress):
            loads.append((model, draft))
            return super().load(model, draft, block_size, progress)

    app = DFlashChatApp(backend_factory=Recording)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await pilot.press("f2")
        await wait_for(pilot, lambda: bool(getattr(app.screen, "rows", None)))
        await pilot.press("enter")  # the first row: the bundled offline pair
        await wait_for(pilot, lambda: len(loads) == 2 and engine_ready(app))
        assert loads[-1] == ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m-instruct-dflash")
        await pilot.press("f2")
        await wait_for(pilot, lambda: bool(getattr(app.screen, "rows", None)))
        app.screen.query_one("#target").value = "~/models/mine"
        await pilot.click("#custom")
        await wait_for(pilot, lambda: len(loads) == 3 and engine_ready(app))
        assert loads[-1] == ("~/models/mine", None)
        assert app.model == "~/models/mine" and app.info["target"] == "~/models/mine"


async def test_picker_opens_on_the_pair_in_use_and_marks_it(no_hub_cache):
    """The picker's cursor starts on the loaded pair's row, whose State says "loaded"; a
    redraw (a resize) keeps the row the user moved to."""
    qwen = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    app = DFlashChatApp(model=qwen, backend_factory=FakeBackend)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await pilot.press("f2")
        await wait_for(pilot, lambda: bool(getattr(app.screen, "rows", None)))
        picker = app.screen
        table = picker.query_one("#pairs")
        at = table.cursor_row
        assert picker.rows[at].target == qwen
        states = [str(table.get_row_at(i)[-2]) for i in range(table.row_count)]
        assert states[at].strip() == "loaded" and states.count(states[at]) == 1
        await pilot.press("up")
        await pilot.resize_terminal(130, 36)
        await wait_for(pilot, lambda: table.cursor_row == at - 1)


async def test_titles_with_square_brackets_are_text_not_markup():
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(reply="ok"))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await chat(pilot, app, "[b]bold?[/b] and [draft] notes")
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationsScreen))
        assert titles(app.screen) == ["[b]bold?[/b] and [draft] notes"]
        table = app.screen.query_one("#list")
        assert "[draft] notes" in table.get_row_at(0)[0].plain  # shown as typed
