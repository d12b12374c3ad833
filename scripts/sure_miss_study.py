"""How much the draft loses on tokens the target is sure of, and whether a short look back
finds them: on a `draft_acceptance.py --walk` report's greedy replies, the draft-alone walk
(pooled as `block_size_bound.py` pools it) as it is and as if every slot whose token the
target gives at least probability t (`--sure`, repeatable) were right; and the target's own
pick from only the last W tokens (`--window`, repeatable) against the draft's first slot:
alone, on the draft's misses, and right where either is (an oracle choosing between them).

Beside each draft-alone walk, the walk with the suffix lookup (`--lookup`, the engine's
default): each anchor's run is the longer of the draft's and the lookup's proposal (no choice
rule keeps more, so an optimistic figure), pooled and as the mean of each reply's tokens/cycle
(the goals' figure), with the report's real decodes beside it. Where even every sure token
made right leaves that mean below a goal, the goal needs the draft right on tokens the target
itself is less sure of.

    python scripts/draft_acceptance.py --draft D --limit 8 --walk --heldout \
        benchmarks/stage5/heldout.npz --heldout-limit 40 --json walk.json
    python scripts/sure_miss_study.py walk.json --draft D --sure 0.99 --sure 0.9 --sure 0.7 \
        --window 2 --window 3 --json F
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401,I001  (first: the fast CPU BLAS before MLX loads)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from agreement_by_confidence import target_confidence  # noqa: E402  (on the path when run)
from block_size_bound import walk_tokens_per_cycle  # noqa: E402
from lookup_study import lookup_runs as looked_up_runs  # noqa: E402
from engine.bench.environment import machine_info, versions  # noqa: E402
from engine.lookup import MIN_MATCH, SHORT_MATCH  # noqa: E402
from engine.runtime import DFlashRuntime  # noqa: E402
from engine.train.objective import anchor_hits, walk_cycles  # noqa: E402

CHUNK = 256  # short-window rows per target forward


def sure_hits(hits: np.ndarray, valid: np.ndarray, confidence: np.ndarray, prompt_len: int,
              sure: float) -> np.ndarray:
    """`hits` [n, K] (row a: the block anchored at prompt_len + a, slot k + 1 predicting the
    token at prompt_len + a + k + 1) with every valid slot made right where the target's
    probability of that token (`confidence[p]`: of the token at p + 1, `target_confidence`
    from position 0) is at least `sure`."""
    n, K = hits.shape
    pos = prompt_len + np.arange(n)[:, None] + np.arange(K)[None]
    conf = confidence[np.minimum(pos, len(confidence) - 1)]
    return hits | (valid & (conf >= sure))


def hit_runs(hits: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Each anchor's run (right slots before the first wrong one) from its slot hits."""
    return np.cumprod(hits & valid, axis=-1).sum(axis=-1)


def lookup_runs(seq: list[int], prompt_len: int, count: int,
                min_match: int = MIN_MATCH) -> np.ndarray:
    """The suffix lookup's run at every anchor of a reply, as the engine proposes (its short
    matches too), 0 where it has no proposal; row a: the anchor at prompt_len + a."""
    runs = looked_up_runs(seq[:prompt_len], seq[prompt_len:], min_match,
                          short_match=SHORT_MATCH, count=count)
    return np.asarray([run or 0 for run in runs], np.int64)


def mean_reply_tokens_per_cycle(answers: list[tuple[np.ndarray, int]]) -> float:
    """The mean over replies of each one's walk tokens/cycle (how the goals average runs)."""
    rates = [sum(w) / len(w) for runs, n in answers if (w := walk_cycles(runs, n))]
    return float(np.mean(rates)) if rates else float("nan")


def windows(seq: list[int], anchors: np.ndarray, width: int) -> np.ndarray:
    """[len(anchors), width]: the last `width` tokens up to each anchor (the sequence's
    first token repeated where the window would start before it)."""
    idx = anchors[:, None] - width + 1 + np.arange(width)[None]
    return np.asarray(seq, np.int32)[np.maximum(idx, 0)]


def window_picks(model, seq: list[int], anchors: np.ndarray, width: int) -> np.ndarray:
    """The target's greedy pick after each anchor from only the last `width` tokens."""
    rows = windows(seq, anchors, width)
    picks = [np.array(mx.argmax(model(mx.array(rows[i:i + CHUNK]))[:, -1], axis=-1))
             for i in range(0, len(rows), CHUNK)]
    return np.concatenate(picks)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("walk", type=Path, help="a draft_acceptance.py --walk report")
    p.add_argument("--draft", help="draft folder (default: the default pair's)")
    p.add_argument("--sure", type=float, action="append", default=None,
                   help="a target probability at and above which slots count as right "
                        "(repeatable; default 0.99, 0.9, 0.7)")
    p.add_argument("--window", type=int, action="append", default=None,
                   help="a short look back, in tokens (repeatable; default 2, 3)")
    p.add_argument("--lookup", type=int, default=MIN_MATCH,
                   help="the suffix lookup's min match beside the draft (0: the draft alone)")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    sures = args.sure or [0.99, 0.9, 0.7]
    widths = args.window or [2, 3]
    if any(not 0 <= s <= 1 for s in sures) or any(w < 1 for w in widths):
        p.error("--sure takes probabilities in [0, 1] and --window widths of 1 or more")
    report = json.loads(args.walk.read_text())
    replies = next(iter(report["drafts"].values()))
    suites = {s: runs["runs"] for s, runs in replies.items() if s != "heldout"}
    if not all("reply" in r for runs in suites.values() for r in runs):
        p.error(f"{args.walk}: its runs keep no replies. Fix: make it with --walk.")
    rt = DFlashRuntime.from_pretrained(draft=args.draft)
    draft = rt.draft
    out = {"command": "python " + " ".join(sys.argv), "walk": str(args.walk),
           "machine": machine_info(), "versions": versions(), "sets": {}}
    for suite, runs in suites.items():
        walked: dict[str, list] = {"draft": [], **{str(s): [] for s in sures}}
        looked: dict[str, list] = {key: [] for key in walked}
        first, short = [], {w: [] for w in widths}
        for r in runs:
            seq, prompt_len = r["prompt_tokens"] + r["reply"], len(r["prompt_tokens"])
            hits, valid = anchor_hits(draft, rt.target, seq, prompt_len)
            confidence = target_confidence(rt.model, seq, 0)  # [p]: of the token at p + 1
            reply_len = len(seq) - prompt_len
            for key in walked:
                h = hits if key == "draft" else sure_hits(hits, valid, confidence,
                                                            prompt_len, float(key))
                walked[key].append((hit_runs(h, valid), reply_len))
            if args.lookup:
                found = lookup_runs(seq, prompt_len, hits.shape[1], args.lookup)
                for key, answers in walked.items():
                    looked[key].append((np.maximum(answers[-1][0], found), reply_len))
            first.append(hits[:, 0])
            anchors = prompt_len + np.arange(len(hits))
            labels = np.asarray(seq, np.int32)[anchors + 1]
            for w in widths:
                short[w].append(window_picks(rt.model, seq, anchors, w) == labels)
        hit = np.concatenate(first)
        row = {"anchors": int(len(hit)), "first_slot_agree": float(hit.mean()),
               "walk": {k: walk_tokens_per_cycle(v) for k, v in walked.items()}, "window": {}}
        if args.lookup:
            row["with_lookup"] = {
                "pooled": {k: walk_tokens_per_cycle(v) for k, v in looked.items()},
                "reply_mean": {k: mean_reply_tokens_per_cycle(v) for k, v in looked.items()},
                "real_reply_mean": float(np.mean([r["tokens_per_cycle"] for r in runs]))}
        for w in widths:
            s = np.concatenate(short[w])
            row["window"][str(w)] = {"agree": float(s.mean()),
                                     "on_draft_misses": float(s[~hit].mean()) if (~hit).any()
                                     else None, "either": float((s | hit).mean())}
        out["sets"][suite] = row
        walks = "  ".join(f"{k} {v:.2f}" for k, v in row["walk"].items())
        looks = "  ".join(f"W={w} {v['agree']:.3f}/{v['either']:.3f}"
                          for w, v in row["window"].items())
        print(f"{suite:9s} first slot {row['first_slot_agree']:.3f}  walk: {walks}  "
              f"look back (alone/either): {looks}", flush=True)
        if args.lookup:
            means = "  ".join(f"{k} {v:.2f}" for k, v in row["with_lookup"]["reply_mean"].items())
            print(f"{'':9s} with the lookup, reply mean: {means}  (real decodes "
                  f"{row['with_lookup']['real_reply_mean']:.2f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
