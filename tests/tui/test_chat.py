"""Pilot tests, each run against the fake engine and the real engine on a tiny random pair."""

from __future__ import annotations

import pytest

from dflash_tui.widgets.prompt import PromptInput
from dflash_tui.widgets.sidebar import StatsSidebar
from dflash_tui.widgets.transcript import MessageView
from engine.errors import ModelNotAvailable

from .conftest import engine_ready, replies, reply_settled, send, wait_for

pytestmark = pytest.mark.asyncio


async def test_send_streams_reply_and_sidebar_changes(make_app):
    # Long enough that the real engine streams over many cycles even where the suffix lookup
    # commits a whole block at once (a tiny random target repeats itself soon).
    app = make_app(max_tokens=96)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        assert app.focused is app.chat.query_one(PromptInput)  # prompt focused at start
        await pilot.press("h", "i")  # real key presses once; send() inserts text for speed
        assert app.chat.query_one(PromptInput).text == "hi"
        app.chat.query_one(PromptInput).clear()
        task = await send(pilot, "hello")
        sidebar = app.chat.query_one(StatsSidebar)
        seen: set[int] = set()
        lengths: set[int] = set()

        def observe() -> bool:
            if sidebar.stats is not None:
                seen.add(sidebar.stats.generated)
            if replies(app):
                lengths.add(len(replies(app)[-1].content))
            return reply_settled(app)

        await wait_for(pilot, observe)
        await task
        reply = replies(app)[-1]
        assert reply.status in ("done", "length")
        assert reply.content
        assert len(seen) >= 2, "sidebar numbers should change while streaming"
        assert len(lengths) >= 2, "the reply should arrive in pieces"
        assert sidebar.stats.cycles > 0
        numbers = str(app.chat.query_one("#numbers").render())
        assert numbers  # rendered without error
        assert app.chat.query_one(PromptInput).text == ""


async def test_escape_stops_and_keeps_partial(make_app):
    app = make_app(max_tokens=400, delay=0.03)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "tell me a long story")
        await wait_for(pilot, lambda: bool(replies(app) and replies(app)[-1].content))
        await pilot.press("escape")
        assert app.chat.active is None  # stopped at once, not after the engine's next span
        reply = replies(app)[-1]
        partial = reply.content
        assert reply.status == "stopped" and partial
        assert "stopped" in str(reply.query_one(".role").render())
        await pilot.pause(0.3)  # late batches must not append to a stopped reply
        assert reply.content == partial
        stored = app.store.messages(app.conversation_id)
        assert [m.role for m in stored] == ["user", "assistant"]
        assert stored[-1].status == "stopped" and stored[-1].content == partial
        # The engine is free again: a new message streams.
        await send(pilot, "again")
        await wait_for(pilot, lambda: len(replies(app)) == 2 and replies(app)[-1].content)
        await pilot.press("escape")


async def test_history_persists_across_restart(make_app, isolated_dirs):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "remember me")
        await wait_for(pilot, lambda: reply_settled(app))
        first_reply = replies(app)[-1].content
    app2 = make_app()
    async with app2.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+l")
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app2.chat.query(MessageView)) == 2)
        views = list(app2.chat.query(MessageView))
        assert views[0].content == "remember me"
        assert views[1].content == first_reply
        # Reopening continues the same conversation.
        await wait_for(pilot, lambda: engine_ready(app2))
        await send(pilot, "and more")
        await wait_for(pilot, lambda: app2.chat.active is None and len(replies(app2)) == 2)
        assert len(app2.store.list_conversations()) == 1
        assert len(app2.store.messages(app2.conversation_id)) == 4
        # The conversation records the pair it talked to.
        conv = app2.store.get_conversation(app2.conversation_id)
        assert (conv.model, conv.draft) == (app2.info["target"], app2.info["draft"])


async def test_export_writes_markdown(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "export this")
        await wait_for(pilot, lambda: reply_settled(app))
        path = app.action_export()
        assert path is not None and path.suffix == ".md"
        text = path.read_text()
        assert text.startswith("# export this")
        assert "## You\n\nexport this" in text and "## Assistant" in text


async def test_bad_model_id_shows_error_not_traceback(make_app):
    # The engine's own message for an id that is neither a folder nor in the hub cache (the
    # tests run with HF_HUB_OFFLINE=1); the fake raises it as given, the real engine for real.
    expected = (
        "bad-org/no-such-model is not in the local Hugging Face cache and HF_HUB_OFFLINE is set."
    )
    app = make_app(
        model="bad-org/no-such-model",
        draft="bad-org/no-such-draft",
        load_error=ModelNotAvailable(expected + " Fix: pass a local folder."),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: bool(app.chat.query(".notice")))
        notice = str(app.chat.query_one(".notice").render())
        assert notice.startswith(expected), notice
        assert "Traceback" not in notice
        assert "not loaded" in str(app.chat.query_one("#pair").render())
        # Sending still saves the user's message and explains what to do.
        await send(pilot, "hi")
        await wait_for(
            pilot, lambda: app.chat.active is None and len(app.chat.query(".notice")) == 2
        )
        stored = app.store.messages(app.conversation_id)
        assert stored[0].content == "hi"
        assert "F2" in str(app.chat.query(".notice").last().render())
    assert app.return_code in (0, None)


async def test_prompt_longer_than_max_ctx_is_refused_clearly(make_app):
    app = make_app(max_ctx=64)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        long_text = " ".join(["context"] * 200)
        await send(pilot, long_text)
        await wait_for(pilot, lambda: app.chat.active is None and bool(app.chat.query(".notice")))
        notice = str(app.chat.query(".notice").last().render())
        assert notice.startswith("This conversation is ") and "(max_ctx 64)" in notice
        assert "Start a new chat (Ctrl+N)" in notice
        reply = replies(app)[-1]
        assert reply.status == "error"
        stored = app.store.messages(app.conversation_id)
        assert stored[0].content == long_text  # the user's message is kept
        assert stored[-1].status == "error"
        # A new chat works again.
        await pilot.press("ctrl+n")
        await send(pilot, "short")
        await wait_for(pilot, lambda: app.chat.active is None and replies(app)
                       and replies(app)[-1].status in ("done", "length"))


async def test_regenerate_replaces_the_last_reply(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "first question")
        # finished, not just shown: a reply still starting has no text stored yet
        await wait_for(pilot, lambda: app.chat.active is None and replies(app)
                       and replies(app)[-1].status in ("done", "length"))
        old = app.store.messages(app.conversation_id)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.chat.active is None and replies(app)
                       and replies(app)[-1].status in ("done", "length"))
        new = app.store.messages(app.conversation_id)
        assert [m.role for m in new] == ["user", "assistant"]
        assert new[0] == old[0]  # the user's turn is untouched
        assert new[1].created_at > old[1].created_at  # a new reply, not the old one kept
        assert new[1].content == old[1].content  # greedy decoding: the same text again
        assert len(replies(app)) == 1


async def test_edit_and_resend_the_last_message(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "tpyo here")
        await wait_for(pilot, lambda: reply_settled(app))
        prompt = app.chat.query_one(PromptInput)
        await pilot.press("ctrl+g")
        assert prompt.text == "tpyo here"
        await pilot.press("escape")  # cancel: nothing changes
        assert prompt.text == "" and len(app.store.messages(app.conversation_id)) == 2
        await pilot.press("ctrl+g")
        prompt.clear()
        await send(pilot, "typo fixed")
        await wait_for(pilot, lambda: app.chat.active is None and replies(app)
                       and replies(app)[-1].status in ("done", "length"))
        stored = app.store.messages(app.conversation_id)
        assert [(m.role, m.content) for m in stored][0] == ("user", "typo fixed")
        assert [m.role for m in stored] == ["user", "assistant"]
        users = [v.content for v in app.chat.query(MessageView) if v.role == "user"]
        assert users == ["typo fixed"]


async def test_error_text_with_brackets_is_shown_verbatim(make_app):
    # pip and paths print square brackets; they are text, not markup.
    text = "could not download: pip said: [notice] A new release of pip [/] is out [b]. Fix: x"
    app = make_app(model="bad-org/[weird]", load_error=ModelNotAvailable(text))
    if app.engine_kind == "real":  # the real engine words its own message; brackets stay
        text = "bad-org/[weird] is not in the local Hugging Face cache"
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: bool(app.chat.query(".notice")))
        await pilot.pause()
        assert str(app.chat.query_one(".notice").render()).startswith(text)


async def test_second_turn_reuses_the_engine_cache_and_the_sidebar_says_so(make_app):
    import io

    from rich.console import Console

    app = make_app(max_tokens=12)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        sidebar = app.chat.query_one(StatsSidebar)
        cached = []
        for text in ("the first turn", "the second turn"):
            await send(pilot, text)
            await wait_for(pilot, lambda: app.chat.active is None and replies(app)
                           and replies(app)[-1].status in ("done", "length"))
            cached.append((sidebar.stats.cached_tokens, sidebar.stats.prompt_tokens))
        assert cached[0][0] == 0  # a fresh conversation prefills everything
        # The second turn resumes the first turn's prompt and reply from the engine's cache.
        assert 0 < cached[1][0] < cached[1][1]
        console = Console(width=40, file=io.StringIO(), record=True)
        console.print(sidebar.query_one("#numbers").content)
        rows = [" ".join(line.split()) for line in console.export_text().splitlines()]
        assert f"cached {cached[1][0]} / {cached[1][1]} tokens" in rows
