"""Training sequences: the target's own answers to prompts, stored as token ids."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..draft_head import RANKING_FILE


@dataclass
class Dataset:
    sequences: list[list[int]]  # prompt + response token ids
    prompt_lens: list[int]
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def response_tokens(self) -> int:
        return sum(len(s) - p for s, p in zip(self.sequences, self.prompt_lens))

    def save(self, path: Path) -> None:
        lens = np.array([len(s) for s in self.sequences], dtype=np.int64)
        flat = np.array([t for s in self.sequences for t in s], dtype=np.int32)
        if flat.size and flat.max() < 1 << 16:  # halves the file for vocabularies < 65536
            flat = flat.astype(np.uint16)
        np.savez_compressed(path, tokens=flat, lengths=lens,
                            prompt_lens=np.array(self.prompt_lens),
                            meta=np.array(json.dumps(self.meta)))

    @classmethod
    def load(cls, path: Path) -> Dataset:
        z = np.load(path)
        ends = np.cumsum(z["lengths"])
        flat = z["tokens"].astype(np.int64).tolist()
        seqs = [flat[e - n:e] for e, n in zip(ends.tolist(), z["lengths"].tolist())]
        return cls(seqs, z["prompt_lens"].tolist(), json.loads(str(z["meta"])))

    def split(self, n_val: int) -> tuple[Dataset, Dataset]:
        """Hold out `n_val` sequences spread evenly over the file: generation runs in batches
        of similar prompt length, so the tail alone would be one batch (often one template,
        maybe an easy one) and overstate tokens/cycle."""
        n_val = min(n_val, len(self) // 5)
        held = set(np.linspace(0, len(self) - 1, n_val).round().astype(int).tolist())
        kept = [i for i in range(len(self)) if i not in held]
        return self.subset(kept), self.subset(sorted(held))

    @classmethod
    def concat(cls, parts: Sequence[Dataset]) -> Dataset:
        """One dataset of `parts` in order; meta keeps each part's, under "parts"."""
        return cls([s for d in parts for s in d.sequences],
                   [p for d in parts for p in d.prompt_lens],
                   {"parts": [{**d.meta, "sequences": len(d)} for d in parts]})

    def subset(self, idx: Sequence[int]) -> Dataset:
        return Dataset([self.sequences[i] for i in idx], [self.prompt_lens[i] for i in idx],
                       self.meta)


def distinct_prompts(parts: Sequence[Dataset], exclude: Dataset | None = None
                     ) -> tuple[list[Dataset], dict[str, int]]:
    """`parts` without sequences whose prompt an earlier sequence already had (runs that
    sampled the same prompt answer it alike) or that `exclude` (the held-out answers) has.
    -> (the parts, {"duplicate_prompts": n, "held_out_prompts": m} dropped)."""
    banned = set() if exclude is None else {
        tuple(s[:p]) for s, p in zip(exclude.sequences, exclude.prompt_lens)}
    seen: set[tuple[int, ...]] = set()
    dropped = {"duplicate_prompts": 0, "held_out_prompts": 0}
    out = []
    for part in parts:
        keep = []
        for i, (s, p) in enumerate(zip(part.sequences, part.prompt_lens)):
            key = tuple(s[:p])
            if key in banned:
                dropped["held_out_prompts"] += 1
            elif key in seen:
                dropped["duplicate_prompts"] += 1
            else:
                seen.add(key)
                keep.append(i)
        out.append(part.subset(keep))
    return out, dropped


def length_grouped_order(lengths: Sequence[int], batch: int, rng: np.random.Generator,
                         group: int = 64) -> np.ndarray:
    """A shuffled order of all indices whose consecutive `batch`-sized runs hold sequences of
    similar length: a random order is cut into groups of `group` batches, each group sorted
    by length and split into batches, and the batches are shuffled. A batch is padded to its
    longest sequence, so this keeps the target's forward (most of a step) on real tokens."""
    lengths = np.asarray(lengths)
    order = rng.permutation(len(lengths))
    span = batch * group
    grouped = [chunk[np.argsort(lengths[chunk], kind="stable")]
               for chunk in (order[i:i + span] for i in range(0, len(order), span))]
    flat = np.concatenate(grouped) if grouped else order
    batches = [flat[i:i + batch] for i in range(0, len(flat), batch)]
    return np.concatenate([batches[i] for i in rng.permutation(len(batches))]) if batches \
        else flat


def parse_data_weights(text: str) -> list[tuple[str, float]]:
    """'gen-19-*.npz=1,*=0.4' -> [(file pattern, weight), ...], in order (the first pattern
    a file's name or path matches gives its weight; unmatched files weigh 1)."""
    rules = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        pattern, _, value = item.rpartition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not pattern or not weight >= 0:
            raise ValueError(f"{item!r}: give each data file pattern a weight of 0 or more, "
                             "e.g. 'gen-19-*.npz=2' or '*=0.5'")
        rules.append((pattern, weight))
    if not rules:
        raise ValueError(f"{text!r}: no PATTERN=WEIGHT rule")
    return rules


def data_weight(path: str, rules: Sequence[tuple[str, float]]) -> float:
    """A data file's weight: the first rule whose pattern (fnmatch) its name or its whole path
    matches, else 1."""
    name = Path(path).name
    return next((w for pattern, w in rules
                 if fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(path, pattern)), 1.0)


def weighted_indices(sizes: Sequence[int], weights: Sequence[float],
                     rng: np.random.Generator) -> np.ndarray:
    """One epoch's sequences when consecutive parts of `sizes` sequences weigh `weights`: a
    part of weight w is taken floor(w) times whole plus a random share w - floor(w) of it
    (so 0.4 replays 40% of an old part, drawn anew each epoch, and 2 takes a part twice)."""
    picked, start = [], 0
    for n, w in zip(sizes, weights):
        whole, share = int(w), w - int(w)
        picked += [np.arange(start, start + n)] * whole
        picked.append(start + rng.choice(n, size=round(share * n), replace=False))
        start += n
    return np.concatenate(picked) if picked else np.zeros(0, np.int64)


def token_ranking(datasets: Sequence[Dataset]) -> list[int]:
    """Token ids by how often they occur in the responses (prompts excluded: the draft
    predicts answers), most frequent first, ties by id; unseen tokens are left out."""
    responses = [np.asarray(s[p:], dtype=np.int64)
                 for d in datasets for s, p in zip(d.sequences, d.prompt_lens)]
    flat = np.concatenate(responses) if responses else np.zeros(0, np.int64)
    counts = np.bincount(flat)
    seen = np.flatnonzero(counts)
    return seen[np.argsort(-counts[seen], kind="stable")].tolist()


def write_token_ranking(ids: Sequence[int], out_dir: Path | str, source: str) -> Path:
    """OUT/token_ranking.json: `ids` (a `token_ranking`), which the runtime's draft
    vocabulary is cut from."""
    path = Path(out_dir) / RANKING_FILE
    path.write_text(json.dumps({"version": 1, "source": source, "token_ids": list(ids)}) + "\n")
    return path


def encode_prompts(tokenizer: Any, conversations: Sequence[list[dict]]) -> list[list[int]]:
    """Each conversation's chat-template prompt as token ids. One batched call: a fast
    tokenizer encodes the rendered batch in parallel, where a call per prompt does not."""
    if not conversations:
        return []
    ids = tokenizer.apply_chat_template(list(conversations), add_generation_prompt=True,
                                        tokenize=True)
    if hasattr(ids, "keys"):  # a BatchEncoding
        ids = ids["input_ids"]
    return [list(row) for row in ids]
