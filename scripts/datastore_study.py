"""Would a datastore of the target's own earlier answers (retrieval, as REST does) propose runs
the draft misses? Simulated greedy cycles, without decoding again.

At every anchor of a held-out reply the draft's block forward runs as in training, the
engine's suffix lookup proposes from the context, and the datastore proposes the majority
continuation of the longest n-gram of the context's tail that its answers hold. Rules that
choose among the three by the draft's expected run are then walked as decoding walks.

    python scripts/datastore_study.py --store ~/.cache/dflash-chat/train-data/stage14/gen-14-0.npz \
        --heldout-limit 120 --json benchmarks/stage15/datastore-study-cpu.json

(gen-14-0.npz: the stage-14 session's answers, never trained on by the stage-13 draft; no
held-out prompt among them.) Not in the engine: the store's gain did not pay for its memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from choice_study import expected_run, reply_blocks  # scripts/ is on the path when run

from engine.bench.timing import first_mismatch
from engine.config import DFlashConfig
from engine.loading import load_draft_folder
from engine.lookup import MIN_MATCH, SuffixLookup
from engine.runtime import DFlashRuntime
from engine.train.dataset import Dataset
from engine.train.objective import walk_cycles

ORDERS = (16, 12, 10, 8, 6, 5, 4, 3)
MAX_HITS = 256
P64 = np.uint64(1099511628211)


def _hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """Hash of the n tokens ending at each index (index >= n - 1)."""
    h = np.zeros(len(tokens) - n + 1, np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            h = h * P64 + tokens[k:len(tokens) - n + 1 + k].astype(np.uint64) + np.uint64(1)
    return h


class Datastore:
    """Answers concatenated with a separator; per order a sorted table of n-gram hashes."""

    def __init__(self, answers: list[np.ndarray], block: int):
        sep = np.full(block, 65535, np.uint16)
        parts = []
        for a in answers:
            parts += [a.astype(np.uint16), sep]
        self.tokens = np.concatenate(parts)
        self.tables = {}
        for n in ORDERS:
            h = _hashes(self.tokens, n)
            order = np.argsort(h, kind="stable")
            self.tables[n] = (h[order], (order + n - 1).astype(np.int64))  # end index

    def propose(self, context: list[int], count: int) -> tuple[int, int, list[int]]:
        """-> (order matched, hits, majority continuation of `count` tokens)."""
        for n in ORDERS:
            if len(context) < n:
                continue
            q = _hashes(np.asarray(context[-n:], np.uint16), n)[0]
            keys, ends = self.tables[n]
            lo, hi = np.searchsorted(keys, q, "left"), np.searchsorted(keys, q, "right")
            if hi == lo:
                continue
            ends = ends[lo:min(hi, lo + MAX_HITS)]
            follow = self.tokens[ends[:, None] + 1 + np.arange(count)[None]]
            out: list[int] = []
            alive = np.ones(len(follow), bool)
            for k in range(count):
                vals, counts = np.unique(follow[alive, k], return_counts=True)
                t = int(vals[np.argmax(counts)])
                if t == 65535:
                    break
                out.append(t)
                alive &= follow[:, k] == t
            return n, int(hi - lo), out
        return 0, 0, []


def anchor_rows(draft, target, store: Datastore, seq: list[int], prompt_len: int) -> list[dict]:
    import mlx.core as mx

    B = draft.args.block_size
    lookup = SuffixLookup(MIN_MATCH)
    lookup.extend(seq[:prompt_len])
    rows = []
    for anchors, logits, runs in reply_blocks(draft, target, seq, prompt_len):
        runs, probs = np.array(runs), np.array(mx.softmax(logits, axis=-1))
        for j, a in enumerate(anchors):
            lookup.extend([seq[a]])
            future = seq[a + 1:a + B]
            row = {"d": int(runs[j]), "top": probs[j].max(-1)}
            m, rep = lookup.propose(B - 1)
            n, hits, ds = store.propose(seq[prompt_len:a + 1], B - 1)
            for key, size, prop in (("r", m, rep), ("s", n, ds)):
                if size and prop:
                    mis = first_mismatch(prop[:len(future)], future)
                    row[key] = len(future[:len(prop)]) if mis is None else mis
                    row[key + "p"] = probs[j][np.arange(len(prop)), prop]
                    row[key + "n"] = size
                else:
                    row[key] = None
            row["hits"] = hits
            rows.append(row)
    return rows


def make_rule(store_on: bool, odds: float, min_order: int, direct: int = MIN_MATCH):
    def choose(row):
        best, score = row["d"], expected_run(row["top"])
        if row["r"] is not None:
            if row["rn"] >= direct:
                return row["r"]
            if row["rn"] >= 2 and expected_run(row["rp"]) >= odds * score:
                best, score = row["r"], expected_run(row["rp"]) / odds
        if (store_on and row["s"] is not None and row["sn"] >= min_order
                and expected_run(row["sp"]) >= odds * score):
            best = row["s"]
        return best
    return choose


def pooled(replies, choose) -> float:
    tokens = cycles = 0
    for rows in replies:
        walked = walk_cycles([choose(r) for r in rows], len(rows) + 1)
        tokens, cycles = tokens + sum(walked), cycles + len(walked)
    return tokens / cycles


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--draft", default="engine/drafts/smollm2-135m-instruct-dflash")
    p.add_argument("--heldout", default="benchmarks/stage5/heldout.npz")
    p.add_argument("--heldout-limit", type=int, default=100)
    p.add_argument("--store", nargs="+", required=True)
    p.add_argument("--json")
    args = p.parse_args(argv)
    config = DFlashConfig(min_draft_confidence=None, draft_vocab=None)
    base = DFlashRuntime.from_pretrained(config=config)
    draft = load_draft_folder(Path(args.draft))
    answers = []
    for f in args.store:
        d = Dataset.load(Path(f))
        for i in range(len(d)):
            answers.append(np.asarray(d.sequences[i][int(d.prompt_lens[i]):]))
    store = Datastore(answers, draft.args.block_size)
    print("store tokens", len(store.tokens), flush=True)
    data = Dataset.load(Path(args.heldout))
    replies = []
    for i in range(min(args.heldout_limit, len(data))):
        seq = [int(t) for t in data.sequences[i]]
        replies.append(anchor_rows(draft, base.target, store, seq, int(data.prompt_lens[i])))
    found = {"engine": pooled(replies, make_rule(False, 0.4, 99))}
    for odds in (0.2, 0.4, 0.6, 1.0):
        for mo in (3, 4, 6, 8):
            found[f"store_odds{odds}_min{mo}"] = pooled(replies, make_rule(True, odds, mo))
    found["best_of"] = pooled(replies, lambda r: max(x for x in (r["d"], r["r"], r["s"])
                                                    if x is not None))
    found["best_draft_store"] = pooled(replies, lambda r: max(
        x for x in (r["d"], r["s"]) if x is not None))
    for k, v in found.items():
        print(f"{k:28s} {v:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": "python " + " ".join(sys.argv), "draft": args.draft,
            "store_files": [Path(f).name for f in args.store], "store_tokens": len(store.tokens),
            "heldout_replies": len(replies), "tokens_per_cycle": found}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
