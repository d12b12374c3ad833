"""SVG snapshots on the deterministic fake engine; cursor blink off, no clock, fixed dates.

The chat screen and the model picker at 80x24 (the smallest supported terminal) and 140x40;
the settings screen at 80x24.
Update after an intended layout change: pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest

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


@pytest.fixture
def registry_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The picker's states without this machine's caches: the default pair's weights are
    there, no hub checkpoint is, and the Qwen2.5-Coder target is still to download."""
    from engine import offline, registry

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(registry, "_hub_cached", lambda repo_id: False)
    monkeypatch.setattr(offline, "is_cached", lambda model: model is offline.SMOLLM2)


@pytest.mark.parametrize("size", [(80, 24), (140, 40)], ids=["80x24", "140x40"])
def test_chat(snap_compare, size):
    assert snap_compare(make_app(), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", [(80, 24), (140, 40)], ids=["80x24", "140x40"])
def test_picker(snap_compare, registry_offline, size):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("f2")
        await wait_for(pilot, lambda: bool(getattr(pilot.app.screen, "rows", None)))
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


def test_chat_draft_colours(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("ctrl+t")
        pilot.app.clear_notifications()

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_conversation_list(snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("ctrl+l")

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_settings_with_an_error(snap_compare):
    """The settings screen fits 80x24 with every field, a bad value named in one line."""

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("f5")
        screen = pilot.app.screen
        for name, value in {"temperature": "0.7", "top_p": "2", "seed": "1"}.items():
            screen.field(name).value = value
        await pilot.press("ctrl+s")
        screen.field("top_p").cursor_blink = False
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)
