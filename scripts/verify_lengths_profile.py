"""What a verify forward of 1..16 tokens costs here, and the lengths the engine pads cuts to.

    python scripts/verify_lengths_profile.py [--rounds 20] [--context 256] [--json PATH]

The engine's own measurement (engine/verify_lengths.py: the fastest of a few rounds, lengths
alternating) with more rounds, on the default pair's target and the shipped draft's taps, in
the dtype the engine runs here. Each length's fastest and median time, and `lengths[n]`: the
length a cut of n tokens is verified as.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def profile(rounds: int, context: int, size: int) -> dict:
    import engine  # noqa: F401, I001  (first: its CPU BLAS must load before MLX)
    from engine.bench.environment import blas_info, machine_info, versions
    from engine.runtime import DFlashRuntime, target_model_dtype
    from engine.verify_lengths import padded_lengths, timings

    rt = DFlashRuntime.from_pretrained()
    taps = rt.draft.args.target_layer_ids
    samples = timings(rt.target, taps, size, rounds, context)
    fastest = [min(s) for s in samples]
    return {"model": rt.target_id, "dtype": str(target_model_dtype(rt.model)),
            "context": context, "rounds": rounds, "taps": list(taps),
            "fastest_ms": [round(t * 1e3, 2) for t in fastest],
            "median_ms": [round(statistics.median(s) * 1e3, 2) for s in samples],
            "lengths": list(padded_lengths(fastest)),
            "engine_lengths": list(rt.plan.verify_lengths) or None,
            "machine": machine_info(), "blas": blas_info(), "versions": versions()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--json")
    args = p.parse_args()
    result = {"command": "python " + shlex.join(sys.argv),
              **profile(args.rounds, args.context, args.size)}
    for n, (fast, median) in enumerate(zip(result["fastest_ms"], result["median_ms"]), 1):
        print(f"T{n:<2} fastest {fast:7.2f} ms  median {median:7.2f} ms  "
              f"a cut of {n} verifies {result['lengths'][n]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
