"""SYNTHETIC benchmark of a target sharded over mx.distributed ranks (one process per rank;
scripts/sharded_gpu_bench.sh starts them): random weights at a real model's shapes, split by
mlx-lm's own Model.shard(group), the whole draft on every rank, oracle drafts at chosen
tokens/cycle; speed-up against mlx-lm's sharded plain decoding (generate_step on the same
sharded model) in the same run. Rank 0 writes the JSON.

    python scripts/sharded_bench.py --backend nccl --synthetic qwen3.5-27b \\
        --tokens-per-cycle 4 8 --json benchmarks/synthetic-qwen3.5-27b-sharded2-bf16-h200.json

Every rank seeds the same generator and builds the same lazy model, its values peaked as the
single-process benchmark's (engine/bench/peaked.py, before sharding), so the replicated parts
(embeddings, norms, draft) are identical; shard() then keeps this rank's slices and only
those are evaluated.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402, F401  (first: it picks the CPU BLAS before MLX loads)

# isort: split
import mlx.core as mx  # noqa: E402
from mlx_lm.generate import generation_stream  # noqa: E402

from engine.bench.environment import environment  # noqa: E402
from engine.bench.metrics import repeated_ngram_share  # noqa: E402
from engine.bench.peaked import WEIGHTS, greedy_margins  # noqa: E402
from engine.bench.synthetic import (  # noqa: E402
    PREFILL_CHUNK,
    _materialize,
    build_draft,
    draft_args,
    forward_timings,
    lazy_target,
    load_spec,
    parse_overrides,
    run_dflash,
    target_config,
)
from engine.bench.timing import run_baseline, versus  # noqa: E402
from engine.distributed import Lockstep, check_shardable, init_group  # noqa: E402
from engine.targets import adapter_for  # noqa: E402


def build_sharded_target(name: str, layers: int | None, overrides: dict, dtype: str,
                         group: mx.distributed.Group, seed: int):
    model = lazy_target(name, layers, overrides, seed)  # nothing is evaluated yet
    check_shardable(model, group.size())
    model.shard(group)
    _materialize(model, getattr(mx, dtype))
    return model


def drain() -> None:
    """Finish every queued step on both streams before the next phase's collectives:
    generate_step leaves one step queued on its own stream, whose all_sums must not
    interleave with the next phase's (on the default stream)."""
    mx.synchronize(generation_stream)
    mx.synchronize()


RECORD_ROUNDS = 6  # oracle runs that may be needed for a self-consistent reference
NEAR_TIE_GAP = 0.25  # bf16 logit gap below which a flipped argmax is a near-tie, not a bug


def oracle_run(target, draft, prompt: list[int], reference: list[int], max_tokens: int,
               block_size: int, tpc: float, seed: int):
    """Oracle runs until the reference is what the verify itself commits -> (side, cycle
    summary, runs it took, whether it got there). In bf16 a batched verify may round a
    near-tie the other way than plain decoding; after that a reference from plain decoding
    matches nothing and tokens/cycle collapses, so the oracle's reference becomes the run's
    own output."""
    rounds = 0
    while True:
        rounds += 1
        side, cycles = run_dflash(target, draft, prompt, reference, max_tokens, block_size,
                                  tpc, seed)
        drain()
        if side.tokens == reference or rounds == RECORD_ROUNDS:
            return side, cycles, rounds, side.tokens == reference
        reference = side.tokens


def logit_gap(model, ids: list[int], want: int, got: int) -> float:
    """The sharded model's logit of `want` minus that of `got` after `ids` (one forward)."""
    logits = model(mx.array([ids]))[0, -1].astype(mx.float32)
    return float((logits[want] - logits[got]).item())


def ranks_agree(step: Lockstep, tokens: list[int]) -> bool:
    """Whether every rank decoded the same tokens (mlx-lm's plain decoding lets each rank
    take its own argmax)."""
    mine = mx.array(tokens, dtype=mx.int32)
    same = (step.broadcast(mine) == mine).all().astype(mx.float32)
    return int(mx.distributed.all_sum(same, group=step.group).item()) == step.size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--synthetic", default="qwen3.5-27b")
    p.add_argument("--backend", default="any", help="any, ring, jaccl, mpi or nccl")
    p.add_argument("--layers", type=int)
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--draft-override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on CPU")
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--tokens-per-cycle", type=float, nargs="+", default=[4.0, 8.0])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=5, help="forward-timing iterations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="rank 0 writes the report here")
    args = p.parse_args(argv)

    from engine.device import current

    group = init_group(args.backend)
    step = Lockstep(group)
    backend = current()
    dtype = args.dtype or ("float32" if backend == "cpu" else "bfloat16")
    built = time.perf_counter()
    overrides = parse_overrides(args.override)
    model = build_sharded_target(args.synthetic, args.layers, overrides, dtype,
                                 group, args.seed)
    target = adapter_for(model)
    target.lockstep = step
    dargs = draft_args(args.synthetic, target, parse_overrides(args.draft_override))
    draft = build_draft(dargs, dtype, args.seed + 1)
    build_s = time.perf_counter() - built

    rng = random.Random(args.seed)
    prompt = [rng.randrange(target.vocab_size) for _ in range(args.ctx)]
    target.warm_up()
    warm = run_baseline(model, prompt, 8, PREFILL_CHUNK).tokens  # compile and allocate
    drain()
    run_dflash(target, draft, prompt, warm, 8, args.block_size, args.tokens_per_cycle[0],
               args.seed)
    drain()
    base = run_baseline(model, prompt, args.max_tokens, PREFILL_CHUNK)
    drain()
    agree = ranks_agree(step, base.tokens)
    margins = greedy_margins(model, prompt, args.max_tokens, PREFILL_CHUNK)
    drain()
    runs = []
    for tpc in args.tokens_per_cycle:
        flash, cycles, rounds, consistent = oracle_run(target, draft, prompt, list(base.tokens),
                                           args.max_tokens, args.block_size, tpc, args.seed)
        compared = versus(base, flash)
        mismatch = compared["first_mismatch"]
        gap = None
        if mismatch is not None and agree and mismatch < min(len(base.tokens),
                                                             len(flash.tokens)):
            gap = logit_gap(model, prompt + base.tokens[:mismatch], base.tokens[mismatch],
                            flash.tokens[mismatch])
        runs.append({
            "tokens_per_cycle_target": tpc,
            "dflash": {**flash.summary(), **cycles},
            **compared,
            "divergence_logit_gap": gap,
            "near_tie": None if gap is None else abs(gap) < NEAR_TIE_GAP,
            "oracle_reference_runs": rounds,
            "oracle_self_consistent": consistent,
        })
    fwd = forward_timings(model, target, prompt, args.iters, args.block_size)
    drain()
    if step.leader:
        report = {
            "command": shlex.join(sys.argv),
            "synthetic": True,
            "title": f"SYNTHETIC sharded benchmark (random weights, oracle draft): "
                     f"{args.synthetic} over {step.size} ranks",
            "model": args.synthetic,
            "source_config": load_spec(args.synthetic)["source"],
            "note": ("random weights at the model's shapes, peaked so the greedy "
                     "continuation is robust to rounding, tensor-parallel with mlx-lm's "
                     "Model.shard(); acceptance is set by the oracle, so speed-ups show the "
                     "machines' cost structure, not a real draft's quality"),
            "weights": WEIGHTS,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **environment(),
            "backend": backend,
            "distributed_backend": args.backend,
            "ranks": step.size,
            "dtype": dtype,
            "target_config": target_config(args.synthetic, args.layers, overrides),
            "draft_config": dargs.to_config(),
            "settings": {"ctx": args.ctx, "max_tokens": args.max_tokens,
                         "block_size": args.block_size, "greedy": True,
                         "prefill_step": PREFILL_CHUNK, "seed": args.seed,
                         "draft_forward_timed": True, "verify_cut": None},
            "baseline_function": "mlx_lm.generate.generate_step on the sharded model "
                                 "(mlx-lm's sharded plain decoding)",
            "build_s": build_s,
            "forward": fwd,
            "baseline": base.summary(),
            "baseline_ranks_agree": agree,
            "greedy_margin_min": min(margins),
            "repeated_4gram_share": repeated_ngram_share(base.tokens),
            "runs": runs,
            "definitions": {
                "speedup": "end-to-end tok/s (prefill of ctx included), DFlash / baseline",
                "decode_speedup": "tok/s after the first token, DFlash / baseline",
                "t_ar_s / t_verify16_s": "median 1-token mlx-lm forward / 16-token adapter "
                                         "verify forward after ctx tokens, sharded",
                "divergence_logit_gap": "where DFlash first differs from the baseline: the "
                                        "sharded model's logit of the baseline's token minus "
                                        "DFlash's there; near_tie: |gap| below "
                                        f"{NEAR_TIE_GAP} (bf16 rounding), else a bug",
                "oracle_reference_runs": "oracle runs until its reference was what the "
                                         "verify itself commits; 1 when no verify rounded "
                                         "a choice differently",
                "greedy_margin_min": "smallest top-1 minus top-2 logit over the baseline's "
                                     "tokens (sharded plain decoding replayed, untimed)",
                "repeated_4gram_share": "share of the baseline's 4-grams that occurred "
                                        "earlier in it",
            },
        }
        for run in runs:
            print(f"tokens/cycle {run['tokens_per_cycle_target']}: speed-up "
                  f"{run['speedup']:.2f}x e2e, {(run['decode_speedup'] or 0):.2f}x decode, "
                  f"measured tokens/cycle {run['dflash']['tokens_per_cycle']:.2f}, "
                  f"oracle reference runs {run['oracle_reference_runs']} (self-consistent "
                  f"{run['oracle_self_consistent']}), token_match {run['token_match']}"
                  + ("" if run["token_match"] else f" (first mismatch {run['first_mismatch']}, "
                     f"logit gap {run['divergence_logit_gap']})"))
        print(f"baseline {base.tokens_per_second:.1f} tok/s; T_ar {fwd['t_ar_s'] * 1e3:.2f} "
              f"ms, T_verify16 {fwd['t_verify16_s'] * 1e3:.2f} ms; ranks agree {agree}; "
              f"greedy margin min {min(margins):.2f}, repeated 4-grams "
              f"{report['repeated_4gram_share']:.1%}")
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=2, default=str))
            print(f"wrote {args.json}")
    ok = agree and all(r["token_match"] or r["near_tie"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    from engine.errors import DFlashError

    try:
        sys.exit(main())
    except DFlashError as exc:  # no group, unshardable shape: one line
        print(f"sharded_bench: {exc}", file=sys.stderr)
        sys.exit(2)
