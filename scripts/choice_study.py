"""Where the suffix lookup finds only a short match, should the cycle propose the repeat or the
draft's tokens? Simulated greedy cycles per choice rule, without decoding again.

    python scripts/choice_study.py --draft engine/drafts/smollm2-135m-instruct-dflash \
        --heldout benchmarks/stage5/heldout.npz --heldout-limit 200 --limit 8 \
        --json benchmarks/stage13/choice-study-cpu.json

At every anchor of a reply (held-out answers: real prompts never trained on; the suites'
greedy replies: the report only) the draft's block forward runs as in training
(`engine.train.objective.slot_logits`), and the engine's own lookup (`SuffixLookup`, the
default minimum and short matches) proposes from the context. Recorded per anchor: the
draft's run, the repeat's run, the match length, and the draft's probabilities of its own
top tokens and of the repeat's tokens. A rule "repeat where expected_run(repeat) >=
odds x expected_run(top)" (`engine.cycle.choose_proposal`) is then walked as a decode walks
(`engine.train.objective.walk_cycles`) for a range of odds; `best_of` takes the longer run
(a perfect choice). The held-out answers pick `engine.cycle.REPEAT_ODDS`; the `direct_*` rows
check the lookup's minimum match (from which the repeat skips the draft and the choice).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from engine.bench.suites import SUITES, load_prompts
from engine.bench.timing import first_mismatch
from engine.config import DFlashConfig
from engine.cycle import REPEAT_ODDS
from engine.loading import load_draft_folder
from engine.lookup import MIN_MATCH, SuffixLookup
from engine.runtime import DFlashRuntime
from engine.train.dataset import Dataset
from engine.train.objective import (
    anchored_batch,
    block_runs,
    slot_logits,
    target_taps,
    walk_cycles,
)

ODDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
DIRECT = (3, 4, 6, 8, 12)  # other match lengths from which the repeat skips the choice
CHUNK = 32


def reply_blocks(draft, target, seq: list[int], prompt_len: int):
    """The draft's block forward at every reply anchor, CHUNK anchors at a time, as in
    training. Yields (anchors [A], logits [A, B - 1, V] in float32, runs [A]: the draft's
    run at each anchor)."""
    import mlx.core as mx  # here: the engine's imports load the fast CPU BLAS first

    tokens = np.asarray(seq, np.int32)[None]
    length = np.array([tokens.shape[1]])
    taps = target_taps(target, mx.array(tokens), draft.training_tap_ids)
    for lo in range(prompt_len, len(seq) - 1, CHUNK):
        anchors = np.arange(lo, min(lo + CHUNK, len(seq) - 1), dtype=np.int32)[None]
        batch = anchored_batch(tokens, anchors, length, np.ones(anchors.shape, bool),
                               draft.args.block_size, draft.args.mask_token_id)
        logits = slot_logits(draft, target, batch, taps).astype(mx.float32)
        yield anchors[0], logits[0], block_runs(logits, batch)[0]


def whole_block_runtime(folder: str) -> tuple:
    """The default target with the draft in `folder`, verifying whole blocks over the full
    vocabulary (every study's setting) -> (the draft, the runtime)."""
    config = DFlashConfig(min_draft_confidence=None, draft_vocab=None)
    base = DFlashRuntime.from_pretrained(config=config)
    draft = load_draft_folder(Path(folder))
    return draft, DFlashRuntime(base.model, base.tokenizer, draft, config, target=base.target)


def study_parser(doc: str) -> argparse.ArgumentParser:
    """The flags of the studies that simulate the suites' replies (and optional held-out
    answers) with one draft."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--draft", required=True, help="draft folder")
    p.add_argument("--limit", type=int, default=8,
                   help="N prompts of each suite, spread over its categories")
    p.add_argument("--heldout", help="also these answers (a Dataset .npz)")
    p.add_argument("--heldout-limit", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--json", help="write the study here")
    return p


def write_study(path: str | None, result: dict) -> None:
    """The study's JSON at `path` (its folder made), where one is given."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1) + "\n")


def study_sets(draft, rt, rows_of, limit: int, max_tokens: int, heldout: str | None = None,
               heldout_limit: int = 0) -> dict[str, list[list[dict]]]:
    """Set name -> per reply, `rows_of(draft, target, tokens, prompt_len)`: the held-out
    answers in `heldout` (its first `heldout_limit`), then each suite's greedy replies to
    `limit` of its prompts, spread over its categories (every study's sets)."""
    sets: dict[str, list[list[dict]]] = {}
    if heldout:
        data = Dataset.load(Path(heldout))
        sets["heldout"] = [rows_of(draft, rt.target, [int(t) for t in data.sequences[i]],
                                   int(data.prompt_lens[i]))
                           for i in range(min(heldout_limit, len(data)))]
    for suite in sorted(SUITES):
        prompts, _ = load_prompts(suite=suite, limit=limit)
        sets[suite] = []
        for prompt in prompts:
            ids = rt.encode([{"role": "user", "content": prompt.text}])
            reply = rt.generate(ids, max_tokens=max_tokens).tokens
            sets[suite].append(rows_of(draft, rt.target, ids + reply, len(ids)))
    return sets


def anchor_rows(draft, target, seq: list[int], prompt_len: int) -> list[dict]:
    """Per reply anchor: draft run `d`, repeat run `r` (None: no match), match length `m`,
    the draft's probabilities of its top tokens `top` and of the repeat's tokens `rep`."""
    import mlx.core as mx

    B = draft.args.block_size
    lookup = SuffixLookup(MIN_MATCH)
    lookup.extend(seq[:prompt_len])
    rows = []
    for anchors, logits, runs in reply_blocks(draft, target, seq, prompt_len):
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        found = []
        for a in anchors:
            lookup.extend([seq[a]])
            found.append(lookup.propose(B - 1))
        repeats = mx.array([f[1] or [0] * (B - 1) for f in found], dtype=mx.int32)
        rep = mx.exp(mx.take_along_axis(logprobs, repeats[..., None], axis=-1)[..., 0])
        top = mx.exp(mx.max(logprobs, axis=-1))
        runs, rep, top = (np.array(x) for x in (runs, rep, top))
        for j, a in enumerate(anchors):
            m, proposal = found[j]
            future = seq[a + 1:a + B]
            mismatch = first_mismatch(proposal[:len(future)], future) if m else None
            rows.append({"d": int(runs[j]), "m": m,
                         "r": (len(future) if mismatch is None else mismatch) if m else None,
                         "top": top[j], "rep": rep[j] if m else None})
    return rows


def expected_run(probs: np.ndarray) -> float:
    return float(np.cumprod(probs).sum())


def rule(odds: float | None, direct: int = MIN_MATCH, short: int = 2):
    """-> choose(row): the engine's rule at these odds, the repeat taken without a choice
    from `direct` matching tokens (None: never the short repeat, the engine before the
    choice existed)."""
    def choose(row: dict) -> tuple[int, bool]:
        if row["m"] >= direct:
            return row["r"], True
        if (odds is not None and row["m"] >= short
                and expected_run(row["rep"]) >= odds * expected_run(row["top"])):
            return row["r"], True
        return row["d"], False
    return choose


def best_of(row: dict) -> tuple[int, bool]:
    if row["m"] and row["r"] > row["d"]:
        return row["r"], True
    return row["d"], False


def pooled(replies: list[list[dict]], choose) -> dict:
    """Tokens/cycle over the replies' walks (`walk_cycles`: anchored at token 0, then wherever
    the last cycle stopped) and the share of their cycles that proposed a repeat."""
    tokens = cycles = used = 0
    for rows in replies:
        chosen = [choose(row) for row in rows]
        walked = walk_cycles([run for run, _ in chosen], len(rows) + 1)
        anchors = np.cumsum([0] + walked[:-1])
        tokens, cycles = tokens + sum(walked), cycles + len(walked)
        used += sum(chosen[a][1] for a in anchors)
    return {"tokens_per_cycle": tokens / cycles, "lookup_cycle_share": used / cycles}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True, help="draft folder")
    p.add_argument("--heldout", required=True, help="held-out answers (a Dataset .npz)")
    p.add_argument("--heldout-limit", type=int, default=200)
    p.add_argument("--limit", type=int, default=8,
                   help="N prompts of each suite, spread over its categories")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--json", help="write the study here")
    args = p.parse_args(argv)
    draft, rt = whole_block_runtime(args.draft)
    sets = study_sets(draft, rt, anchor_rows, args.limit, args.max_tokens, args.heldout,
                      args.heldout_limit)
    result = {"command": "python " + " ".join(sys.argv), "draft": args.draft,
              "min_match": MIN_MATCH, "short_match": SuffixLookup().short_match,
              "replies": {k: len(v) for k, v in sets.items()}, "sets": {}}
    for name, replies in sets.items():
        found = {"no_choice": pooled(replies, rule(None)), "best_of": pooled(replies, best_of)}
        for odds in ODDS:
            found[f"odds_{odds}"] = pooled(replies, rule(odds))
        for direct in DIRECT:  # shorter matches than direct go through the choice
            found[f"direct_{direct}"] = pooled(replies, rule(REPEAT_ODDS, direct))
        result["sets"][name] = found
        line = "  ".join(f"{k} {v['tokens_per_cycle']:.2f}" for k, v in found.items())
        print(f"{name:9s} ({len(replies)} replies)  {line}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
