"""Benchmark prompts: the packaged evaluation suites, JSONL prompt files, one --prompt.

MT-Bench, HumanEval and the GSM8K-100 sample ship with the package (data/suites/, licences
and sources in its NOTICE.md), so `--suite` works from any installed copy; `--data-dir` or
$DFLASH_EVAL_DATA point at another folder holding files of the same names.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DFlashError

SUITES = {"mt-bench": "mt_bench.jsonl", "humaneval": "humaneval.jsonl.gz",
          "gsm8k": "gsm8k_100.jsonl"}
PACKAGED_SUITES = Path(__file__).resolve().parent / "data" / "suites"
EVAL_DATA_ENV = "DFLASH_EVAL_DATA"
HUMANEVAL_ASK = "Complete the following Python function.\n\n```python\n{prompt}```"
PROMPT_FORMATS = {
    "mt-bench": "turn 1 (turns[0]) as one user chat message, chat template applied",
    "humaneval": ("one user chat message: " + repr(HUMANEVAL_ASK.split("{")[0])
                  + " + the code prompt in a ```python fence, chat template applied"),
    "gsm8k": "the question (`prompt`) as one user chat message, chat template applied",
    "file": "per record turns[0] if present, else `prompt`, as one user chat message, "
            "chat template applied",
    "text": "the --prompt text as one user chat message, chat template applied",
}


class BenchError(DFlashError):
    """A benchmark input the user must fix (missing file, bad record, bad option)."""


@dataclass
class BenchPrompt:
    id: str
    text: str  # the user message


def find_data_dir(explicit: str | None = None) -> Path:
    """--data-dir, else $DFLASH_EVAL_DATA, else the suites packaged with the engine."""
    chosen = explicit or os.environ.get(EVAL_DATA_ENV)
    if not chosen:
        return PACKAGED_SUITES
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise BenchError(f"evaluation data folder {path} does not exist. Fix: pass the folder "
                         "holding " + ", ".join(SUITES.values()) + f", or leave --data-dir "
                         f"and {EVAL_DATA_ENV} unset to use the packaged suites.")
    return path


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise BenchError(f"{path}: no such file. Fix: check the path.")
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchError(f"{path}:{n}: not JSON ({exc.msg}). Fix: one JSON object "
                                 "per line.") from exc
            if not isinstance(record, dict):
                raise BenchError(f"{path}:{n}: expected a JSON object per line.")
            records.append(record)
    return records


def record_prompt(record: dict, index: int, where: str, suite: str | None = None
                  ) -> BenchPrompt:
    """turns[0] when present (mt-bench style), else `prompt`."""
    turns = record.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        text = turns[0]
    elif isinstance(record.get("prompt"), str):
        text = record["prompt"]
    else:
        raise BenchError(f"{where}: record {index + 1} has neither `turns` (list of strings) "
                         "nor `prompt` (string).")
    if suite == "humaneval":
        text = HUMANEVAL_ASK.format(prompt=text)
    rid = record.get("question_id", record.get("task_id", record.get("id", index)))
    return BenchPrompt(str(rid), text)


PICKS = ("spread", "first")


def pick_records(records: list[dict], limit: int | None, pick: str = "spread") -> list[int]:
    """Indices of the records a --limit takes. `first`: the first N. `spread`: N spread over
    the records' `category` (MT-Bench's eight), the first of each category in file order, then
    the second of each, and so on: the first N alone would be one category (MT-Bench's file
    starts with its ten writing prompts). Records without categories: the first N either way."""
    if pick not in PICKS:
        raise BenchError(f"unknown pick {pick!r}. Fix: use one of {', '.join(PICKS)}.")
    n = len(records) if not limit else min(limit, len(records))
    if pick == "first" or not any("category" in r for r in records):
        return list(range(n))
    by_category: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_category.setdefault(str(r.get("category")), []).append(i)
    rounds = (group[k] for k in range(len(records)) for group in by_category.values()
              if k < len(group))
    return sorted(i for _, i in zip(range(n), rounds))


def load_prompts(prompt: str | None = None, prompt_file: str | None = None,
                 suite: str | None = None, data_dir: str | None = None,
                 limit: int | None = None, pick: str = "spread"
                 ) -> tuple[list[BenchPrompt], str]:
    """-> (prompts, prompt_format). Exactly one source should be given; `limit` prompts
    chosen by `pick_records`."""
    if prompt is not None:
        if not prompt.strip():
            raise BenchError("--prompt is empty. Fix: pass some text.")
        return [BenchPrompt("prompt", prompt)], PROMPT_FORMATS["text"]
    if prompt_file is not None:
        path = Path(prompt_file).expanduser()
        records = read_jsonl(path)
        prompts = [record_prompt(r, i, str(path)) for i, r in enumerate(records)]
        fmt = PROMPT_FORMATS["file"]
    elif suite is not None:
        if suite not in SUITES:
            raise BenchError(f"unknown suite {suite!r}. Fix: use one of {', '.join(SUITES)}.")
        path = find_data_dir(data_dir) / SUITES[suite]
        if not path.is_file():
            raise BenchError(f"{path}: the {suite} prompts are missing. Fix: put "
                             f"{SUITES[suite]} there, or point --data-dir / {EVAL_DATA_ENV} "
                             "at the folder that has it (unset both for the packaged suites).")
        records = read_jsonl(path)
        prompts = [record_prompt(r, i, str(path), suite) for i, r in enumerate(records)]
        fmt = PROMPT_FORMATS[suite]
    else:
        raise BenchError("no prompts. Fix: pass --prompt, --prompt-file or --suite.")
    prompts = [prompts[i] for i in pick_records(records, limit, pick)]
    if not prompts:
        raise BenchError(f"{path}: no prompts in the file.")
    return prompts, fmt


def encode(rt: Any, prompt: BenchPrompt | str) -> list[int]:
    """The chat-templated ids both sides get (raw text when the target has no template)."""
    text = prompt.text if isinstance(prompt, BenchPrompt) else prompt
    if getattr(rt.tokenizer, "chat_template", None) is None:
        return rt.encode(text)
    return rt.encode([{"role": "user", "content": text}])
