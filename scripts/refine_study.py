"""Would a second draft pass over the draft's own confident first tokens raise tokens/cycle?
Simulated greedy cycles on the suites' greedy replies, without decoding again.

    python scripts/refine_study.py --draft engine/drafts/smollm2-135m-instruct-dflash \
        --draft /tmp/prefix-draft --limit 8 --json benchmarks/stage26/refine-study-cpu.json

The draft predicts a block's slots in parallel from mask tokens, so where it knows how a word
starts it often cannot finish it. A second pass could show it its own first tokens: slots
1..k keep the first pass's tokens (k: the leading slots whose probability is at least tau),
and the rest are predicted again with those tokens in the block instead of the mask. A draft
trained only on all-mask blocks has never seen that; one trained with `--prefix-share`
(engine/train/objective.py: show_prefixes) has. Per draft and suite:
- `walk`: tokens/cycle of the draft alone (no suffix lookup), walked as a decode walks
  (`walk_cycles`): `pass1` the draft as decoding runs it, `tau{t}` with the second pass;
- `shown`: for j = 1..3 the draft's accuracy at slot j + 1 given the TRUE first j tokens,
  against the first pass's accuracy there, over the anchors where the first pass got those j
  right (what a second pass could add at best, from a right prefix).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from choice_study import whole_block_runtime, write_study  # on the path when run

from engine.bench.suites import SUITES, load_prompts
from engine.loading import load_draft_folder
from engine.train.objective import anchored_batch, slot_logits, target_taps, walk_cycles

CHUNK = 32
TAUS = (0.5, 0.7, 0.9)
SHOWN = (1, 2, 3)


def runs_of(pred: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> np.ndarray:
    return np.cumprod((pred == labels) & valid, axis=-1).sum(-1)


def reply_study(draft, target, seq: list[int], prompt_len: int, taus) -> dict:
    """Per anchor runs for each way, and the shown-prefix counts, on one reply."""
    import mlx.core as mx

    B, mask = draft.args.block_size, draft.args.mask_token_id
    tokens = np.asarray(seq, np.int32)[None]
    length = np.array([len(seq)])
    taps = target_taps(target, mx.array(tokens), draft.training_tap_ids)
    runs: dict[str, list[np.ndarray]] = {"pass1": [], **{f"tau{t}": [] for t in taus}}
    shown = {j: np.zeros(3, np.int64) for j in SHOWN}  # right with shown, right pass 1, n

    def argmax(block: np.ndarray, batch) -> np.ndarray:
        b = replace(batch, block=mx.array(block.reshape(1, -1)))
        return np.array(mx.argmax(slot_logits(draft, target, b, taps), -1))[0]

    for lo in range(prompt_len, len(seq) - 1, CHUNK):
        anchors = np.arange(lo, min(lo + CHUNK, len(seq) - 1), dtype=np.int32)[None]
        batch = anchored_batch(tokens, anchors, length, np.ones(anchors.shape, bool), B, mask)
        logits = slot_logits(draft, target, batch, taps).astype(mx.float32)[0]
        first = np.array(mx.argmax(logits, -1))
        sure = np.array(mx.max(mx.softmax(logits, axis=-1), -1))
        labels, valid = np.array(batch.labels[0]), np.array(batch.valid[0]) > 0
        runs["pass1"].append(runs_of(first, labels, valid))
        block = np.array(batch.block).reshape(-1, B)
        for t in taus:
            keep = np.cumprod(sure >= t, axis=-1).sum(-1)  # leading confident slots
            kept = np.arange(B - 1)[None, :] < keep[:, None]
            again = block.copy()
            again[:, 1:] = np.where(kept, first, again[:, 1:])
            second = np.where(kept, first, argmax(again, batch))
            runs[f"tau{t}"].append(runs_of(second, labels, valid))
        for j in SHOWN:
            told = block.copy()
            told[:, 1:1 + j] = labels[:, :j]
            pred = argmax(told, batch)
            right = np.all(first[:, :j] == labels[:, :j], -1) & valid[:, j]
            shown[j] += [int(((pred[:, j] == labels[:, j]) & right).sum()),
                         int(((first[:, j] == labels[:, j]) & right).sum()), int(right.sum())]
    return {"runs": {k: np.concatenate(v) for k, v in runs.items()}, "shown": shown}


def summarise(replies: list[dict], n_tokens: list[int]) -> dict:
    walk = {}
    for key in replies[0]["runs"]:
        tokens = cycles = 0
        for r, n in zip(replies, n_tokens, strict=True):
            c = walk_cycles(r["runs"][key], n)
            tokens, cycles = tokens + sum(c), cycles + len(c)
        walk[key] = tokens / cycles if cycles else None
    shown = {}
    for j in SHOWN:
        right_shown, right_first, n = sum(r["shown"][j] for r in replies)
        shown[str(j)] = {"accuracy_shown": right_shown / max(n, 1),
                         "accuracy_first_pass": right_first / max(n, 1), "anchors": int(n)}
    return {"walk": walk, "shown": shown}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", action="append", required=True, help="draft folder (repeat)")
    p.add_argument("--limit", type=int, default=8,
                   help="N prompts of each suite, spread over its categories")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--tau", type=float, action="append", help=f"default {TAUS}")
    p.add_argument("--json", help="write the study here")
    args = p.parse_args(argv)
    taus = tuple(args.tau or TAUS)
    first, rt = whole_block_runtime(args.draft[0])
    replies = {}
    for suite in sorted(SUITES):
        prompts, _ = load_prompts(suite=suite, limit=args.limit)
        replies[suite] = []
        for prompt in prompts:
            ids = rt.encode([{"role": "user", "content": prompt.text}])
            replies[suite].append((ids, rt.generate(ids, max_tokens=args.max_tokens).tokens))
    result = {"command": "python " + " ".join(sys.argv), "taus": list(taus),
              "replies": {k: len(v) for k, v in replies.items()}, "drafts": {}}
    for folder in args.draft:
        draft = first if folder == args.draft[0] else load_draft_folder(Path(folder))
        result["drafts"][folder] = {}
        for suite, pairs in replies.items():
            studied = [reply_study(draft, rt.target, ids + reply, len(ids), taus)
                       for ids, reply in pairs]
            row = summarise(studied, [len(reply) for _, reply in pairs])
            result["drafts"][folder][suite] = row
            walk = "  ".join(f"{k} {v:.2f}" for k, v in row["walk"].items())
            told = "  ".join(f"j={j}: {v['accuracy_shown']:.3f} vs {v['accuracy_first_pass']:.3f}"
                             for j, v in row["shown"].items())
            print(f"{folder} {suite}: {walk} | shown {told}", flush=True)
    write_study(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
