"""SVG snapshots on the deterministic fake engine; cursor blink off, no clock, fixed dates."""

from __future__ import annotations

from dflash_tui.app import DFlashChatApp
from dflash_tui.backends import FakeBackend
from dflash_tui.widgets.prompt import PromptInput

from .conftest import wait_for

SIZE = (120, 36)


def make_app() -> DFlashChatApp:
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(delay=0.0))
    app.settings.max_tokens = 200
    # One batch per reply: Markdown block boundaries then never depend on thread timing.
    app.worker.batch_interval = 60.0
    return app


async def settle(pilot, text: str | None = "What is speculative decoding?") -> None:
    app = pilot.app
    await wait_for(
        pilot,
        lambda: (
            bool(app.chat.query("StatsSidebar").first().info)
            if app.chat.query("StatsSidebar")
            else False
        ),
    )
    app.chat.query_one(PromptInput).cursor_blink = False
    await wait_for(pilot, lambda: bool(app.chat.query("#empty")))
    if text:
        app.chat.query_one(PromptInput).insert(text)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.chat.active is None and app.chat.reply_view is None)
    # Fixed timestamps: the conversation list shows dates.
    app.store.db.execute("UPDATE conversations SET created_at = 1.7e9, updated_at = 1.7e9")
    app.clear_notifications()
    await pilot.pause()


def test_chat_with_sidebar(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=settle)


def test_chat_draft_colours(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("ctrl+t")
        pilot.app.clear_notifications()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_compact_small_terminal(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=settle)


def test_conversation_list(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("ctrl+l")

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)
