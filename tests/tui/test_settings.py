"""Per-conversation settings (F5), sampling included: editing, checking, persistence in the
history (schema v3, migrated from v2 without losing anything) and what reaches the engine."""

from __future__ import annotations

import sqlite3

import pytest

from dflash_tui import config
from dflash_tui.app import DFlashChatApp, binding_rows
from dflash_tui.backends import FakeBackend
from dflash_tui.screens.modals import SettingsScreen
from dflash_tui.store import DB_NAME, MIGRATIONS, SCHEMA_VERSION, Store
from dflash_tui.worker import GenerateJob

from .conftest import engine_ready, replies, reply_settled, send, wait_for

SAMPLED = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3}


def record_jobs(app: DFlashChatApp) -> list[GenerateJob]:
    """Every job the chat screen hands the engine worker, in order."""
    jobs: list[GenerateJob] = []
    submit = app.worker.submit_generate

    def recording(job: GenerateJob) -> GenerateJob:
        jobs.append(job)
        return submit(job)

    app.worker.submit_generate = recording  # type: ignore[method-assign]
    return jobs


async def open_settings(pilot) -> SettingsScreen:
    await pilot.press("f5")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, SettingsScreen))
    return pilot.app.screen


async def fill(pilot, screen: SettingsScreen, values: dict[str, object]) -> None:
    for name, value in values.items():
        screen.field(name).value = "" if value is None else str(value)
    await pilot.press("ctrl+s")
    await pilot.pause()


def sidebar_sampling(app: DFlashChatApp) -> str:
    return str(app.chat.query_one("#sampling").render())


def reply_done(app: DFlashChatApp) -> bool:
    return reply_settled(app) and replies(app)[-1].status in ("done", "length")


@pytest.mark.asyncio
async def test_settings_edit_is_saved_shown_and_sent_with_every_turn(make_app):
    app = make_app()
    jobs = record_jobs(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        assert "greedy" in sidebar_sampling(app)
        await send(pilot, "first")
        await wait_for(pilot, lambda: reply_done(app))
        assert jobs[-1].sampling == {"temperature": 0.0, "top_p": 1.0, "top_k": 0,
                                     "min_p": 0.0, "seed": None}
        await fill(pilot, await open_settings(pilot), SAMPLED)
        assert not isinstance(app.screen, SettingsScreen)
        conv = app.store.get_conversation(app.conversation_id)
        assert {k: getattr(conv, k) for k in SAMPLED} == SAMPLED
        shown = sidebar_sampling(app)
        for part in ("temperature 0.7", "top_p 0.9", "top_k 40", "min_p 0.05", "seed 3"):
            assert part in shown, shown
        # Compact mode hides the sidebar: the speed line still says it samples.
        assert "temperature 0.7" in str(app.chat.query_one("#speed").render())
        await send(pilot, "second")
        await wait_for(pilot, lambda: reply_done(app))
        assert jobs[-1].sampling == SAMPLED  # the engine got this conversation's settings
        await pilot.press("ctrl+r")  # and again on a regenerated turn
        await wait_for(pilot, lambda: len(jobs) == 3 and reply_done(app))
        assert jobs[-1].sampling == SAMPLED
        # A new chat starts from the defaults, which the edit did not change.
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert "greedy" in sidebar_sampling(app)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("field", "text", "says"),
    [
        ("temperature", "-1", "temperature=-1.0 is invalid. Fix: use 0 (greedy) or more."),
        ("top_p", "2", "top_p=2.0 is invalid. Fix: use a probability in (0, 1]."),
        ("top_p", "0", "top_p=0.0 is invalid"),
        ("top_k", "2.5", "top_k='2.5' is not a whole number"),
        ("min_p", "1", "min_p=1.0 is invalid. Fix: use a fraction in [0, 1)."),
        ("seed", "abc", "seed='abc' is not a whole number"),
        ("max_tokens", "0", "max tokens must be between 1"),
    ],
)
async def test_a_bad_value_is_named_with_its_range_and_nothing_is_lost(field, text, says):
    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "hello")
        await wait_for(pilot, lambda: reply_done(app))
        before = app.store.get_conversation(app.conversation_id)
        screen = await open_settings(pilot)
        screen.query_one("#system").text = "Answer in French."  # typed, not yet saved
        good = "top_k" if field == "seed" else "seed"
        screen.field(good).value = "5"  # a good value beside the bad one
        await fill(pilot, screen, {field: text})
        assert app.screen is screen  # still open: what was typed is all still there
        error = str(screen.query_one("#error").render())
        assert says in error and "\n" not in error
        assert screen.field(field).value == text and app.focused is screen.field(field)
        assert screen.query_one("#system").text == "Answer in French."
        assert app.store.get_conversation(app.conversation_id) == before  # nothing saved
        # Fixed (empty sampling fields take their defaults): now it saves.
        await fill(pilot, screen, {field: "100" if field == "max_tokens" else ""})
        assert not isinstance(app.screen, SettingsScreen)
        conv = app.store.get_conversation(app.conversation_id)
        assert conv.system_prompt == "Answer in French." and getattr(conv, good) == 5


@pytest.mark.asyncio
async def test_settings_persist_per_conversation_across_restarts():
    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "sampled chat")
        await wait_for(pilot, lambda: reply_done(app))
        await fill(pilot, await open_settings(pilot), SAMPLED)
        sampled_id = app.conversation_id
        await pilot.press("ctrl+n")
        await send(pilot, "greedy chat")
        await wait_for(pilot, lambda: reply_done(app))
        greedy_id = app.conversation_id

    jobs: list[GenerateJob] = []
    again = DFlashChatApp(backend_factory=FakeBackend, conversation_id=sampled_id)
    jobs = record_jobs(again)
    async with again.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(again))
        assert again.effective().sampling == SAMPLED
        assert "temperature 0.7" in sidebar_sampling(again)
        screen = await open_settings(pilot)  # the screen shows the stored values
        assert {k: screen.field(k).value for k in SAMPLED} == {k: str(v)
                                                              for k, v in SAMPLED.items()}
        await pilot.press("escape")
        await send(pilot, "more")
        await wait_for(pilot, lambda: reply_done(again))
        assert jobs[-1].sampling == SAMPLED
        await again.open_conversation(greedy_id)  # the other conversation kept its own
        await pilot.pause()
        assert again.effective().temperature == 0.0 and "greedy" in sidebar_sampling(again)


@pytest.mark.asyncio
async def test_settings_without_a_conversation_become_the_defaults(isolated_dirs):
    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await fill(pilot, await open_settings(pilot), {"temperature": 1.2, "seed": 9})
        assert "temperature 1.2" in sidebar_sampling(app)
        await send(pilot, "new chat")
        await wait_for(pilot, lambda: reply_done(app))
        conv = app.store.get_conversation(app.conversation_id)
        assert (conv.temperature, conv.seed) == (1.2, 9)  # stored with the conversation
    saved, problem = config.load_settings(config.config_path())
    assert problem is None and (saved.temperature, saved.seed) == (1.2, 9)


def make_v2_history(path) -> None:
    """A history as the app before sampling wrote it: schema v2, one conversation."""
    db = sqlite3.connect(path)
    for migrate in MIGRATIONS[:2]:
        migrate(db)
    db.execute("PRAGMA user_version = 2")
    db.execute("INSERT INTO conversations (title, created_at, updated_at, system_prompt,"
               " max_tokens, block_size) VALUES ('old chat', 1, 1, 'Be brief.', 64, 0)")
    for i, role in enumerate(["user", "assistant"] * 3):
        db.execute("INSERT INTO messages (conversation_id, role, content, created_at, stats)"
                   " VALUES (1, ?, ?, ?, ?)", (role, f"turn {i}", i, '{"tokens": 5}'))
    db.commit()
    db.close()


@pytest.mark.asyncio
async def test_a_v2_history_migrates_keeping_every_message(isolated_dirs):
    data = isolated_dirs / "data"
    data.mkdir()
    make_v2_history(data / DB_NAME)
    store = Store(data / DB_NAME)
    before = [(m.role, m.content, m.stats) for m in store.messages(1)]
    assert store.version == SCHEMA_VERSION == 3
    conv = store.get_conversation(1)
    assert (conv.title, conv.system_prompt, conv.max_tokens) == ("old chat", "Be brief.", 64)
    assert (conv.temperature, conv.top_p, conv.top_k, conv.min_p, conv.seed) == (None,) * 5
    assert len(before) == 6 and before[0] == ("user", "turn 0", {"tokens": 5})
    store.close()
    app = DFlashChatApp(backend_factory=FakeBackend, conversation_id=1)
    app.settings.temperature = 0.5  # unset in an old conversation: the defaults apply
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        assert [(m.role, m.content, m.stats) for m in app.store.messages(1)] == before
        assert app.effective().temperature == 0.5 and app.effective().seed is None
        assert "temperature 0.5" in sidebar_sampling(app)


@pytest.mark.asyncio
async def test_same_seed_same_reply_on_the_real_engine(make_app):
    app = make_app(max_tokens=12)
    if app.engine_kind != "real":
        pytest.skip("the fake's reply is fixed text: sampling shows on the real engine")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app), timeout=60)
        await send(pilot, "pick words")
        await wait_for(pilot, lambda: reply_done(app), timeout=60)
        greedy = replies(app)[-1].content
        await fill(pilot, await open_settings(pilot), {"temperature": 1.5, "seed": 11})
        sampled = []
        for _ in range(2):
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: app.chat.active is None, timeout=60)
            await wait_for(pilot, lambda: reply_done(app), timeout=60)
            sampled.append(replies(app)[-1].content)
        assert sampled[0] == sampled[1]  # the same seed repeats the reply
        assert sampled[0] != greedy  # it was sampled, not decoded greedily


def test_the_settings_bindings_have_ids_and_are_in_help():
    ids = {row[0]: row for row in binding_rows()}
    assert ids["app.settings"][1] == "f5" and ids["settings.save"][1] == "ctrl+s"


def test_sampling_defaults_in_the_config_file_are_checked(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("temperature = 1\nseed = 4\ntop_p = 2.0\n")
    settings, problem = config.load_settings(path)
    assert settings.temperature == 1.0 and settings.seed == 4  # an int is a fine float
    assert settings.top_p == 1.0  # the bad one keeps its default...
    assert problem and "line 3: top_p=2.0 is invalid. Fix: use a probability in (0, 1]" in problem
    settings.top_p, settings.seed = 0.9, None
    config.save_settings(settings, path)
    loaded, problem = config.load_settings(path)
    assert problem is None and loaded == settings  # None (no seed) survives a save


def test_dflash_chat_sampling_flags_are_checked_before_the_app_starts(capsys):
    from dflash_tui.cli import main

    assert main(["--demo", "--temperature", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "dflash-chat: temperature=-1.0 is invalid. Fix: use 0 (greedy) or more."
