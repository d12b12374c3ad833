"""Help, palette, settings validation and CLI: fake engine only (fast)."""

from __future__ import annotations

import pytest

from dflash_tui.app import DFlashChatApp, binding_rows
from dflash_tui.backends import FakeBackend
from dflash_tui.cli import build_parser
from dflash_tui.screens.help import HelpScreen

from .conftest import engine_ready, wait_for


@pytest.mark.asyncio
async def test_help_lists_every_binding_id():
    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        ids = {row[0] for row in binding_rows()}
        for needed in (
            "app.quit",
            "chat.stop",
            "chat.toggle_colours",
            "message.copy",
            "app.pick_model",
            "app.conversations",
            "app.export",
        ):
            assert needed in ids
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.asyncio
async def test_palette_has_an_entry_for_every_action():
    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        titles = {c.title for c in app.get_system_commands(app.screen)}
        for word in (
            "Model pair",
            "Conversations",
            "export",
            "settings",
            "stop",
            "copy",
            "draft colours",
            "sidebar",
            "compact",
            "rename",
            "new",
            "Help",
        ):
            assert any(word.lower() in t.lower() for t in titles), word


def test_cli_help_documents_options(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for text in ("--model", "--draft", "--demo", "DFLASH_CHAT_DATA_DIR", "Ctrl+Q"):
        assert text in out
