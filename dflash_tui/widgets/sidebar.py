"""Live statistics: the numbers that show speculative decoding at work."""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Label, Sparkline, Static

SPARK_CYCLES = 48  # recent cycles shown in the sparkline


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def speed_line(stats: Any) -> str:
    if stats is None:
        return "— tok/s · acceptance — · tokens/cycle —"
    return (
        f"{stats.tokens_per_second:.1f} tok/s · acceptance {stats.acceptance_rate:.0%}"
        f" · {stats.tokens_per_cycle:.2f} tokens/cycle"
    )


class StatsSidebar(VerticalScroll):
    DEFAULT_CSS = """
    StatsSidebar { width: 36; border-left: vkey $panel; padding: 0 1; }
    StatsSidebar .title { text-style: bold; color: $accent; margin-top: 1; }
    StatsSidebar #pair { color: $text; }
    StatsSidebar Sparkline { height: 3; margin: 0 0 1 0; }
    StatsSidebar #legend { color: $text-muted; margin-top: 1; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cycle_history: deque[int] = deque(maxlen=SPARK_CYCLES)
        self.stats: Any = None
        self.info: dict[str, Any] = {}

    def compose(self) -> ComposeResult:
        yield Label("Model pair", classes="title")
        yield Static("not loaded", id="pair")
        yield Label("Speculative decoding", classes="title")
        yield Static(id="numbers")
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
        if not info:
            self.query_one("#pair", Static).update(status or "not loaded")
            return
        text = Text()
        text.append("target ", style="dim")
        text.append(f"{info.get('target', '?')}\n")
        text.append("draft  ", style="dim")
        text.append(f"{info.get('draft', '?')}\n")
        text.append("backend ", style="dim")
        text.append(f"{info.get('backend', '?')} / {info.get('dtype', '?')}")
        text.append(f"  block {info.get('block_size', '?')}", style="dim")
        self.query_one("#pair", Static).update(text)
        self.refresh_numbers()

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
            self.query_one("#spark", Sparkline).data = list(self.cycle_history)
        self.refresh_numbers()

    def refresh_numbers(self) -> None:
        s = self.stats
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim")
        grid.add_column(justify="right")

        def row(label: str, value: str) -> None:
            grid.add_row(label, value)

        if s is None:
            for label in ("acceptance", "tokens/cycle", "tok/s", "TTFT", "prefill tok/s", "cycles"):
                row(label, "—")
            row("context", f"0 / {self.info.get('max_ctx', '—')}")
            row("peak memory", "—")
        else:
            row("acceptance", f"{s.acceptance_rate:.1%}")
            row("tokens/cycle", f"{s.tokens_per_cycle:.2f}")
            row("tok/s", f"{s.tokens_per_second:.1f}")
            row("TTFT", f"{s.ttft_s * 1000:.0f} ms")
            row("prefill tok/s", f"{s.prefill_tokens_per_second:.0f}")
            row("cycles", f"{s.cycles}")
            row("context", f"{s.ctx_used} / {s.max_ctx}")
            row("peak memory", human_bytes(s.peak_memory_bytes))
        self.query_one("#numbers", Static).update(grid)


class SpeedLine(Static):
    """One line that survives on small terminals (compact mode) when the sidebar is hidden."""

    DEFAULT_CSS = """
    SpeedLine { height: 1; padding: 0 1; background: $boost; color: $text-muted; display: none; }
    """

    def show_stats(self, stats: Any) -> None:
        self.update(speed_line(stats))
