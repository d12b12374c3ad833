"""The UI thread is never blocked by generation."""

from __future__ import annotations

import asyncio
import time

import pytest

from dflash_tui.app import DFlashChatApp
from dflash_tui.backends import FakeBackend
from dflash_tui.widgets.prompt import PromptInput

from .conftest import engine_ready, send, wait_for

pytestmark = pytest.mark.asyncio


async def test_input_accepted_while_long_reply_streams():
    long_reply = " ".join(f"w{i}" for i in range(2000))
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(delay=0.002, reply=long_reply))
    app.settings.max_tokens = 2000
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "go")
        await wait_for(pilot, lambda: len(app.chat.reply_view.content) > 200)
        prompt = app.chat.query_one(PromptInput)
        start = time.monotonic()
        key_task = asyncio.create_task(pilot.press("x"))
        await wait_for(pilot, lambda: prompt.text == "x", timeout=3)
        latency = time.monotonic() - start
        assert app.chat.active is not None, "the reply should still be streaming"
        # Streaming the whole reply takes ~4 s; a blocked UI would wait for all of it.
        assert latency < 1.5, f"a key press took {latency:.2f}s to reach the prompt"
        await pilot.press("escape")
        await key_task
