"""Render real screenshots of dflash-chat into screenshots/ (SVG, and PNG for the README).

    python scripts/screenshots.py            # demo engine (deterministic, no model needed)
    python scripts/screenshots.py --real     # the real engine on the offline default pair
    python scripts/screenshots.py --real --model qwen2.5-coder-1.5b   # the README's: a real
                                             # chat with the Qwen pair on this machine's CPU

PNGs need `pip install pillow`. Runs the app headless with app.run_test + Pilot. The SVG is
Textual's own screenshot. The PNG is drawn cell by cell from the same screen on a fixed grid
with DejaVu Sans Mono (apt: fonts-dejavu-core; --font-dir for another folder), block elements
as rectangles: an SVG rasteriser
would stretch each text run to its own length (spreading coloured words apart) and fall back
to a proportional font for glyphs the monospace one lacks.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "screenshots"
SIZE = (130, 40)
FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu", "/Library/Fonts")
FONT_PX = 16
STAND_INS = {"\u2b58": "\u25cb"}  # glyphs no DejaVu font has -> the nearest one it has


async def wait(cond, timeout: float = 900.0) -> None:  # a busy CPU on --real is slow
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise TimeoutError("screenshot step timed out")
        await asyncio.sleep(0.05)


def screen_lines(app) -> list[list]:
    """The current screen as rows of Rich segments, exactly as Textual's screenshot sees it."""
    from rich.console import Console
    from rich.segment import Segment

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(
        full=True, screen_stack=app._background_screens))
    segments = list(Segment.filter_control(console._record_buffer))
    return list(Segment.split_and_crop_lines(segments, length=width))


class Painter:
    """Draws segments onto a fixed cell grid."""

    def __init__(self, font_dir: Path, px: int = FONT_PX) -> None:
        from PIL import ImageFont

        def load(name: str):
            return ImageFont.truetype(str(font_dir / name), px,
                                      layout_engine=ImageFont.Layout.BASIC)

        self.regular = load("DejaVuSansMono.ttf")
        self.bold = load("DejaVuSansMono-Bold.ttf")
        self.fallback = [load("DejaVuSans.ttf")]  # symbols the monospace font lacks
        ascent, descent = self.regular.getmetrics()
        self.cell_w = round(self.regular.getlength("M"))
        self.cell_h = ascent + descent
        self.baseline = ascent
        self._missing = {}
        self._has: dict[tuple[int, str], bool] = {}

    def font_for(self, ch: str, bold: bool):
        font = self.bold if bold else self.regular
        key = (id(font), ch)
        if key not in self._has:
            if id(font) not in self._missing:  # what the font draws for a glyph it lacks
                self._missing[id(font)] = self._glyph(font, "\uffff")
            self._has[key] = self._glyph(font, ch) != self._missing[id(font)]
        if self._has[key]:
            return font
        return self.fallback[0]

    def _glyph(self, font, ch: str) -> bytes:
        from PIL import Image, ImageDraw

        image = Image.new("L", (self.cell_w * 3, self.cell_h * 2))
        ImageDraw.Draw(image).text((0, 0), ch, font=font, fill=255)
        return image.tobytes()

    def block(self, draw, ch: str, x: int, y: int, colour) -> bool:
        """Block elements as exact rectangles, so borders and bars join up."""
        w, h = self.cell_w, self.cell_h
        o = ord(ch)
        box = None
        if o == 0x2580:
            box = (0, 0, 1, 0.5)
        elif 0x2581 <= o <= 0x2588:
            box = (0, 1 - (o - 0x2580) / 8, 1, 1)
        elif 0x2589 <= o <= 0x258F:
            box = (0, 0, (0x2590 - o) / 8, 1)
        elif o == 0x2590:
            box = (0.5, 0, 1, 1)
        elif o == 0x2594:
            box = (0, 0, 1, 1 / 8)
        elif o == 0x2595:
            box = (7 / 8, 0, 1, 1)
        if box is None:
            return False
        x0, y0, x1, y1 = box
        draw.rectangle((x + round(x0 * w), y + round(y0 * h), x + round(x1 * w) - 1,
                        y + round(y1 * h) - 1), fill=colour)
        return True

    def paint(self, lines: list[list], path: Path) -> None:
        from PIL import Image, ImageDraw
        from rich.cells import cell_len
        from rich.style import Style
        from rich.terminal_theme import DEFAULT_TERMINAL_THEME as THEME

        width = max((sum(cell_len(s.text) for s in line) for line in lines), default=0)
        image = Image.new("RGB", (width * self.cell_w, len(lines) * self.cell_h),
                          THEME.background_color.hex)
        draw = ImageDraw.Draw(image)
        for row, line in enumerate(lines):
            y = row * self.cell_h
            col = 0
            for text, style, _control in line:
                style = style or Style()
                fg = (style.color.get_truecolor(THEME).hex if style.color
                      else THEME.foreground_color.hex)
                bg = (style.bgcolor.get_truecolor(THEME).hex
                      if style.bgcolor and not style.bgcolor.is_default else None)
                if style.reverse:
                    fg, bg = bg or THEME.background_color.hex, fg
                if style.dim:
                    fg = _blend(fg, bg or THEME.background_color.hex)
                for ch in text:
                    cells = cell_len(ch)
                    ch = STAND_INS.get(ch, ch)
                    x = col * self.cell_w
                    if bg:
                        draw.rectangle((x, y, x + cells * self.cell_w - 1, y + self.cell_h - 1),
                                       fill=bg)
                    if ch != " " and not self.block(draw, ch, x, y, fg):
                        font = self.font_for(ch, bool(style.bold))
                        draw.text((x, y + self.baseline), ch, font=font, fill=fg, anchor="ls")
                    if style.underline:
                        draw.line((x, y + self.cell_h - 2, x + cells * self.cell_w - 1,
                                   y + self.cell_h - 2), fill=fg)
                    col += cells
        image.save(path, optimize=True)


def _blend(fg: str, bg: str, amount: float = 0.5) -> str:
    a = [int(fg[i:i + 2], 16) for i in (1, 3, 5)]
    b = [int(bg[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x * amount + y * (1 - amount)):02x}" for x, y in zip(a, b))


def find_font_dir(given: str | None) -> Path | None:
    for folder in ([given] if given else FONT_DIRS):
        if folder and (Path(folder) / "DejaVuSansMono.ttf").is_file():
            return Path(folder)
    return None


# What the chat screenshot asks (a code question and its follow-up: what the pairs are for)
CHAT = ("Write a Python function that returns the n-th Fibonacci number.",
        "Now memoize it and add a docstring.")
TITLE = "Fibonacci, memoized"


async def shoot(real: bool, painter: Painter | None, model: str | None = None) -> list[Path]:
    from dflash_tui.app import DFlashChatApp
    from dflash_tui.backends import FakeBackend, RealBackend
    from dflash_tui.widgets.prompt import PromptInput

    app = DFlashChatApp(model=model, backend_factory=RealBackend if real else FakeBackend)
    app.settings.max_tokens = 160
    saved: list[Path] = []

    def save(name: str) -> None:
        app.clear_notifications()
        saved.append(Path(app.save_screenshot(f"{name}.svg", str(OUT))))
        if painter is not None:
            painter.paint(screen_lines(app), OUT / f"{name}.png")

    async with app.run_test(size=SIZE) as pilot:
        await wait(lambda: bool(app.info))
        prompt = app.chat.query_one(PromptInput)
        prompt.cursor_blink = False
        for text in CHAT:
            prompt.insert(text)
            await pilot.press("enter")
            await wait(lambda: app.chat.active is None)
        await pilot.pause()
        app.store.rename_conversation(app.conversation_id, TITLE)
        app.sub_title = TITLE
        await pilot.press("ctrl+t")  # draft-accepted tokens coloured
        await pilot.pause(0.3)
        app.clear_notifications()
        await pilot.pause()
        save("chat")
        await pilot.press("ctrl+t")
        await pilot.press("ctrl+n")
        await pilot.pause()
        prompt.insert("Write a haiku about GPUs")
        await pilot.press("enter")
        await wait(lambda: app.chat.active is None)
        await pilot.press("ctrl+l")
        await pilot.pause(0.3)
        save("conversations")
        await pilot.press("escape")
        await pilot.press("f2")
        await wait(lambda: bool(getattr(app.screen, "rows", None)))
        await pilot.pause(0.3)
        save("picker")
        await pilot.press("escape")
        await pilot.press("f1")
        await pilot.pause(0.3)
        save("help")
        await pilot.press("escape")
        await pilot.press("f5")
        await pilot.pause(0.3)
        for name, value in {"temperature": "0.7", "top_p": "0.95", "seed": "1"}.items():
            app.screen.field(name).value = value  # typed, not saved: the screen as it is used
        app.screen.field("seed").cursor_blink = False
        await pilot.pause(0.3)
        save("settings")
    return saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", action="store_true", help="use the real engine, not the demo")
    parser.add_argument("--model", help="with --real: the pair's target (default: the offline "
                        "default pair), e.g. qwen2.5-coder-1.5b")
    parser.add_argument("--font-dir", help="folder with DejaVuSansMono*.ttf and DejaVuSans.ttf")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    painter = None
    try:
        import PIL  # noqa: F401 - only this script needs it
    except ImportError:
        print("pillow not installed: SVG only (pip install pillow for the README PNGs)")
    else:
        font_dir = find_font_dir(args.font_dir)
        if font_dir is None:
            print("DejaVu Sans Mono not found: SVG only. Fix: apt-get install fonts-dejavu-core "
                  "or pass --font-dir")
        else:
            painter = Painter(font_dir)
    with tempfile.TemporaryDirectory() as tmp:  # never touch the user's history or config
        os.environ["DFLASH_CHAT_DATA_DIR"] = f"{tmp}/data"
        os.environ["DFLASH_CHAT_CONFIG_DIR"] = f"{tmp}/config"
        OUT.mkdir(exist_ok=True)
        svgs = asyncio.run(shoot(args.real, painter, args.model))
    for path in svgs:
        print(path.relative_to(ROOT), "(+ .png)" if painter else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
