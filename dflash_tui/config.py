"""User settings: one flat TOML file in the platform config dir, plus the data-dir location."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from platformdirs import user_config_dir, user_data_dir

from engine.config import (  # plain Python: loads no MLX
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    SamplingParams,
)
from engine.errors import ConfigError

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
    # Sampling for new conversations (engine.config.SamplingParams): temperature 0 is greedy.
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None  # None (absent from the file): a fresh seed every reply
    show_sidebar: bool = True
    draft_colours: bool = False
    compact: bool = False
    # binding id -> keys, e.g. {"chat.stop": "ctrl+s"}; the [keymap] table of the file, applied
    # with Textual's keymap support. F1 lists every binding id.
    keymap: dict[str, str] = field(default_factory=dict)


SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed")  # SamplingParams' fields


@dataclass
class ChatSettings:
    """What a reply is generated with: the conversation's own values over the defaults."""

    system_prompt: str
    max_tokens: int
    block_size: int  # 0: the draft's own
    temperature: float = 0.0  # 0: greedy, exact
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None  # None: a fresh seed every reply

    @property
    def sampling(self) -> dict[str, float | int | None]:
        """generate()'s sampling keywords."""
        return {k: getattr(self, k) for k in SAMPLING}


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
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
        expected = int if f.name == "seed" else type(default)
        if expected is float and type(value) is int:
            value = float(value)  # "temperature = 1" means 1.0
        if type(value) is not expected:
            kind = "a table" if isinstance(default, dict) else expected.__name__
            problems.append(f"{at}: {f.name} should be {kind}, not {value!r}")
            continue
        if f.name in SAMPLING:
            try:
                SamplingParams(**{f.name: value})
            except ConfigError as exc:
                problems.append(f"{at}: {exc}")
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
    values = {k: v for k, v in asdict(settings).items() if v is not None}  # TOML has no null
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


def validate_sampling(name: str, text: str) -> float | int | None:
    """One sampling field of the settings screen (a SamplingParams field name and the typed
    text) -> its value, or ValueError naming the field and its valid range, worded as the CLI
    and the server word it. Empty: the field's default (for seed: a fresh seed every reply)."""
    text = text.strip()
    if not text:
        return getattr(SamplingParams(), name)
    whole = name in ("top_k", "seed")
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        example = {"top_k": "40", "seed": "1", "temperature": "0.7"}.get(name, "0.05")
        kind = "a whole number" if whole else "a number"
        raise ValueError(f"{name}={text!r} is not {kind}. Fix: type e.g. {example}.") from None
    try:
        SamplingParams(**{name: value})
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return value
