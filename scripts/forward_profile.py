"""Where a verify forward's time goes: building the graph on the host vs running it.

    python scripts/forward_profile.py [--model ID] [--ctx 256] [--linear kernel] [--json PATH]

For T new tokens (`--sizes`, default 1 and 16) after `ctx` tokens of context, the median over
`--iters` of: host time to build the target's forward graph (no evaluation), the time to evaluate
it, and both together. The cache is rolled back after each run, so every sample starts
from the same state. Run it once per dtype; the JSON names the machine, versions, BLAS and
switches. On a CPU, `--linear` picks what computes the Linear products of a few rows: the
engine's default (`kernel`: engine/kernels/cpu_linear.py where it applies), its AVX2 tiles
(`avx2`, also on an AVX-512 CPU) or the BLAS (`blas`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def use_linear(choice: str) -> None:
    """What computes a few rows' Linear products from now on in this process (`--linear`)."""
    from engine.kernels import cpu_linear

    if choice == "blas":
        cpu_linear.fits = lambda x, weight: False
    elif choice == "avx2":
        products = cpu_linear.products
        cpu_linear.products = lambda lib, x, weights, use512=True: products(lib, x, weights,
                                                                            False)


def profile(model_id: str | None, dtype: str, ctx: int, iters: int,
            sizes: tuple[int, ...] = (1, 16), linear: str = "kernel") -> dict:
    import engine  # noqa: F401, I001  (first: its CPU BLAS must load before MLX)
    import mlx.core as mx

    from engine.bench.environment import environment
    from engine.cycle import prefill
    from engine.device import current as current_backend
    from engine.loading import load_target
    from engine.registry import default_pair
    from engine.targets import adapter_for
    from engine.targets.base import cache_arrays

    use_linear(linear)
    model, _, name = load_target(model_id or default_pair().target, dtype)
    target = adapter_for(model)
    cache = target.make_cache()
    prompt = [(7 * i + 11) % 1000 + 100 for i in range(ctx)]
    prefill(target, cache, prompt, 512)
    out: dict = {"model": name, "dtype": dtype, "ctx": ctx, "iters": iters, "linear": linear,
                 "backend": current_backend(), **environment(), "rows": {}}
    taps = [1, target.num_layers // 2, target.num_layers - 2]
    for T in sorted(set(sizes) | {1, 16}):
        ids = mx.array([[(13 * i + 5) % 1000 + 100 for i in range(T)]])
        build, run, total = [], [], []
        for i in range(iters + 3):
            target.begin_verify(cache)
            t0 = time.perf_counter()
            logits, tapped = target.forward(ids, cache, taps)
            choice = mx.argmax(logits[0], axis=-1)
            t1 = time.perf_counter()
            mx.eval(choice, tapped, cache_arrays(cache))
            t2 = time.perf_counter()
            target.rollback(cache, keep=0, verified=T)
            mx.eval(cache_arrays(cache))
            if i >= 3:  # the first runs compile kernels
                build.append(t1 - t0)
                run.append(t2 - t1)
                total.append(t2 - t0)
        out["rows"][f"T{T}"] = {"build_ms": statistics.median(build) * 1e3,
                                "eval_ms": statistics.median(run) * 1e3,
                                "total_ms": statistics.median(total) * 1e3}
    out["t16_over_t1"] = out["rows"]["T16"]["total_ms"] / out["rows"]["T1"]["total_ms"]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--sizes", type=lambda t: tuple(int(x) for x in t.split(",")), default=(1, 16),
                   help="comma-separated token counts per forward (1 and 16 always included)")
    p.add_argument("--linear", choices=("kernel", "avx2", "blas"), default="kernel",
                   help="a CPU's Linear products of a few rows: the engine's default, its AVX2 "
                        "tiles, or the BLAS")
    p.add_argument("--json")
    args = p.parse_args()
    result = profile(args.model, args.dtype, args.ctx, args.iters, args.sizes, args.linear)
    for key, row in result["rows"].items():
        print(f"{result['dtype']} {key}: build {row['build_ms']:.2f} ms, eval "
              f"{row['eval_ms']:.2f} ms, total {row['total_ms']:.2f} ms")
    print(f"T16 / T1: {result['t16_over_t1']:.2f}")
    if args.json:
        result = {"command": shlex.join(sys.argv), **result}
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
