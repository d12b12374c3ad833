"""How much of a training set's answers repeat earlier text: the share of reply tokens that end
a 4-gram already in the sequence (prompt included: `engine.train.objective.repeated_positions`,
what `--repeat-weight` weighs), and the metric's repeated-4-gram share of the reply alone
(`engine.bench.metrics.repeated_ngram_share`), over whole replies and their first 256 tokens
(the suites' length).

    python scripts/loop_share.py benchmarks/stage5/heldout.npz benchmarks/stage5/data-5-0.npz \
        ~/.cache/dflash-chat/train-data/stage20/gen-20-1.npz --json F
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.bench.metrics import repeated_ngram_share  # noqa: E402
from engine.train.dataset import Dataset  # noqa: E402
from engine.train.objective import repeated_positions  # noqa: E402

FIRST = 256  # the suites' reply length


def shares(data: Dataset, limit: int) -> dict:
    n = min(len(data), limit)
    reply_tokens = repeated_tokens = 0
    metric, metric_first = [], []
    for seq, plen in zip(data.sequences[:n], data.prompt_lens[:n]):
        tokens = np.asarray(seq)[None]
        repeated = repeated_positions(tokens, np.array([len(seq)]))[0, plen:]
        reply_tokens += len(repeated)
        repeated_tokens += int(repeated.sum())
        reply = list(seq[plen:])
        metric.append((repeated_ngram_share(reply), len(reply)))
        metric_first.append(repeated_ngram_share(reply[:FIRST]))
    weights = sum(w for _, w in metric)
    return {
        "answers": n,
        "mean_reply_tokens": reply_tokens / max(n, 1),
        "repeated_token_share": repeated_tokens / max(reply_tokens, 1),
        "repeat4_share_token_weighted": sum(s * w for s, w in metric) / max(weights, 1),
        f"repeat4_share_first_{FIRST}_mean": float(np.mean(metric_first)) if n else 0.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="+", help="datasets (.npz, engine.train.dataset format)")
    p.add_argument("--limit", type=int, default=4000, help="answers per dataset")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    out = {"command": shlex.join(["python", "scripts/loop_share.py", *sys.argv[1:]]),
           "sets": {}}
    for path in args.data:
        row = shares(Dataset.load(Path(path).expanduser()), args.limit)
        out["sets"][Path(path).name] = row
        print(f"{Path(path).name}: {row['answers']} answers, {row['mean_reply_tokens']:.0f} "
              f"tokens each, repeated tokens {row['repeated_token_share']:.2f}, repeated "
              f"4-grams {row['repeat4_share_token_weighted']:.2f} (first {FIRST}: "
              f"{row[f'repeat4_share_first_{FIRST}_mean']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
