"""Render real screenshots of dflash-chat into screenshots/ (SVG, plus PNG if cairosvg is there).

    python scripts/screenshots.py            # demo engine (deterministic, no model needed)
    python scripts/screenshots.py --real     # the real engine on the offline default pair

Runs the app headless with app.run_test + Pilot and saves app.save_screenshot() output.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "screenshots"
SIZE = (130, 40)


async def wait(cond, timeout: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise TimeoutError("screenshot step timed out")
        await asyncio.sleep(0.05)


async def shoot(real: bool) -> list[Path]:
    from dflash_tui.app import DFlashChatApp
    from dflash_tui.backends import FakeBackend, RealBackend
    from dflash_tui.widgets.prompt import PromptInput

    app = DFlashChatApp(backend_factory=RealBackend if real else FakeBackend)
    app.settings.max_tokens = 160
    saved: list[Path] = []

    def save(name: str) -> None:
        app.clear_notifications()
        saved.append(Path(app.save_screenshot(f"{name}.svg", str(OUT))))

    async with app.run_test(size=SIZE) as pilot:
        sidebar = lambda: app.chat.query("StatsSidebar")  # noqa: E731
        await wait(lambda: bool(sidebar()) and bool(sidebar().first().info))
        prompt = app.chat.query_one(PromptInput)
        prompt.cursor_blink = False
        for text in ("What is speculative decoding?", "Explain the acceptance rate."):
            prompt.insert(text)
            await pilot.press("enter")
            await wait(lambda: app.chat.active is None)
        app.store.rename_conversation(app.conversation_id, "Speculative decoding, explained")
        app.sub_title = "Speculative decoding, explained"
        await pilot.press("ctrl+t")  # draft-accepted tokens coloured
        await pilot.pause()
        save("chat")
        await pilot.press("ctrl+t")
        await pilot.press("ctrl+n")
        prompt.insert("Write a haiku about GPUs")
        await pilot.press("enter")
        await wait(lambda: app.chat.active is None)
        await pilot.press("ctrl+l")
        await pilot.pause(0.3)
        save("conversations")
        await pilot.press("escape")
        await pilot.press("f2")
        await pilot.pause(1.0)  # registry states are read in a thread
        save("picker")
        await pilot.press("escape")
        await pilot.press("f1")
        await pilot.pause()
        save("help")
    return saved


def to_png(svgs: list[Path]) -> None:
    try:
        import cairosvg  # only for this script: pip install cairosvg
    except ImportError:
        print("cairosvg not installed: SVG only (pip install cairosvg for PNGs)")
        return
    for svg in svgs:
        cairosvg.svg2png(url=str(svg), write_to=str(svg.with_suffix(".png")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="use the real engine, not the demo")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:  # never touch the user's history or config
        os.environ["DFLASH_CHAT_DATA_DIR"] = f"{tmp}/data"
        os.environ["DFLASH_CHAT_CONFIG_DIR"] = f"{tmp}/config"
        OUT.mkdir(exist_ok=True)
        svgs = asyncio.run(shoot(args.real))
    to_png(svgs)
    for path in svgs:
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
