"""One data run: the target answers the prompt mix (see `mix`) in phases, each saved when it
ends, so an interrupted run resumes at the phase it was in.

Phases, in order: `heldout` (a fixed sample of held-out real prompts, for validation only),
`single` (first turns of real prompts, weighted by source), `multiturn` (multi-turn records
replayed turn by turn with the target's own answers), `magpie` (user turns the target writes
itself, then answers) and `templated` (the seeded template generator). Each phase gets its
share of the time budget plus what earlier phases left unused.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .dataset import Dataset, encode_prompts
from .generate import answer_prompts, as_dataset
from .mix import (
    MAGPIE_STEERS,
    MAGPIE_TURNS,
    Decontaminator,
    PromptRecord,
    eval_texts,
    first_turn_messages,
    in_slice,
    is_clean,
    is_held_out,
    load_records,
    magpie_prefix,
    normal_text,
    sample_by_source,
    usable,
    weighted_order,
)

PHASES = ("heldout", "single", "multiturn", "magpie", "templated")
TIME_SHARES = {"heldout": 0.03, "single": 0.47, "multiturn": 0.2, "magpie": 0.2,
               "templated": 0.1}


@dataclass
class MixConfig:
    prompts_file: str
    num_prompts: int  # first turns of real prompts; the other phases are sized from it
    max_new: int = 1024
    batch: int = 512
    token_budget: int = 1 << 21
    seconds: float | None = None
    seed: int = 0
    slice: tuple[int, int] = (0, 1)  # (index, count): disjoint prompt slices per run
    eval_dir: str | None = None  # evaluation sets to decontaminate against
    heldout_size: int = 256
    multiturn_share: float = 0.1  # multi-turn records, as a share of num_prompts
    magpie_share: float = 0.2
    templated_share: float = 0.1
    max_turns: int = 4
    max_prompt_len: int = 1536
    loop_keep: int = 16
    attention: str = "auto"  # a decode step's attention (generate.decode_logits, RunningBatch)
    in_place: bool = True  # each decode step queued after the last (generate.RunningBatch)
    skip_answered: tuple[str, ...] = ()  # datasets (.npz) whose prompts are not asked again
    time_shares: dict[str, float] = field(default_factory=lambda: dict(TIME_SHARES))


def parse_time_shares(text: str) -> dict[str, float]:
    """'single=0.4,magpie=0.35' -> every phase's share of the time budget (phases not named
    keep their default share), scaled to sum to 1."""
    shares = dict(TIME_SHARES)
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, value = item.partition("=")
        if name not in shares:
            raise ValueError(f"unknown phase {name!r} in {text!r}: the phases are "
                             f"{', '.join(PHASES)}")
        try:
            shares[name] = float(value)
        except ValueError:
            raise ValueError(f"{item!r}: give each phase's share as a number, e.g. "
                             f"single=0.4") from None
        if shares[name] < 0:
            raise ValueError(f"{item!r}: a share cannot be negative")
    total = sum(shares.values())
    if total <= 0:
        raise ValueError(f"{text!r}: the shares add up to nothing")
    return {k: v / total for k, v in shares.items()}


class Answered:
    """The prompts earlier datasets hold, so a run spends no GPU time on them again: their
    token sequences (each with its answer) and the normalised text of single-user-turn
    prompts (a record's first turn, whatever system prompt or encoding it came with)."""

    def __init__(self, datasets: list[Dataset], tokenizer: Any):
        self.answers = {tuple(s[:p]): s[p:] for d in datasets
                        for s, p in zip(d.sequences, d.prompt_lens)}
        marker = "\x00USER\x00"
        text = tokenizer.apply_chat_template([{"role": "user", "content": marker}],
                                             tokenize=False, add_generation_prompt=True)
        head, tail = text.split(marker)
        self.texts = set()
        for prompt in self.answers:
            full = tokenizer.decode(list(prompt))
            if (full.startswith(head) and full.endswith(tail)
                    and full.count(head) == full.count(tail) == 1):
                self.texts.add(normal_text(full[len(head):len(full) - len(tail)]))

    @classmethod
    def load(cls, paths: tuple[str, ...], tokenizer: Any) -> Answered | None:
        return cls([Dataset.load(Path(p)) for p in paths], tokenizer) if paths else None

    def has_text(self, text: str) -> bool:
        return normal_text(text) in self.texts


class Collector:
    """Runs the phases on one target; `say` reports progress lines."""

    def __init__(self, model: nn.Module, tokenizer: Any, cfg: MixConfig, state_dir: Path,
                 say: Callable[[str], None] = print):
        self.model, self.tokenizer, self.cfg, self.say = model, tokenizer, cfg, say
        self.state_dir = state_dir
        self.rng = random.Random(cfg.seed)
        self.eos = set(tokenizer.eos_token_ids)
        self.answered = Answered.load(tuple(cfg.skip_answered), tokenizer)
        self.skipped: dict[str, int] = {}  # prompts of each phase left out as answered
        self.batch_seconds: dict[str, float] = {}  # the running batches' time accounts

    # -- helpers -----------------------------------------------------------------------
    def _answer(self, prompts: list[list[int]], seconds: float | None, max_new: int | None = None,
                temperature: float = 0.0,
                follow_up: Callable[[dict[int, list[int]]], list[int]] | None = None,
                ) -> dict[int, list[int]]:
        cfg, stats = self.cfg, {}
        answers = answer_prompts(self.model, self.tokenizer, prompts, max_new or cfg.max_new,
                                 cfg.batch, seconds, token_budget=cfg.token_budget,
                                 temperature=temperature,
                                 loop_keep=cfg.loop_keep if temperature == 0.0 else None,
                                 attention=cfg.attention, in_place=cfg.in_place, stats=stats,
                                 follow_up=follow_up)
        for name, took in stats.get("seconds", {}).items():
            self.batch_seconds[name] = self.batch_seconds.get(name, 0.0) + took
        if stats.get("attention_trials"):  # "auto": what each way cost, and the pick
            self.say("attention: " + ", ".join(
                f"{way} {min(ms):.4f}" for way, ms in stats["attention_trials"].items())
                + f" ms per row-step -> {stats['attention']}")
        return answers

    def _fresh(self, phase: str, prompts: list[list[int]]) -> list[list[int]]:
        """`prompts` less those an earlier dataset (--skip-answered) already answered."""
        if self.answered is None:
            return prompts
        keep = [p for p in prompts if tuple(p) not in self.answered.answers]
        self._skip(phase, len(prompts) - len(keep))
        return keep

    def _skip(self, phase: str, n: int) -> None:
        self.skipped[phase] = self.skipped.get(phase, 0) + n

    def _encode(self, conversations: list[list[dict]]) -> list[list[int]]:
        return encode_prompts(self.tokenizer, conversations)

    def _fits(self, ids: list[int]) -> bool:
        return len(ids) <= self.cfg.max_prompt_len

    # -- phases ------------------------------------------------------------------------
    def heldout(self, records: list[PromptRecord], seconds: float | None) -> Dataset:
        pool = [r for r in records if is_held_out(r.id)]
        picked = sample_by_source(pool, self.cfg.heldout_size, seed=1234)  # same every run
        rng = random.Random(1234)
        prompts = self._encode([first_turn_messages(r, rng) for r in picked])
        keep = [i for i, p in enumerate(prompts) if self._fits(p)]
        prompts = [prompts[i] for i in keep]
        data = as_dataset(prompts, self._answer(prompts, seconds), {"phase": "heldout"})
        data.meta["ids"] = [picked[i].id for i in keep]
        return data

    def single(self, records: list[PromptRecord], seconds: float | None) -> Dataset:
        if self.answered is not None:  # before sampling, so num_prompts fresh ones are drawn
            fresh = [r for r in records if not self.answered.has_text(r.turns[0])]
            self._skip("single", len(records) - len(fresh))
            records = fresh
        picked = weighted_order(sample_by_source(records, self.cfg.num_prompts, self.cfg.seed),
                                self.cfg.seed)
        prompts = self._encode([first_turn_messages(r, self.rng) for r in picked])
        prompts = self._fresh("single", [p for p in prompts if self._fits(p)])
        return as_dataset(prompts, self._answer(prompts, seconds), {"phase": "single"})

    def multiturn(self, records: list[PromptRecord], seconds: float | None) -> Dataset:
        """Replay each record's user turns one at a time, feeding back the target's own
        answers, so the draft sees the context of turn 2 and later. A chat's next turn is
        asked as soon as its last answer ends (`follow_up`), ahead of chats not yet begun:
        within a time budget, chats go deep rather than many stopping at turn 1."""
        cfg = self.cfg
        pool = [r for r in records if len(r.turns) > 1]
        self.rng.shuffle(pool)
        pool = pool[:max(1, int(cfg.num_prompts * cfg.multiturn_share))]
        prompts: list[list[int]] = []  # every turn asked, in the order asked
        asked: list[tuple[int, list[dict]]] = []  # each prompt's (record, conversation)

        def ask(i: int, chat: list[dict]) -> list[int]:
            """Record i's next turn after `chat` -> its prompt's index ([] once the record
            has no more turns, or the next does not fit). A turn an earlier dataset answered
            replays that answer (no GPU, not saved again) and the chat goes on from it."""
            while (turn := len(chat) // 2) < min(len(pool[i].turns), cfg.max_turns):
                chat = chat + [{"role": "user", "content": pool[i].turns[turn]}]
                prompt = self._encode([chat])[0]
                if not self._fits(prompt):
                    return []
                known = None if self.answered is None else self.answered.answers.get(
                    tuple(prompt))
                if known is None:
                    prompts.append(prompt)
                    asked.append((i, chat))
                    return [len(prompts) - 1]
                self._skip("multiturn", 1)
                chat = chat + [{"role": "assistant", "content": self._text(known)}]
            return []

        def follow_up(done: dict[int, list[int]]) -> list[int]:
            return [k for j, reply in done.items() for k in ask(
                asked[j][0], asked[j][1] + [{"role": "assistant", "content": self._text(reply)}])]

        for i in range(len(pool)):
            ask(i, [])
        answers = self._answer(prompts, seconds, follow_up=follow_up)
        keep = [j for j in sorted(answers) if len(answers[j]) >= 2]
        depth = [(len(asked[j][1]) + 1) // 2 for j in keep]  # each sequence's turn, from 1
        return Dataset([prompts[j] + answers[j] for j in keep], [len(prompts[j]) for j in keep],
                       {"phase": "multiturn", "records": len(pool),
                        "turns": [depth.count(t) for t in range(1, max(depth, default=0) + 1)]})

    def _text(self, reply: list[int]) -> str:
        """An answer as the next turn's context holds it: its text without the EOS."""
        return self.tokenizer.decode([t for t in reply if t not in self.eos])

    def magpie(self, decon: Decontaminator | None, seconds: float | None) -> Dataset:
        """User turns written by the target (sampled after the template's user header, some
        steered by a system prompt), then answered greedily like real prompts."""
        cfg = self.cfg
        n = max(1, int(cfg.num_prompts * cfg.magpie_share))
        mx.random.seed(cfg.seed)
        steers = [MAGPIE_STEERS[MAGPIE_TURNS[k % len(MAGPIE_TURNS)]] for k in range(n)]
        prefixes = {s: magpie_prefix(self.tokenizer, s) for s in MAGPIE_STEERS}
        start = time.perf_counter()
        asks = self._answer([prefixes[s] for s in steers],
                            None if seconds is None else seconds / 4, max_new=160,
                            temperature=1.0)
        texts, seen = [], set()
        for reply in asks.values():
            if not reply or reply[-1] not in self.eos or len(reply) < 4:
                continue  # unfinished or empty user turns
            text = self.tokenizer.decode(reply[:-1]).strip()
            if text and text not in seen and (decon is None or decon.clean(text)):
                seen.add(text)
                texts.append(text)
        prompts = self._encode([[{"role": "user", "content": t}] for t in texts])
        prompts = self._fresh("magpie", [p for p in prompts if self._fits(p)])
        left = None if seconds is None else seconds - (time.perf_counter() - start)
        data = as_dataset(prompts, self._answer(prompts, left), {"phase": "magpie"})
        data.meta["user_turns"] = len(texts)
        return data

    def templated(self, seconds: float | None) -> Dataset:
        from .prompts import build_prompts

        n = max(1, int(self.cfg.num_prompts * self.cfg.templated_share))
        prompts = self._fresh("templated",
                              self._encode([m for _, m in build_prompts(n, self.cfg.seed)]))
        return as_dataset(prompts, self._answer(prompts, seconds), {"phase": "templated"})

    # -- the run -------------------------------------------------------------------------
    def run(self) -> tuple[Dataset, Dataset]:
        """-> (training data of every phase, held-out data). Phases already saved in the
        state folder are loaded, not generated again."""
        cfg = self.cfg
        decon = Decontaminator.from_texts(eval_texts(cfg.eval_dir)) if cfg.eval_dir else None
        every = load_records(cfg.prompts_file)
        index, count = cfg.slice
        records = usable([r for r in every if in_slice(r.id, index, count)], decon, among=every)
        self.say(f"prompts: {len(records)} usable records in slice {index}/{count}")
        parts: dict[str, Dataset] = {}
        start = time.perf_counter()
        spent_share = 0.0
        for phase in PHASES:
            path = self.state_dir / f"data-{phase}.npz"
            spent_share += cfg.time_shares[phase]
            if path.is_file():
                parts[phase] = Dataset.load(path)
                self.say(f"{phase}: reusing {path} ({len(parts[phase])} sequences)")
                continue
            seconds = None
            if cfg.seconds is not None:  # this phase's share plus what earlier ones left
                seconds = max(0.0, cfg.seconds * spent_share - (time.perf_counter() - start))
            t0 = time.perf_counter()
            self.batch_seconds = {}
            if phase == "heldout":
                # only the held-out records need the (slow) contamination check here
                data = self.heldout([r for r in every if is_held_out(r.id)
                                     and is_clean(r, decon)], seconds)
            elif phase == "single":
                data = self.single(records, seconds)
            elif phase == "multiturn":
                data = self.multiturn(records, seconds)
            elif phase == "magpie":
                data = self.magpie(decon, seconds)
            else:
                data = self.templated(seconds)
            took = time.perf_counter() - t0
            data.meta.update(seconds=took, slice=f"{index}/{count}", seed=cfg.seed,
                             max_new=cfg.max_new)
            if self.answered is not None:
                data.meta["skipped_answered"] = self.skipped.get(phase, 0)
                self.say(f"{phase}: skipped {self.skipped.get(phase, 0)} prompts already "
                         f"answered in {', '.join(cfg.skip_answered)}")
            if self.batch_seconds:  # where a generation run's time went (RunningBatch)
                data.meta["batch_seconds"] = {k: round(v, 2) for k, v in self.batch_seconds.items()}
            self.state_dir.mkdir(parents=True, exist_ok=True)
            data.save(path)
            parts[phase] = data
            self.say(f"{phase}: {len(data)} sequences, {data.response_tokens} response tokens "
                     f"in {took:.0f}s ({data.response_tokens / max(took, 1e-9):.0f} tok/s)")
            if self.batch_seconds:
                self.say(f"{phase}: seconds " + ", ".join(
                    f"{k} {v:.1f}" for k, v in self.batch_seconds.items()))
            if "turns" in data.meta:  # how deep the replayed chats went
                self.say(f"{phase}: sequences at turn 1, 2, ...: {data.meta['turns']}")
        train = Dataset.concat([parts[p] for p in PHASES if p != "heldout"])
        return train, parts["heldout"]
