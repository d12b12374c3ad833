"""User settings: one flat TOML file in the platform config dir, plus the data-dir location."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import tomllib
from platformdirs import user_config_dir, user_data_dir

from engine.config import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE  # plain Python: loads no MLX

APP_NAME = "dflash-chat"
CONFIG_DIR_ENV = "DFLASH_CHAT_CONFIG_DIR"
DATA_DIR_ENV = "DFLASH_CHAT_DATA_DIR"
MAX_TOKENS_LIMIT = 32768
BLOCK_SIZE_RANGE = (MIN_BLOCK_SIZE, MAX_BLOCK_SIZE)


def config_dir() -> Path:
    return Path(os.environ.get(CONFIG_DIR_ENV) or user_config_dir(APP_NAME))


def data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or user_data_dir(APP_NAME))


def config_path() -> Path:
    return config_dir() / "config.toml"


@dataclass
class Settings:
    theme: str = "textual-dark"
    model: str = ""  # "" -> the engine's offline default pair
    draft: str = ""
    system_prompt: str = "You are a helpful assistant."
    max_tokens: int = 512
    block_size: int = 0  # 0 -> the draft checkpoint's own block size
    show_sidebar: bool = True
    draft_colours: bool = False
    compact: bool = False


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # JSON string escaping is valid TOML basic-string escaping for our needs.
    import json

    return json.dumps(str(value))


def load_settings(path: Path | None = None) -> tuple[Settings, str | None]:
    """Read settings; a broken file gives defaults plus a message saying what to fix."""
    path = path or config_path()
    settings = Settings()
    if not path.exists():
        return settings, None
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return (
            settings,
            f"Config file {path} is unreadable ({exc}); using defaults. Fix or delete it.",
        )
    problems = []
    for f in fields(Settings):
        if f.name not in raw:
            continue
        value, default = raw[f.name], getattr(settings, f.name)
        if type(value) is not type(default):
            problems.append(f"{f.name} should be {type(default).__name__}")
            continue
        setattr(settings, f.name, value)
    if problems:
        return settings, f"Config file {path}: {'; '.join(problems)}. Those keys use defaults."
    return settings, None


def save_settings(settings: Settings, path: Path | None = None) -> None:
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(f"{k} = {_toml_value(v)}\n" for k, v in asdict(settings).items())
    tmp = path.with_suffix(".tmp")
    tmp.write_text("# dflash-chat settings\n" + body, encoding="utf-8")
    tmp.replace(path)  # atomic: a crash never leaves half a config


def validate_max_tokens(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"max tokens {text!r} is not a whole number: type e.g. 512") from None
    if not 1 <= value <= MAX_TOKENS_LIMIT:
        raise ValueError(f"max tokens must be between 1 and {MAX_TOKENS_LIMIT}, not {value}")
    return value


def validate_block_size(text: str) -> int:
    """0 or empty means the draft's own block size."""
    text = text.strip()
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"block size {text!r} is not a whole number: type e.g. 16") from None
    lo, hi = BLOCK_SIZE_RANGE
    if value != 0 and not lo <= value <= hi:
        raise ValueError(
            f"block size must be {lo}..{hi} (or 0 for the draft's default), not {value}"
        )
    return value
