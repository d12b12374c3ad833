"""The training prompt mix: real user prompts weighted across their sources, the later turns
of multi-turn records, user turns written by the target itself (Magpie), and a minor share of
the templated generator in `prompts.py`.

The real prompts come from a JSONL(.gz) file of records `{"id", "prompt", "source",
"category", "turns"?}` (the project's shared `train_prompts.jsonl.gz`). A small, fixed share
of them is held out by id and never trained on; every record is checked against the
evaluation prompts (exact match or a shared 13-word run) before use.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

Messages = list[dict]

# Sampling weights per source: the file leans to synthetic maths, the chat app is for chat.
SOURCE_WEIGHTS = {
    "sharegpt": 0.26, "evals": 0.15, "pycode": 0.14, "gsm8k_train": 0.10, "chitchat": 0.07,
    "reasoning_gym": 0.07, "mathematics": 0.06, "dooma": 0.05, "chatterbot": 0.02,
}
HELD_OUT_SHARE = 0.02
NGRAM = 13
# The benchmark's HumanEval wording: code prompts are also asked this way (other functions).
COMPLETE_ASK = "Complete the following Python function.\n\n```python\n{code}```"
# Magpie: system prompts that steer what kind of user turn the target writes.
MAGPIE_STEERS = [
    None,
    "You are a creative writing assistant. Users ask you for stories, poems, emails and essays.",
    "You are playing a character in a role-play the user sets up.",
    "You give practical advice on everyday life, health, money, work and relationships.",
    "You extract, summarize and reformat information from text the user pastes.",
    "You are a friendly conversation partner for casual chat.",
    "You are an expert programmer who helps users write and fix code.",
    "You are a patient tutor who explains science, history and maths step by step.",
]
# The order the steers take turns in (indices into MAGPIE_STEERS): creative writing three
# turns in eleven and role-play two, since the prompt file is thinnest there and the draft
# weakest (MT-Bench's writing prompts; per source, ShareGPT's chat).
MAGPIE_TURNS = (1, 0, 2, 1, 3, 4, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class PromptRecord:
    id: str
    source: str
    category: str
    turns: tuple[str, ...]  # every user turn in order (one for single-turn records)


def load_records(path: Path | str) -> list[PromptRecord]:
    opener = gzip.open if str(path).endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                turns = tuple(r.get("turns") or [r["prompt"]])
                out.append(PromptRecord(str(r["id"]), r.get("source", "unknown"),
                                        r.get("category", "unknown"), turns))
    return out


def _unit(text: str, salt: str) -> float:
    """A stable number in [0, 1) from a string (same in every process and session)."""
    digest = hashlib.sha256(f"{salt}:{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_held_out(record_id: str, share: float = HELD_OUT_SHARE) -> bool:
    """The fixed held-out split, by id: never trained on in any stage."""
    return _unit(record_id, "held-out") < share


def in_slice(record_id: str, index: int, count: int) -> bool:
    """Disjoint slices of the prompts, so each session can answer a fresh one."""
    return int(_unit(record_id, "slice") * count) == index


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def normal_text(text: str) -> str:
    """The text as compared for an exact match: its words, lower case, single-spaced."""
    return " ".join(_words(text))


def _ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


@dataclass
class Decontaminator:
    """Refuses any text equal to an evaluation prompt (whitespace and case aside) or sharing
    a 13-word run with one."""

    exact: set[str]
    grams: set[tuple[str, ...]]

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> Decontaminator:
        exact, grams = set(), set()
        for t in texts:
            exact.add(normal_text(t))
            grams |= _ngrams(t)
        return cls(exact, grams)

    def clean(self, text: str) -> bool:
        return normal_text(text) not in self.exact and not (_ngrams(text) & self.grams)


def eval_texts(data_dir: Path | str) -> list[str]:
    """Every prompt of the evaluation sets found in `data_dir` (MT-Bench turns, HumanEval,
    GSM8K); missing files are skipped."""
    texts: list[str] = []
    for name in ("mt_bench.jsonl", "humaneval.jsonl.gz", "gsm8k_100.jsonl"):
        path = Path(data_dir) / name
        if not path.is_file():
            continue
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    texts += list(r.get("turns") or []) + [r.get("prompt") or ""]
    return [t for t in texts if t.strip()]


def is_clean(record: PromptRecord, decon: Decontaminator | None) -> bool:
    return decon is None or all(decon.clean(t) for t in record.turns)


def usable(records: Sequence[PromptRecord], decon: Decontaminator | None,
           among: Sequence[PromptRecord] | None = None) -> list[PromptRecord]:
    """Drop held-out and contaminated records, and records that repeat a held-out record's
    turn under another id (the prompt file holds the same greeting or question more than
    once): a held-out prompt must never be trained on, whatever its id. The held-out records
    are those of `among` (default: `records`): a slice of the file is checked against the
    whole file's held-out turns, without checking the rest of the file for contamination."""
    held = {normal_text(t) for r in (records if among is None else among)
            if is_held_out(r.id) for t in r.turns}
    return [r for r in records if not is_held_out(r.id) and is_clean(r, decon)
            and not any(normal_text(t) in held for t in r.turns)]


def sample_by_source(records: Sequence[PromptRecord], n: int, seed: int,
                     weights: dict[str, float] = SOURCE_WEIGHTS) -> list[PromptRecord]:
    """About `n` records drawn without replacement, `weights` per source (sources not named
    get none); what a small source cannot fill goes to the others in proportion."""
    by_source: dict[str, list[PromptRecord]] = {}
    for r in records:
        if weights.get(r.source, 0) > 0:
            by_source.setdefault(r.source, []).append(r)
    rng = random.Random(seed)
    for pool in by_source.values():
        rng.shuffle(pool)
    quota = {s: 0 for s in by_source}
    left = n
    while left > 0:
        open_ = {s: weights[s] for s in by_source if quota[s] < len(by_source[s])}
        if not open_:
            break
        total = sum(open_.values())
        given = 0
        for s, w in open_.items():
            take = min(len(by_source[s]) - quota[s], max(1, round(left * w / total)))
            quota[s] += take
            given += take
        left -= given
    picked = [r for s, pool in by_source.items() for r in pool[:quota[s]]]
    rng.shuffle(picked)
    return picked[:n]


def weighted_order(records: Sequence[PromptRecord], seed: int,
                   weights: dict[str, float] = SOURCE_WEIGHTS) -> list[PromptRecord]:
    """`records` in an order whose every prefix holds the sources in proportion to `weights`
    for as long as each lasts (then the rest in proportion): a run that answers them in order
    and stops on a time budget keeps the mix. Drawing more prompts than the budget answers
    (sample_by_source over a whole slice) would otherwise keep the slice's own mix. Each
    source's k-th record sits at (k + u) / weight, u a seeded offset per source."""
    rng = random.Random(seed)
    offsets = {s: rng.random() for s in sorted({r.source for r in records})}
    seen: dict[str, int] = {}
    keyed = []
    for i, r in enumerate(records):
        k = seen[r.source] = seen.get(r.source, -1) + 1
        weight = weights.get(r.source, 0.0)
        keyed.append(((k + offsets[r.source]) / weight if weight > 0 else float("inf"), i))
    return [records[i] for _, i in sorted(keyed)]


_PYCODE = re.compile(r"Write a Python function `(?P<name>\w+)\((?P<args>.*)\)` that does the "
                     r"following:\s*(?P<doc>.+)", re.S)


def as_completion(text: str) -> str | None:
    """A pycode prompt ("Write a Python function `f(x)` that does the following: ...") asked
    as a stub to complete, the way code-completion benchmarks ask; None for other text."""
    m = _PYCODE.match(text.strip())
    if not m:
        return None
    doc = "\n    ".join(m["doc"].strip().splitlines())
    return COMPLETE_ASK.format(code=f'def {m["name"]}({m["args"]}):\n    """{doc}\n    """\n')


def first_turn_messages(record: PromptRecord, rng: random.Random) -> Messages:
    text = record.turns[0]
    if record.source == "pycode" and rng.random() < 0.5:
        text = as_completion(text) or text
    return [{"role": "user", "content": text}]


def magpie_prefix(tokenizer, steer: str | None) -> list[int]:
    """The chat template up to where a user's message begins (with an optional system
    prompt): the target continues it with a user turn of its own."""
    marker = "\x00MAGPIE\x00"
    messages = ([{"role": "system", "content": steer}] if steer else []) + [
        {"role": "user", "content": marker}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    prefix = text[:text.index(marker)]
    return list(tokenizer.encode(prefix, add_special_tokens=False))
