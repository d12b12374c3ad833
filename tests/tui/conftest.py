"""TUI fixtures: isolated data/config dirs, app factories for the fake and the real engine."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test may reach the network
os.environ["TZ"] = "UTC"  # dates in the conversation list are part of snapshots
time.tzset()


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DFLASH_CHAT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DFLASH_CHAT_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    from tiny_pairs import make_tiny_pair

    target, draft = make_tiny_pair(tmp_path_factory.mktemp("tui-pair"))
    return str(target), str(draft)


@pytest.fixture(params=["fake", "real"])
def make_app(request: pytest.FixtureRequest) -> Callable[..., object]:
    """App factory: the deterministic fake engine, or the real one on a tiny random pair."""
    from dflash_tui.app import DFlashChatApp
    from dflash_tui.backends import FakeBackend, RealBackend

    kind = request.param

    def factory(
        model: str | None = None,
        draft: str | None = None,
        max_tokens: int = 24,
        delay: float = 0.02,
        load_error: Exception | None = None,
        max_ctx: int | None = None,
        **kw,
    ) -> DFlashChatApp:
        """`load_error`: what the fake's load raises (the real engine raises its own)."""
        if kind == "fake":
            reply = " ".join(f"word{i}" for i in range(max_tokens))  # one token per word
            ctx = {} if max_ctx is None else {"max_ctx": max_ctx}

            def backend() -> FakeBackend:
                return FakeBackend(delay=delay, reply=reply, load_error=load_error, **ctx)
        else:
            if model is None:
                model, draft = request.getfixturevalue("tiny_pair")

            def backend() -> RealBackend:
                return RealBackend(max_ctx=max_ctx)
        app = DFlashChatApp(model=model, draft=draft, backend_factory=backend, **kw)
        app.settings.max_tokens = max_tokens
        app.engine_kind = kind  # type: ignore[attr-defined]
        return app

    return factory


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = 20.0) -> None:
    # asyncio.sleep, not pilot.pause: pause waits for an idle screen, which never comes while
    # a reply streams, so it would hide every intermediate state.
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def replies(app) -> list:
    from dflash_tui.widgets.transcript import MessageView

    return [v for v in app.chat.query(MessageView) if v.role == "assistant"]


def reply_settled(app) -> bool:
    """No reply is streaming and at least one has been shown. The status counts too: a new
    reply's view is mounted (streaming) a moment before its job is submitted, and a test's
    poll can fall in between."""
    shown = replies(app)
    return (app.chat.active is None and bool(shown)
            and all(v.status != "streaming" for v in shown))


def engine_ready(app) -> bool:
    return bool(app.chat.query_one("StatsSidebar").info)


async def send(pilot, text: str) -> asyncio.Task:
    """Type and press Enter without waiting for idle (Pilot's press waits until every queue is
    empty, i.e. until the whole reply has streamed). Await the task once the reply is done."""
    from dflash_tui.widgets.prompt import PromptInput

    # Insert rather than press each key: Pilot idles ~0.1 s per key press.
    pilot.app.chat.query_one(PromptInput).insert(text)
    task = asyncio.create_task(pilot.press("enter"))
    await wait_for(pilot, lambda: pilot.app.chat.active is not None or task.done())
    return task


def type_at_once(app, data: str) -> None:
    """`data` as one read of terminal input, as `tmux send-keys "hi" Enter` or a paste tool
    delivers it ("\r" is Enter, "\n" Ctrl+J): parsed by Textual's own terminal parser and posted
    back to back, the way its Linux driver does. Pilot's press() cannot show this: it waits for
    the app to go idle after every key, so each key is handled before the next arrives."""
    from textual._xterm_parser import XTermParser

    parser = XTermParser()
    for event in [*parser.feed(data), *parser.tick()]:
        app._driver.process_message(event)


@pytest.fixture
def no_hub_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry as a machine with no hub downloads and only the SmolLM2 GGUF sees it."""
    from engine import offline, registry

    monkeypatch.setattr(registry, "_hub_cached", lambda repo_id: False)
    monkeypatch.setattr(offline, "is_cached", lambda model: model is offline.SMOLLM2)
