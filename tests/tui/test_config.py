"""The config file: broken files start the app on defaults and say which file and line; the
[keymap] table rebinds keys by binding id. Fake engine only (fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_tui import config
from dflash_tui.app import DFlashChatApp
from dflash_tui.backends import FakeBackend
from dflash_tui.screens.help import HelpScreen

from .conftest import engine_ready, wait_for


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def notices(app) -> list[str]:
    return [n.message for n in app._notifications]


@pytest.mark.asyncio
async def test_unparsable_config_starts_on_defaults_naming_file_and_line(tmp_path):
    text = 'theme = "textual-dark"\nmax_tokens = 300\ncompact = yes please\n'
    path = write(tmp_path, text)
    app = DFlashChatApp(backend_factory=FakeBackend, config_file=path)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        assert app.settings == config.Settings()  # every setting at its default
        assert any(m.startswith(f"Config file {path}:3: ") for m in notices(app)), notices(app)
        await pilot.press("ctrl+t")  # a change that would save settings...
        await pilot.pause()
    assert path.read_text(encoding="utf-8") == text  # ...never overwrites the user's file


def test_wrong_types_name_their_lines_and_keep_the_rest(tmp_path):
    path = write(tmp_path, 'max_tokens = "lots"\nblock_size = 8\ncolour = true\n')
    settings, problem = config.load_settings(path)
    assert settings.block_size == 8 and settings.max_tokens == config.Settings().max_tokens
    assert problem is not None and problem.startswith(f"Config file {path}: ")
    assert "line 1: max_tokens should be int, not 'lots'" in problem
    assert "line 3: unknown setting colour" in problem


@pytest.mark.asyncio
async def test_keymap_rebinds_by_binding_id(tmp_path):
    path = write(tmp_path, '[keymap]\n"chat.toggle_sidebar" = "f9"\n"chat.no_such" = "f8"\n')
    app = DFlashChatApp(backend_factory=FakeBackend, config_file=path)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        assert any("[keymap] has no binding chat.no_such" in m for m in notices(app))
        shown = app.settings.show_sidebar
        await pilot.press("ctrl+b")  # the old key no longer toggles
        await pilot.pause()
        assert app.settings.show_sidebar == shown
        await pilot.press("f9")
        await pilot.pause()
        assert app.settings.show_sidebar != shown
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.query_one("#keys")
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        assert ("f9", "chat.toggle_sidebar") in [(r[0], r[2]) for r in rows]


def test_keymap_survives_a_save(tmp_path):
    settings = config.Settings(keymap={"chat.stop": "ctrl+s"}, max_tokens=64)
    config.save_settings(settings, tmp_path / "c.toml")
    loaded, problem = config.load_settings(tmp_path / "c.toml")
    assert problem is None and loaded == settings
