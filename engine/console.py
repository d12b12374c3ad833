"""The terminal's view of a model pair loading: a bar for downloads and conversions (their
fraction known), a pulsing one otherwise, gone once the pair is loaded."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

Progress = Callable[[str, "float | None"], None]


@contextlib.contextmanager
def load_progress(console: Any, title: str = "loading model pair") -> Iterator[Progress]:
    """A `progress(message, fraction)` callback for DFlashRuntime.from_pretrained that draws
    on `console` (a rich Console, e.g. stderr) while the block runs."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TaskProgressColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(title, total=None)

        def progress(message: str, fraction: float | None = None) -> None:
            bar.update(task, description=message, total=None if fraction is None else 1.0,
                       completed=fraction or 0.0)

        yield progress
