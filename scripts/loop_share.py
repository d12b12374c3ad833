"""How much of a training set's answers repeat earlier text: the share of reply tokens that end
a 4-gram already in the sequence (prompt included: `engine.train.objective.repeated_positions`,
what `--repeat-weight` weighs), and the metric's repeated-4-gram share of the reply alone
(`engine.bench.metrics.repeated_ngram_share`), over whole replies and their first 256 tokens
(the suites' length). With `--draft D`, also what those slots weigh in the training loss:
D's decay-weighted cross-entropy and slot accuracy on `--sample` answers of each set, repeated
slots against the rest (the loss `--repeat-weight` reweighs).

    python scripts/loop_share.py benchmarks/stage5/heldout.npz benchmarks/stage5/data-5-0.npz \
        ~/.cache/dflash-chat/train-data/stage20/gen-20-1.npz --json F
    python scripts/loop_share.py ~/.cache/dflash-chat/train-data/stage20/gen-20-1.npz \
        --draft engine/drafts/smollm2-135m-instruct-dflash --sample 96 --json F   # ~8 min
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401,I001  (before mlx: the CPU's BLAS)
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


def load_pair(model: str, draft_dir: str) -> tuple[Any, Any]:
    """(target adapter, draft) for `loss_split`."""
    from engine.loading import load_draft_folder, load_target
    from engine.targets import adapter_for

    return adapter_for(load_target(model)[0]), load_draft_folder(Path(draft_dir))


def loss_split(data: Dataset, target: Any, draft: Any, sample: int, seed: int = 0) -> dict:
    """The draft's decay-weighted training loss and slot accuracy on `sample` answers, split
    into slots whose label ends a repeated 4-gram and the rest (96 anchors per answer)."""
    import mlx.core as mx

    from engine.train.objective import make_batch, slot_logits, slot_weights, target_taps

    rng = np.random.default_rng(seed)
    picked = rng.choice(len(data), min(sample, len(data)), replace=False).tolist()
    w = slot_weights(draft.args.block_size, 7.0)
    sums = {k: np.zeros(4) for k in ("repeated", "novel")}  # loss, weight, hits, slots
    for i in range(0, len(picked), 8):
        batch = make_batch(data, picked[i:i + 8], 96, draft.args.block_size,
                           draft.args.mask_token_id, rng, mark_repeats=True)
        taps = target_taps(target, batch.tokens, draft.training_tap_ids)
        logits = slot_logits(draft, target, batch, taps).astype(mx.float32)
        ce = mx.logsumexp(logits, -1) - mx.take_along_axis(logits, batch.labels[..., None],
                                                           -1)[..., 0]
        hit = (mx.argmax(logits, -1) == batch.labels) * batch.valid
        for name, mask in (("repeated", batch.repeats), ("novel", 1 - batch.repeats)):
            weight = batch.valid * w * mask
            sums[name] += [float((ce * weight).sum()), float(weight.sum()),
                           float((hit * mask).sum()), float((batch.valid * mask).sum())]
    loss, weight = (sum(v[j] for v in sums.values()) for j in (0, 1))
    return {"answers": len(picked), **{
        name: {"loss_share": v[0] / loss, "weight_share": v[1] / weight,
               "mean_loss": v[0] / max(v[1], 1e-9), "slot_accuracy": v[2] / max(v[3], 1)}
        for name, v in sums.items()}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="+", help="datasets (.npz, engine.train.dataset format)")
    p.add_argument("--limit", type=int, default=4000, help="answers per dataset")
    p.add_argument("--draft", help="also split this draft's training loss (slow: a forward "
                   "of the target and the draft per answer)")
    p.add_argument("--sample", type=int, default=96, help="answers per set for --draft")
    p.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                   help="the draft's target (default: the offline SmolLM2)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    out = {"command": shlex.join(["python", "scripts/loop_share.py", *given]),
           "sets": {}}
    pair = load_pair(args.model, args.draft) if args.draft else None
    for path in args.data:
        data = Dataset.load(Path(path).expanduser())
        row = shares(data, args.limit)
        out["sets"][Path(path).name] = row
        print(f"{Path(path).name}: {row['answers']} answers, {row['mean_reply_tokens']:.0f} "
              f"tokens each, repeated tokens {row['repeated_token_share']:.2f}, repeated "
              f"4-grams {row['repeat4_share_token_weighted']:.2f} (first {FIRST}: "
              f"{row[f'repeat4_share_first_{FIRST}_mean']:.2f})")
        if pair is not None:
            split = loss_split(data, *pair, args.sample)
            row["loss_split"] = split = {"model": args.model, "draft": args.draft, **split}
            for name in ("repeated", "novel"):
                part = split[name]
                print(f"  {name} slots: {part['weight_share']:.2f} of the slot weight, "
                      f"{part['loss_share']:.2f} of the loss (mean {part['mean_loss']:.2f}), "
                      f"slot accuracy {part['slot_accuracy']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
