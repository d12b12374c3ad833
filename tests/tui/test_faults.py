"""Damaged or unwritable history: the app heals (moving the damaged file aside, never deleting
it) or stops with one line naming the folder and the fix."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from dflash_tui.app import DFlashChatApp
from dflash_tui.backends import FakeBackend
from dflash_tui.cli import main
from dflash_tui.store import DB_NAME, SchemaTooNew, Store

from .conftest import engine_ready, reply_settled, send, wait_for


def damaged_by_garbage(path: Path) -> None:
    path.write_bytes(b"this is not an SQLite database, it is what a bad copy left\n" * 200)


def damaged_in_the_middle(path: Path) -> None:
    store = Store(path)
    conv = store.create_conversation("kept")
    for i in range(400):
        store.add_message(conv.id, "user", f"message {i} " * 40)
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8192] = os.urandom(8192)  # a run of pages overwritten
    path.write_bytes(bytes(data))


@pytest.mark.asyncio
@pytest.mark.parametrize("damage", [damaged_by_garbage, damaged_in_the_middle])
async def test_damaged_history_is_moved_aside_and_a_fresh_one_starts(isolated_dirs, damage):
    data = isolated_dirs / "data"
    data.mkdir()
    damage(data / DB_NAME)
    before = (data / DB_NAME).read_bytes()
    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        aside = app.store.moved_aside
        assert aside is not None and aside.parent == data
        assert aside.name.startswith(f"{DB_NAME}.corrupt-")
        assert aside.read_bytes() == before  # kept byte for byte
        notes = [n.message for n in app._notifications]
        assert any(f"It was moved to {aside} (kept, not deleted)" in m for m in notes), notes
        await send(pilot, "a fresh start")  # the new history works
        await wait_for(pilot, lambda: reply_settled(app))
        assert [m.content for m in app.store.messages(app.conversation_id)][0] == "a fresh start"


def test_newer_schema_is_refused_not_moved(isolated_dirs):
    path = isolated_dirs / "data" / DB_NAME
    Store.open_default(path.parent).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(SchemaTooNew):
        Store.open_default(path.parent)
    assert sorted(p.name for p in path.parent.glob(f"{DB_NAME}*")) == [DB_NAME]


@pytest.fixture
def readonly_dir(tmp_path: Path):
    """A folder nobody may write, root included (root ignores file modes: a read-only mount)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() == 0:
        cmd = ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a read-only folder here: {done.stderr.strip()}")
        yield folder
        subprocess.run(["umount", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)


@pytest.mark.parametrize("sub", ["", "history"], ids=["folder", "subfolder"])
def test_readonly_data_folder_is_one_clear_line(readonly_dir, capsys, sub):
    folder = readonly_dir / sub if sub else readonly_dir
    assert main(["--demo", "--data-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"dflash-chat: cannot write the chat history in {folder} (")
    assert "Fix: make that folder writable, or choose another with --data-dir" in err
