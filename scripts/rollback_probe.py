"""Time GatedDeltaNet rollback alone, kernels vs portable, on a synthetic model shape.

    python scripts/rollback_probe.py [--model qwen3.5-9b] [--layers 8] [--json PATH]

For each implementation: prefill `ctx` random tokens, then per keep in 1..16: a 16-token
verify (evaluated), then `rollback(keep)` timed twice: host time to build it, and the
time until its outputs are evaluated. Medians over `--iters`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def probe(name: str, layers: int, dtype: str, ctx: int, iters: int, kernels: str) -> dict:
    import mlx.core as mx

    from engine.bench.synthetic import build_target, rollback_timings
    from engine.cycle import prefill
    from engine.targets import adapter_for

    model = build_target(name, layers, None, dtype, 0)
    target = adapter_for(model, enable_tape_replay=True, kernels=kernels)
    cache = target.make_cache()
    prefill(target, cache, [(31 * i) % 5000 + 7 for i in range(ctx)], 512)
    block = mx.array([[(17 * i) % 5000 + 3 for i in range(16)]])
    rows = {}
    for keep in (1, 4, 8, 12, 16):
        rows[f"keep{keep}"] = rollback_timings(target, cache, block, keep, iters)
        print(kernels, keep, {k: round(v, 2) for k, v in rows[f"keep{keep}"].items()},
              flush=True)
    return {"kernels": getattr(target.kernels, "name", kernels), "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3.5-9b")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args()
    out = {"model": args.model, "layers": args.layers, "dtype": args.dtype, "ctx": args.ctx,
           "runs": [probe(args.model, args.layers, args.dtype, args.ctx, args.iters, k)
                    for k in ("auto", "portable")]}
    if args.json:
        out = {"command": shlex.join(sys.argv), **out}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
