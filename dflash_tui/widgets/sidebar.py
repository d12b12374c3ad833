"""Live statistics: the numbers that show speculative decoding at work."""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, Sparkline, Static

from dflash_tui.widgets.ids import middle_ellipsis, split_id

SPARK_CYCLES = 48  # recent cycles shown in the sparkline
COLLAPSE_CYCLES = 64  # a draft is judged over this many recent cycles...
COLLAPSE_TOKENS_PER_CYCLE = 1.2  # ...and called collapsed below this (1.0: it adds nothing)
LABEL = 7  # "target " etc.
PAUSED = "draft not paying"  # engine/pause.py's REASON (the app never imports the engine)


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def speed_line(stats: Any) -> str:
    if stats is None:
        return "— tok/s · acceptance — · tokens/cycle —"
    if not stats.speculative:  # the sidebar says why; this line at least says that it is off
        return f"{stats.tokens_per_second:.1f} tok/s · speculation off (target alone)"
    return (
        f"{stats.tokens_per_second:.1f} tok/s · acceptance {stats.acceptance_rate:.0%}"
        f" · {stats.tokens_per_cycle:.2f} tokens/cycle"
    )


def sampling_text(settings: Any, width: int = 35) -> Text:
    """The reply's sampling settings in `width` cells: only the filters that are on, each
    setting whole on its line (the lines after the first indented under the label)."""
    label = "sampling "
    text = Text(label)
    if not settings.temperature:
        text.append("greedy", style="bold")
        text.append(" (temperature 0)")
        return text
    parts = [f"temperature {settings.temperature:g}"]
    if settings.top_p < 1:
        parts.append(f"top_p {settings.top_p:g}")
    if settings.top_k:
        parts.append(f"top_k {settings.top_k}")
    if settings.min_p:
        parts.append(f"min_p {settings.min_p:g}")
    parts.append("random seed" if settings.seed is None else f"seed {settings.seed}")
    lines = [parts[0]]
    for part in parts[1:]:
        if len(label) + len(lines[-1]) + 2 + len(part) <= width:
            lines[-1] += ", " + part
        else:
            lines.append(part)
    text.append(("\n" + " " * len(label)).join(lines), style="bold")
    return text


class StatsSidebar(VerticalScroll):
    DEFAULT_CSS = """
    StatsSidebar { width: 38; border-left: vkey $panel; padding: 0 1; }
    StatsSidebar .title { text-style: bold; color: $accent; margin-top: 1; }
    StatsSidebar #pair { color: $text; }
    StatsSidebar Sparkline { height: 3; margin: 0 0 1 0; }
    StatsSidebar #legend { color: $text-muted; margin-top: 1; }
    StatsSidebar #speculation { margin-top: 1; }
    StatsSidebar #hint { color: $warning; margin-top: 1; display: none; }
    StatsSidebar #hint.visible { display: block; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cycle_history: deque[int] = deque(maxlen=SPARK_CYCLES)
        self.recent_cycles: deque[int] = deque(maxlen=COLLAPSE_CYCLES)
        self.stats: Any = None
        self.info: dict[str, Any] = {}
        self.fallback: str | None = None  # why the last reply ran without the draft

    def compose(self) -> ComposeResult:
        yield Label("Model pair", classes="title")
        yield Static("not loaded", id="pair")
        yield Static("", id="speculation")
        yield Static("", id="sampling")
        yield Label("Speculative decoding", classes="title")
        yield Static(id="numbers")
        yield Static("", id="hint")
        yield Label("tokens/cycle, recent cycles", id="spark-label")
        yield Sparkline([], id="spark", summary_function=max)
        yield Static(id="legend")

    def on_mount(self) -> None:
        self.refresh_numbers()
        self.set_legend(False)

    def set_legend(self, colours: bool) -> None:
        legend = Text()
        if colours:
            legend.append("draft-accepted", style="bold green")
            legend.append(" / target's own tokens")
        else:
            legend.append("Ctrl+T colours draft-accepted tokens")
        self.query_one("#legend", Static).update(legend)

    def set_info(self, info: dict[str, Any] | None, status: str = "") -> None:
        self.info = info or {}
        self.fallback = None
        self.recent_cycles.clear()  # a new pair is judged afresh
        self._show_hint()
        pair = self.query_one("#pair", Static)
        if not info:
            pair.update(status or "not loaded")
            pair.tooltip = None
            self.show_speculation()
            return
        target, draft = str(info.get("target") or "?"), info.get("draft")
        width = max(8, self.content_size.width or 35) - LABEL
        text = Text()
        for label, model_id in (("target", target), ("draft", draft)):
            text.append(f"{label:<{LABEL}}", style="dim")
            if not model_id:
                text.append("none\n")
                continue
            # The org on its own line, so the name is never broken in the middle of a word.
            org, name = split_id(str(model_id))
            if org:
                text.append(middle_ellipsis(org, width) + "\n" + " " * LABEL, style="dim")
            text.append(middle_ellipsis(name, width) + "\n")
        text.append(f"{'device':<{LABEL}}", style="dim")
        text.append(f"{info.get('backend', '?')} / {info.get('dtype', '?')}")
        text.append(f"  block {info.get('block_size', '?')}", style="dim")
        pair.update(text)
        pair.tooltip = f"target {target}\ndraft  {draft or 'none'}"
        self.show_speculation()
        self.refresh_numbers()

    def show_speculation(self) -> None:
        """Say whether the draft is in use, and when it is not, why."""
        text = Text()
        reason = None
        if not self.info:
            pass
        elif not self.info.get("draft"):
            reason = "no draft loaded"
        elif self.fallback:
            reason = self.fallback
        elif self.stats is not None and not self.stats.speculative:
            reason = "this reply runs on the target alone"
        if self.info:
            text.append("speculation ")
            if reason:
                text.append("off", style="bold yellow")
                text.append(f": {reason}")
            elif self.stats is not None and getattr(self.stats, "paused", False):
                # the engine decodes with the target alone until a probe finds it paying
                text.append("paused", style="bold yellow")
                text.append(f" ({PAUSED})")
            else:
                text.append("on", style="bold green")
        self.query_one("#speculation", Static).update(text)

    def set_sampling(self, settings: Any) -> None:
        """The open conversation's sampling settings (a dflash_tui.config.ChatSettings)."""
        width = max(20, self.content_size.width or 35)
        self.query_one("#sampling", Static).update(sampling_text(settings, width))

    def set_fallback(self, reason: str | None) -> None:
        """The finished reply's fallback reason (None: it was speculative)."""
        self.fallback = reason
        self.show_speculation()

    @property
    def collapsed(self) -> float | None:
        """Tokens/cycle over the last COLLAPSE_CYCLES cycles when below the threshold."""
        if len(self.recent_cycles) < COLLAPSE_CYCLES:
            return None
        mean = sum(self.recent_cycles) / len(self.recent_cycles)
        return mean if mean < COLLAPSE_TOKENS_PER_CYCLE else None

    def _show_hint(self) -> None:
        hint = self.query_one("#hint", Static)
        mean = self.collapsed
        hint.set_class(mean is not None, "visible")
        if mean is not None:
            hint.update(
                f"⚠ The draft barely helps: {mean:.2f} tokens/cycle over the last "
                f"{COLLAPSE_CYCLES} cycles (1.00 = no help). It may not match this target: "
                "try another pair (F2) or a smaller block size (F5)."
            )

    def reset(self) -> None:
        self.stats = None
        self.cycle_history.clear()
        self.query_one("#spark", Sparkline).data = []
        self.refresh_numbers()

    def update_stats(self, stats: Any, cycles: list[int]) -> None:
        if stats is not None:
            self.stats = stats
        if cycles:
            self.cycle_history.extend(cycles)
            self.recent_cycles.extend(cycles)
            self.query_one("#spark", Sparkline).data = list(self.cycle_history)
            self._show_hint()
        if stats is not None:
            self.show_speculation()  # on, off, or paused: it can change within a reply
        self.refresh_numbers()

    def refresh_numbers(self) -> None:
        s = self.stats
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim")
        grid.add_column(justify="right")

        def row(label: str, value: str) -> None:
            grid.add_row(label, value)

        if s is None:
            for label in ("acceptance", "tokens/cycle", "tok/s", "prefill (TTFT)", "cached",
                          "prefill tok/s", "cycles"):
                row(label, "—")
            row("context", f"0 / {self.info.get('max_ctx', '—')}")
            row("peak memory", "—")
        else:
            row("acceptance", f"{s.acceptance_rate:.1%}")
            row("tokens/cycle", f"{s.tokens_per_cycle:.2f}")
            row("tok/s", f"{s.tokens_per_second:.1f}")
            row("prefill (TTFT)", f"{s.ttft_s * 1000:.0f} ms")
            # Prompt tokens the engine resumed from its conversation cache instead of
            # prefilling again.
            cached = s.cached_tokens
            row("cached", f"{cached} / {s.prompt_tokens} tokens")
            row("prefill tok/s", f"{s.prefill_tokens_per_second:.0f}")
            # Cycles the suffix lookup proposed (a repeat of earlier tokens), not the draft.
            row("cycles", f"{s.cycles}" + (f" ({s.lookup_cycles} lookup)"
                                           if s.lookup_cycles else ""))
            # Tokens the target decoded alone while speculation was paused (engine/pause.py)
            paused = getattr(s, "paused_tokens", 0)
            if paused:
                row("paused", f"{paused} tokens ({getattr(s, 'pauses', 0)}x)")
            row("context", f"{s.ctx_used} / {s.max_ctx}")
            row("peak memory", human_bytes(s.peak_memory_bytes))
        self.query_one("#numbers", Static).update(grid)


class SpeedLine(Static):
    """One line that survives on small terminals (compact mode) when the sidebar is hidden."""

    DEFAULT_CSS = """
    SpeedLine { height: 1; padding: 0 1; background: $boost; color: $text-muted; display: none; }
    """

    temperature = 0.0  # shown when sampling: the sidebar that says it may be hidden
    stats: Any = None

    def show_stats(self, stats: Any) -> None:
        self.stats = stats
        note = f" · temperature {self.temperature:g}" if self.temperature else ""
        self.update(speed_line(stats) + note)

    def set_temperature(self, temperature: float) -> None:
        self.temperature = temperature
        self.show_stats(self.stats)
