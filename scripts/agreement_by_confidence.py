"""How often a draft's first slot agrees with the target, per bucket of the target's own
confidence (its top-1 probability for that token): where a suite's lower tokens/cycle
comes from, the target being less sure there (the buckets' shares) or the draft missing
tokens the target is sure of (agreement within a bucket), and whether those are tokens the
context holds to copy (the pair of the anchor and the token in the prompt or earlier in the
reply) or new ones. Per bucket of the target's probability of a block's anchor token: how
many anchors fall there against how many of a greedy decode's cycles start there (after a
miss), and the draft's runs from them (what `train-draft --surprise-weight` leans on).

    python scripts/draft_acceptance.py --draft D --limit 8 --walk --heldout \
        benchmarks/stage5/heldout.npz --heldout-limit 40 --json walk.json
    python scripts/agreement_by_confidence.py walk.json --draft D [--draft E] \
        --heldout benchmarks/stage5/heldout.npz --heldout-limit 40 --json F
    python scripts/agreement_by_confidence.py --draft D --heldout benchmarks/stage5/heldout.npz \
        --heldout-limit 255 --by-source --source sharegpt --source pycode --json F

The suites' replies are the ones in walk.json (each run's prompt_tokens and reply, greedy,
so the target's own); the first slot of a block anchored at position a predicts token a + 1
from the target's features before a and the token at a, as training and decoding do.
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
from engine.bench.environment import machine_info, versions  # noqa: E402
from engine.loading import load_draft_folder  # noqa: E402
from engine.runtime import DFlashRuntime  # noqa: E402
from engine.train.dataset import Dataset  # noqa: E402
from engine.train.objective import anchor_runs, walk_cycles  # noqa: E402

EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)
SURE = 0.9
NOVELTY = ("new", "in_prompt", "in_reply")


def target_confidence(model, seq: list[int], prompt_len: int) -> np.ndarray:
    """The target's top-1 probability for each reply token after the first (index i: the
    token at prompt_len + 1 + i), in float32."""
    logits = model(mx.array(seq)[None])[0, prompt_len:-1].astype(mx.float32)
    return np.array(mx.softmax(logits, axis=-1).max(axis=-1))


def buckets(confidence: np.ndarray) -> np.ndarray:
    """The bucket of each confidence: EDGES[b] <= c < EDGES[b + 1] (1.0 in the last)."""
    return np.clip(np.searchsorted(EDGES, confidence, side="right") - 1, 0, len(EDGES) - 2)


def novelty(seq: list[int], prompt_len: int) -> np.ndarray:
    """Per reply token after the first (as `target_confidence`): 1 where the pair (previous
    token, token) occurs in the prompt, else 2 where it occurred earlier in the reply, else 0
    (new: nothing in the context to copy it from)."""
    in_prompt = set(zip(seq[:prompt_len - 1], seq[1:prompt_len]))
    in_reply: set[tuple[int, int]] = set()
    out = []
    for a in range(prompt_len, len(seq) - 1):
        in_reply.add((seq[a - 1], seq[a]))  # the pair ending at the anchor
        pair = (seq[a], seq[a + 1])
        out.append(1 if pair in in_prompt else 2 if pair in in_reply else 0)
    return np.array(out, np.int8)


def walk_starts(runs: np.ndarray) -> np.ndarray:
    """The anchors (indices into `runs`) a greedy decode's cycles start from: 0, then one
    past each cycle's committed run (`objective.walk_cycles`' walk)."""
    return np.cumsum([0, *walk_cycles(runs, len(runs) + 1)], dtype=np.int64)[:-1]


def by_anchor(confidence: list[np.ndarray], runs: list[np.ndarray]) -> dict:
    """Per bucket of the target's probability of the anchor token (anchor i >= 1 of a reply:
    `confidence[i - 1]`): its share of all anchors and of the walk's cycle starts, and the
    draft's mean run and first-slot agreement from there."""
    conf, run, walk = [], [], []
    for c, r in zip(confidence, runs, strict=True):
        n = min(len(r), len(c) + 1)
        conf.append(c[: n - 1])
        run.append(r[1:n])
        starts = walk_starts(r)
        walk.append(c[starts[(starts >= 1) & (starts < n)] - 1])
    conf, run, walk = np.concatenate(conf), np.concatenate(run), np.concatenate(walk)
    b, bw = buckets(conf), buckets(walk)
    n = len(EDGES) - 1
    return {"anchors": int(len(conf)), "walk_starts": int(len(walk)),
            "share_all": [float(np.mean(b == i)) for i in range(n)],
            "share_walk": [float(np.mean(bw == i)) for i in range(n)],
            "mean_run": [float(run[b == i].mean()) if (b == i).any() else None
                         for i in range(n)],
            "agree": [float((run[b == i] >= 1).mean()) if (b == i).any() else None
                      for i in range(n)]}


def summarize(confidence: np.ndarray, agree: dict[str, np.ndarray],
              novel: np.ndarray) -> dict:
    b = buckets(confidence)
    n = len(EDGES) - 1
    sure = confidence > SURE
    return {
        "tokens": int(len(confidence)),
        "target_top1_mean": float(confidence.mean()),
        "bucket_share": [float(np.mean(b == i)) for i in range(n)],
        "novelty_share": {k: float(np.mean(novel == i)) for i, k in enumerate(NOVELTY)},
        "drafts": {name: {"agree": float(hit.mean()),
                          "agree_by_bucket": [float(hit[b == i].mean()) if (b == i).any()
                                              else None for i in range(n)],
                          # the target sure (> SURE): new tokens against copyable ones
                          "agree_sure_by_novelty": {
                              k: float(hit[sure & (novel == i)].mean())
                              if (sure & (novel == i)).any() else None
                              for i, k in enumerate(NOVELTY)}}
                   for name, hit in agree.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("walk", type=Path, nargs="?",
                   help="a draft_acceptance.py --walk report (its suites' replies)")
    p.add_argument("--draft", action="append", required=True, help="draft folder (repeatable)")
    p.add_argument("--model", help="the target (default: the default pair's, offline SmolLM2)")
    p.add_argument("--heldout", help="also these answers (a Dataset .npz)")
    p.add_argument("--heldout-limit", type=int, default=40)
    p.add_argument("--by-source", action="store_true",
                   help="one row per prompt source of the held-out answers")
    p.add_argument("--source", action="append",
                   help="only held-out answers to this source's prompts (repeatable)")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    if args.walk is None and not args.heldout:
        raise SystemExit("nothing to measure. Fix: name a --walk report, --heldout, or both.")
    replies = {}  # the same greedy replies for every draft of the report: the first one's
    if args.walk is not None:
        replies = next(iter(json.loads(args.walk.read_text())["drafts"].values()))
    suites = {suite: rows["runs"] for suite, rows in replies.items() if suite != "heldout"}
    if not all("reply" in r for runs in suites.values() for r in runs):
        raise SystemExit(f"{args.walk}: its runs keep no replies. Fix: make it with --walk.")
    sets = {suite: [(r["prompt_tokens"] + r["reply"], len(r["prompt_tokens"])) for r in runs]
            for suite, runs in suites.items()}
    if args.heldout:
        data = Dataset.load(Path(args.heldout))
        picked = [i for i in range(len(data))  # a record id's prefix is its source
                  if not args.source or data.meta["ids"][i].rsplit("-", 1)[0] in args.source]
        for i in picked[: args.heldout_limit]:
            name = "heldout"
            if args.by_source:
                name += ":" + data.meta["ids"][i].rsplit("-", 1)[0]
            sets.setdefault(name, []).append(([int(t) for t in data.sequences[i]],
                                              int(data.prompt_lens[i])))
    drafts = {folder: load_draft_folder(Path(folder)) for folder in args.draft}
    base = DFlashRuntime.from_pretrained(model=args.model, draft=args.draft[0])
    out = {"command": "python " + " ".join(sys.argv), "walk": args.walk and str(args.walk),
           "edges": list(EDGES), "machine": machine_info(), "versions": versions(),
           "sets": {}}
    for name, seqs in sets.items():
        confidence, novel, agree = [], [], {k: [] for k in drafts}
        every_c, every_run = [], {k: [] for k in drafts}
        for seq, prompt_len in seqs:
            c = target_confidence(base.model, seq, prompt_len)
            for k, draft in drafts.items():
                runs = anchor_runs(draft, base.target, seq, prompt_len)  # anchor prompt_len + i
                agree[k].append(runs[: len(c)] >= 1)
                every_run[k].append(runs)
            every_c.append(c)
            confidence.append(c[: len(runs)])
            novel.append(novelty(seq, prompt_len)[: len(runs)])
        row = summarize(np.concatenate(confidence),
                        {k: np.concatenate(v) for k, v in agree.items()}, np.concatenate(novel))
        for k in drafts:
            row["drafts"][k]["by_anchor_confidence"] = by_anchor(every_c, every_run[k])
        out["sets"][name] = row
        line = " ".join(f"{s:.2f}" for s in row["bucket_share"])
        print(f"{name:9s} ({len(seqs)} replies) target top-1 "
              f"{row['target_top1_mean']:.3f}  shares {line}")
        for k, d in row["drafts"].items():
            by = " ".join("-" if a is None else f"{a:.2f}" for a in d["agree_by_bucket"])
            sure = " ".join("-" if a is None else f"{n} {a:.2f}"
                            for n, a in d["agree_sure_by_novelty"].items())
            print(f"  {k}: agree {d['agree']:.3f}  by bucket {by}  sure: {sure}", flush=True)
            a = d["by_anchor_confidence"]
            print("    by anchor-token bucket: share of anchors / of cycle starts / mean run: "
                  + "  ".join(f"{x:.2f}/{y:.2f}/{'-' if r is None else f'{r:.2f}'}" for x, y, r
                              in zip(a["share_all"], a["share_walk"], a["mean_run"])))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
