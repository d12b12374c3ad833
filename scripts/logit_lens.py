"""How much of the target's pick its last layers decide: the target's own next-token argmax
read from an earlier layer's output (its final norm and lm_head applied there, the "logit
lens") against the argmax of the whole forward, on the suites' greedy replies.

    python scripts/logit_lens.py --limit 4 --layers 10,18,24,26,27,28 --json F

A draft predicts a block's first slot from the target's features of the context and the
anchor token alone, so it must stand in for every layer the target runs on the anchor; a
peek at the anchor through the target's first layers (`train-draft --anchor-peek`) hands it
the output of one of them. Where even the target's own layer-l output names the final pick
only part of the time, the layers after l decide the rest, and a draft that sees no further
than l must compute them.
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
from engine.bench.suites import PICKS, SUITES, load_prompts  # noqa: E402
from engine.config import DFlashConfig  # noqa: E402
from engine.runtime import DFlashRuntime  # noqa: E402
from engine.targets.base import TargetAdapter  # noqa: E402


def lens_hits(target: TargetAdapter, seq: list[int], prompt_len: int, layers: list[int],
              top: int = 5) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per layer: (bool [n]: its lens argmax is the final argmax, bool [n]: the final argmax
    is among its lens top `top`) at each reply position's prediction (the token after it),
    n = len(seq) - prompt_len (the last position predicts past the reply: counted too)."""
    logits, taps = target.forward(mx.array([seq]), target.make_cache(), layers)
    final = mx.argmax(logits[0, prompt_len - 1:-1], axis=-1)
    H = taps.shape[-1] // len(layers)
    out = {}
    for k, layer in enumerate(layers):
        h = taps[0, prompt_len - 1:-1, k * H:(k + 1) * H]
        lens = target.lm_head(target.inner.norm(h)).astype(mx.float32)
        ranked = mx.argsort(-lens, axis=-1)[:, :top]
        out[layer] = (np.array(ranked[:, 0] == final),
                      np.array((ranked == final[:, None]).any(axis=-1)))
    return out


def layer_list(text: str) -> list[int]:
    try:
        layers = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected layer numbers, e.g. 18,27") from None
    if not layers or layers[0] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected layer numbers >= 0, e.g. 18,27")
    return layers


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="the target (default: the default pair's, offline SmolLM2)")
    p.add_argument("--draft", help="the draft that decodes the replies (default: the pair's)")
    p.add_argument("--suite", action="append", choices=sorted(SUITES),
                   help="suite (repeatable; default: all three)")
    p.add_argument("--limit", type=int, default=4, help="N prompts of each suite (see --pick)")
    p.add_argument("--pick", choices=PICKS, default="spread")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--layers", type=layer_list, default=[10, 18, 24, 26, 27, 28],
                   help="the layers read (0-based decoder layers; default 10,18,24,26,27,28)")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    rt = DFlashRuntime.from_pretrained(model=args.model, draft=args.draft,
                                      config=DFlashConfig())
    target = rt.target
    n_layers = len(target.layers)
    if args.layers[-1] >= n_layers:
        p.error(f"--layers {args.layers[-1]}: the target has layers 0..{n_layers - 1}")
    report = {"command": "python " + " ".join(sys.argv), "max_tokens": args.max_tokens,
              "layers": args.layers, "target_layers": n_layers, "machine": machine_info(),
              "versions": versions(), "suites": {}}
    for suite in args.suite or sorted(SUITES):
        prompts, _ = load_prompts(suite=suite, limit=args.limit, pick=args.pick)
        top1 = {k: [] for k in args.layers}
        top5 = {k: [] for k in args.layers}
        for prompt in prompts:
            messages = [{"role": "user", "content": prompt.text}]
            reply = list(rt.generate(messages, max_tokens=args.max_tokens).tokens)
            ids = rt.encode(messages)
            for layer, (hit1, hit5) in lens_hits(target, ids + reply, len(ids),
                                                 args.layers).items():
                top1[layer] += hit1.tolist()
                top5[layer] += hit5.tolist()
        row = {str(k): {"top1": float(np.mean(top1[k])), "top5": float(np.mean(top5[k]))}
               for k in args.layers}
        report["suites"][suite] = {"prompts": len(prompts), "positions": len(top1[args.layers[0]]),
                                   "by_layer": row}
        print(f"{suite:9s} " + "  ".join(f"L{k}: {v['top1']:.2f} / {v['top5']:.2f}"
                                         for k, v in row.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
