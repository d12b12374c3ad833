"""User settings: one flat TOML file in the platform config dir, plus the data-dir location."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from platformdirs import user_config_dir, user_data_dir

from engine.config import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE  # plain Python: loads no MLX

APP_NAME = "dflash-chat"
CONFIG_DIR_ENV = "DFLASH_CHAT_CONFIG_DIR"
DATA_DIR_ENV = "DFLASH_CHAT_DATA_DIR"
MAX_TOKENS_LIMIT = 32768


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
    # binding id -> keys, e.g. {"chat.stop": "ctrl+s"}; the [keymap] table of the file, applied
    # with Textual's keymap support. F1 lists every binding id.
    keymap: dict[str, str] = field(default_factory=dict)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # JSON string escaping is valid TOML basic-string escaping for our needs.
    import json

    return json.dumps(str(value))


def _line_of(text: str, key: str) -> int | None:
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*\"?{re.escape(key)}\"?\s*=", line):
            return number
    return None


def load_settings(path: Path | None = None) -> tuple[Settings, str | None]:
    """Read settings; a broken file gives defaults plus a message naming the file, the line
    and the fix. The file itself is left as it is (saving rewrites it only on a change)."""
    path = path or config_path()
    settings = Settings()
    if not path.exists():
        return settings, None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return settings, (
            f"Config file {path} cannot be read ({exc}); using the defaults. Fix: make it "
            "readable, or delete it."
        )
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message ends "(at line N, column M)": say it the way an editor would look for it.
        where = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        what = re.sub(r"\s*\(at line.*\)$", "", str(exc))
        at = f"{path}:{where.group(1)}" if where else str(path)
        return (
            settings,
            f"Config file {at}: {what}. Using the defaults for every setting, and changes made "
            "in the app are not saved over it; fix that line or delete the file.",
        )
    problems = []
    for f in fields(Settings):
        if f.name not in raw:
            continue
        value, default = raw[f.name], getattr(settings, f.name)
        line = _line_of(text, f.name) or _line_of(text, f"[{f.name}]")
        at = f"line {line}" if line else "?"
        if type(value) is not type(default):
            kind = "a table" if isinstance(default, dict) else type(default).__name__
            problems.append(f"{at}: {f.name} should be {kind}, not {value!r}")
            continue
        if isinstance(value, dict):
            bad = [k for k, v in value.items() if not isinstance(v, str)]
            for k in bad:
                problems.append(f"line {_line_of(text, k) or '?'}: keymap {k} should be a key "
                                "string such as \"ctrl+s\"")
            value = {k: v for k, v in value.items() if k not in bad}
        setattr(settings, f.name, value)
    unknown = sorted(set(raw) - {f.name for f in fields(Settings)})
    for key in unknown:
        problems.append(f"line {_line_of(text, key) or '?'}: unknown setting {key}")
    if problems:
        return settings, (
            f"Config file {path}: {'; '.join(problems)}. Those use the defaults, and changes made "
            "in the app are not saved over the file until it is fixed."
        )
    return settings, None


def save_settings(settings: Settings, path: Path | None = None) -> None:
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    values = asdict(settings)
    keymap = values.pop("keymap")
    body = "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items())
    body += "\n# Rebind keys by binding id (F1 lists them), e.g. \"chat.stop\" = \"ctrl+s\"\n"
    body += "[keymap]\n" + "".join(f"{_toml_value(k)} = {_toml_value(v)}\n"
                                   for k, v in keymap.items())
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
    lo, hi = MIN_BLOCK_SIZE, MAX_BLOCK_SIZE
    if value != 0 and not lo <= value <= hi:
        raise ValueError(
            f"block size must be {lo}..{hi} (or 0 for the draft's default), not {value}"
        )
    return value
