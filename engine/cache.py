"""The cache folder, and the stamps that let us trust a cached file without re-reading it.

A stamp (`<file>.stamp.json`) records the size and sha256 of a file we made. Every start
compares the size (cheap: a truncated or half-copied file is caught); `dflash doctor` and a
failed load compare the digest too. No MLX import here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

CACHE_ENV = "DFLASH_CACHE_DIR"


def cache_root() -> Path:
    """dflash-chat's cache folder ($DFLASH_CACHE_DIR overrides the platform default)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("dflash-chat"))


def unwritable(folder: Path, exc: OSError) -> str:
    """The one-line message for a cache folder we cannot write to."""
    return (f"cannot write to {folder} ({exc.strerror or exc}). Fix: make it writable, or set "
            f"{CACHE_ENV} to a writable folder.")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".stamp.json")


def write_stamp(path: Path, sha256: str | None = None) -> None:
    """Record `path`'s size and digest, atomically. Best effort: without a stamp the file is
    simply re-made next time."""
    stamp = {"size": path.stat().st_size, "sha256": sha256 or sha256_file(path)}
    tmp = stamp_path(path).with_suffix(".part")
    try:
        tmp.write_text(json.dumps(stamp))
        os.replace(tmp, stamp_path(path))
    except OSError:
        tmp.unlink(missing_ok=True)


def read_stamp(path: Path) -> dict | None:
    try:
        stamp = json.loads(stamp_path(path).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(stamp, dict) and isinstance(stamp.get("size"), int)
    return stamp if ok and isinstance(stamp.get("sha256"), str) else None


def intact(path: Path, size: int | None = None, sha256: str | None = None,
           full: bool = False) -> bool:
    """True when `path` has the expected size (and, with `full`, digest). The expectation is
    the arguments when given (a known file), else the file's stamp (one we made)."""
    if size is None or sha256 is None:
        stamp = read_stamp(path)
        if stamp is None:
            return False
        size, sha256 = stamp["size"], stamp["sha256"]
    try:
        if path.stat().st_size != size:
            return False
        return not full or sha256_file(path) == sha256
    except OSError:
        return False


def part_path(path: Path) -> Path:
    """Where this process writes `path` before renaming it into place: per process, so two
    first starts at once never write into each other's file."""
    return path.with_name(f"{path.name}.{os.getpid()}.part")


def remove_dead_parts(path: Path) -> None:
    """Half-written files for `path` left by processes that were killed (kill -9 skips every
    cleanup); those of live processes stay."""
    for part in path.parent.glob(f"{path.name}.*.part*"):
        pid = part.name[len(path.name) + 1:].split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    return True
