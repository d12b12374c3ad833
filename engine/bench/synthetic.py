"""`dflash benchmark --synthetic MODEL`: SYNTHETIC speed benchmark on random-weight targets.

Random weights at a real model's shapes (data/synthetic/*.json), their values peaked
(peaked.py: the greedy continuation is a large-margin function of the current token, so bf16
rounding does not flip it), a random draft of the published size, and an oracle proposer
that agrees with the target's greedy continuation at a chosen mean tokens-per-cycle. It
measures what the machine does with those shapes (T_verify16 / T_ar at a context length,
per-phase cycle times, end-to-end speed-up against mlx-lm's generate_step on the same model),
not acceptance: acceptance is an input here. Every output says "synthetic".

The real draft forward still runs every cycle (its output is discarded) so its cost is
counted; the oracle needs the target's greedy continuation, so plain decoding runs first,
then recorded oracle runs until the reference is what the verify itself commits (one run with
peaked weights; more would mean a verify rounded a choice the other way, see oracle.py). The
timed run reads the device once per cycle; the per-phase profile comes from a separate run
with every phase evaluated on its own.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

from ..config import DFlashConfig, add_queueing_args, queueing_from_args
from ..cycle import speculative_decode
from ..draft import DFlashDraft, DraftArgs, default_tap_ids
from ..plan import make_plan
from ..targets.base import TargetAdapter, cache_arrays, text_args
from .environment import environment
from .metrics import repeated_ngram_share
from .oracle import Oracle, OracleProposer, consistent_reference
from .peaked import WEIGHTS, greedy_margins, peak
from .timing import NEAR_TIE_GAP, Side, divergence, near_tie, run_baseline, versus

CONFIG_DIR = Path(__file__).resolve().parent / "data" / "synthetic"
MODELS = ("qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b", "qwen3-8b", "smollm2-135m")
PREFILL_CHUNK = 512  # DFlashConfig's default, for both sides


# -- models -------------------------------------------------------------------------------
def load_spec(name: str) -> dict:
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"unknown synthetic model {name!r}: use one of {', '.join(MODELS)}")
    return json.loads(path.read_text())


def target_config(name: str, layers: int | None = None,
                  overrides: dict | None = None) -> dict:
    """The mlx-lm config for `name` with --layers and --override applied."""
    spec = load_spec(name)["target"]
    cfg = dict(spec.get("text_config", spec))
    cfg.update(overrides or {})
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    interval = cfg.get("full_attention_interval")
    if interval and cfg["num_hidden_layers"] < interval:
        raise SystemExit(
            f"--layers {cfg['num_hidden_layers']} leaves no attention layer (one in every "
            f"{interval}): use at least {interval} layers or --override "
            "full_attention_interval=N")
    return {"model_type": cfg["model_type"], "text_config": cfg} if "text_config" in spec \
        else cfg


def _materialize(model: nn.Module, dtype: mx.Dtype) -> None:
    # Lazy random init + cast, evaluated a layer at a time so fp32 never all lives at once.
    model.set_dtype(dtype)
    inner = getattr(model, "language_model", model)
    for layer in inner.model.layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())


def lazy_target(name: str, layers: int | None = None, overrides: dict | None = None,
                seed: int = 0, peaked: bool = True) -> nn.Module:
    """A random-weight mlx-lm model with `name`'s shapes, not yet evaluated (float32);
    `peaked`: its greedy continuation made robust to rounding (peaked.py)."""
    from mlx_lm.utils import _get_classes

    config = target_config(name, layers, overrides)
    mx.random.seed(seed)
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    if peaked:
        peak(model, seed)
    return model


def build_target(name: str, layers: int | None = None, overrides: dict | None = None,
                 dtype: str = "float32", seed: int = 0, peaked: bool = True) -> nn.Module:
    model = lazy_target(name, layers, overrides, seed, peaked)
    _materialize(model, getattr(mx, dtype))
    return model


def draft_args(name: str, target: TargetAdapter, overrides: dict | None = None) -> DraftArgs:
    """The published-size draft for `name`, its taps by the documented default rule."""
    spec = dict(load_spec(name)["draft"])
    spec.update(overrides or {})
    n_target = target.num_layers
    taps = [min(max(t, 0), n_target - 1)
            for t in default_tap_ids(n_target, int(spec["num_taps"]))]
    vocab = target.vocab_size
    return DraftArgs(
        hidden_size=target.hidden_size, num_hidden_layers=int(spec["num_hidden_layers"]),
        num_attention_heads=int(spec["num_attention_heads"]),
        num_key_value_heads=int(spec["num_key_value_heads"]), head_dim=int(spec["head_dim"]),
        intermediate_size=int(spec["intermediate_size"]), num_target_layers=n_target,
        target_layer_ids=taps, mask_token_id=min(int(spec["mask_token_id"]), vocab - 1),
        block_size=int(spec["block_size"]), vocab_size=vocab,
        rope_theta=float(spec.get("rope_theta", 1_000_000.0)),
    )


def build_draft(args: DraftArgs, dtype: str, seed: int = 1) -> DFlashDraft:
    mx.random.seed(seed)
    draft = DFlashDraft(args)
    draft.set_dtype(getattr(mx, dtype))
    mx.eval(draft.parameters())
    return draft


class TimedTarget:
    """Delegates to an adapter; times each non-prefill forward (evaluated) so the cycle's
    verify lap splits into the forward and the accept that follows it."""

    def __init__(self, inner: TargetAdapter):
        self.inner = inner
        self.forward_s: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, tokens: mx.array, cache: list[Any], tap_ids: Sequence[int],
                last_only: bool = False) -> tuple[mx.array, mx.array]:
        start = time.perf_counter()
        logits, taps = self.inner.forward(tokens, cache, tap_ids, last_only)
        if not last_only:
            mx.eval(logits, taps)
            self.forward_s.append(time.perf_counter() - start)
        return logits, taps


# -- timed runs -----------------------------------------------------------------------------
def run_dflash(target: TargetAdapter, draft: DFlashDraft, prompt: list[int],
               reference: Sequence[int], max_tokens: int, block_size: int,
               tokens_per_cycle: float, seed: int, draft_cost: bool = True,
               profile: bool = False, prefetch: bool = False) -> tuple[Side, dict]:
    """speculative_decode (the engine's own loop) with the oracle proposer
    -> (the timed side, its cycle summary). `profile`: each phase and each verify forward
    evaluated on its own (device times per phase, more syncs: not the run to time);
    `prefetch`: the next draft forward queued before each cycle's sync (`Plan.prefetch`)."""
    timed = TimedTarget(target) if profile else None
    oracle = Oracle(reference, tokens_per_cycle, block_size, target.vocab_size, seed)
    proposer = OracleProposer(target, draft, oracle, draft_cost, prefetch=prefetch)
    tokens: list[int] = []
    cycles, walls = [], []
    mx.reset_peak_memory()
    start = time.perf_counter()
    first = last = None
    for commit in speculative_decode(timed or target, proposer, prompt, max_tokens,
                                     block_size, PREFILL_CHUNK, sync_phases=profile):
        now = time.perf_counter()
        tokens.extend(commit.tokens)
        if commit.cycle is not None:
            cycles.append(commit.cycle)
            walls.append(now - last)
        first = first or now
        last = now
    end = time.perf_counter()
    side = Side(tokens[:max_tokens], end - start, (first or end) - start,
                int(mx.get_peak_memory()), "length")
    return side, cycle_summary(cycles, walls, timed.forward_s if timed else [])


def cycle_summary(cycles: list, walls: list[float], forward_s: list[float]) -> dict:
    n = len(cycles)
    committed = [c.committed for c in cycles]
    totals = {
        "draft": sum(c.draft_s for c in cycles),
        "verify": sum(forward_s),  # the target forward over the block
        "accept": sum(c.verify_s for c in cycles) - sum(forward_s),
        "rollback": sum(c.rollback_s for c in cycles),  # + draft context append
    }
    totals["host"] = max(sum(walls) - sum(totals.values()), 0.0)
    return {
        "cycles": n,
        "cycle_tokens": committed,
        "tokens_per_cycle": sum(committed) / n if n else 0.0,
        "acceptance_rate": 1 - n / sum(committed) if n else 0.0,
        "cycle_profile_s": totals,
        "cycle_profile_per_cycle_ms": {k: 1000 * v / n if n else 0.0 for k, v in totals.items()},
    }


# -- forward timings at a context length ----------------------------------------------------
def _snapshot(cache: list[Any]) -> list[Any]:
    return [c.offset if isinstance(c, KVCache) else list(c.cache) for c in cache]


def _restore(cache: list[Any], saved: list[Any]) -> None:
    for c, s in zip(cache, saved, strict=True):
        if isinstance(c, KVCache):
            c.trim(c.offset - s)
        else:
            c.cache = list(s)


def forward_timings(model: nn.Module, target: TargetAdapter, prompt: list[int], iters: int,
                    block: int = 16) -> dict:
    """Median wall time of a 1-token and a `block`-token forward after `prompt`:
    mlx-lm's own forward, and the adapter's verify forward (tape recorded)."""
    cache = make_prompt_cache(model)
    for start in range(0, len(prompt), PREFILL_CHUNK):
        model(mx.array([prompt[start:start + PREFILL_CHUNK]]), cache=cache)
        mx.eval([c.state for c in cache])
    saved = _snapshot(cache)
    one = mx.array([[prompt[-1]]])
    many = mx.array([prompt[-block:]])

    def plain(ids: mx.array) -> Callable[[], None]:
        return lambda: mx.eval(model(ids, cache=cache))

    def verify() -> None:
        target.begin_verify(cache)
        mx.eval(target.forward(many, cache, []))
        target.rollback(cache, block, block)  # keep all: drops the records only

    out = {}
    for label, fn in (("t_ar_s", plain(one)), ("t_forward16_s", plain(many)),
                      ("t_verify16_s", verify)):
        times = []
        for i in range(iters + 2):  # two warm-ups
            begin = time.perf_counter()
            fn()
            if i >= 2:
                times.append(time.perf_counter() - begin)
            _restore(cache, saved)
        out[label] = statistics.median(times)
    out["forward16_over_ar"] = out["t_forward16_s"] / out["t_ar_s"]
    out["verify16_over_ar"] = out["t_verify16_s"] / out["t_ar_s"]
    out["ctx"] = len(prompt)
    out["iters"] = iters
    return out


def rollback_timings(target: TargetAdapter, cache: list[Any], block: mx.array, keep: int,
                     iters: int) -> dict:
    """Median ms over `iters` (after two warm-ups) of a verify of `block` [1, T] after the
    cache's tokens (evaluated), then its rollback to `keep` tokens: the host's build alone and
    build plus evaluation. The KV caches go back to their length each time; the linear
    layers' states move on (same shapes, so the same work)."""
    verify, build, total = [], [], []
    T = block.shape[1]
    for i in range(iters + 2):
        target.begin_verify(cache)
        t0 = time.perf_counter()
        logits, _ = target.forward(block, cache, [])
        mx.eval(logits, cache_arrays(cache))
        t1 = time.perf_counter()
        target.rollback(cache, keep=keep, verified=T)
        t2 = time.perf_counter()
        mx.eval(cache_arrays(cache))
        t3 = time.perf_counter()
        for c in cache:
            if isinstance(c, KVCache):
                c.trim(keep)
        if i >= 2:
            verify.append(t1 - t0)
            build.append(t2 - t1)
            total.append(t3 - t1)
    return {"verify_ms": 1e3 * statistics.median(verify),
            "rollback_build_ms": 1e3 * statistics.median(build),
            "rollback_total_ms": 1e3 * statistics.median(total)}


# -- the benchmark --------------------------------------------------------------------------
def run_synthetic(name: str, layers: int | None = None, overrides: dict | None = None,
                  draft_overrides: dict | None = None, dtype: str | None = None,
                  ctx: int = 2048, max_tokens: int = 256, tokens_per_cycle: float = 9.6,
                  block_size: int = 16, iters: int = 10, seed: int = 0,
                  kernels: str | None = None, draft_cost: bool = True, warmup: bool = True,
                  config: DFlashConfig | None = None, repeat: int = 1) -> dict:
    from ..device import current
    from ..targets import adapter_for

    backend = current()
    dtype = dtype or ("float32" if backend == "cpu" else "bfloat16")
    built = time.perf_counter()
    model = build_target(name, layers, overrides, dtype, seed)
    target = adapter_for(model, enable_tape_replay=True, kernels=kernels)
    dargs = draft_args(name, target, draft_overrides)
    draft = build_draft(dargs, dtype, seed + 1)
    build_s = time.perf_counter() - built
    # The queueing knobs as DFlashRuntime plans them for this backend (whole blocks)
    plan = make_plan(replace(config or DFlashConfig(), min_draft_confidence=None), backend,
                     draft)
    prefetch = draft_cost and plan.prefetch
    target.launch_every = plan.stream_every

    rng = random.Random(seed)
    prompt = [rng.randrange(target.vocab_size) for _ in range(ctx)]
    if warmup:  # compile and allocate outside the timed runs
        target.warm_up()  # the replay kernel too: a high-acceptance warm-up never rolls back
        n = min(8, max_tokens)
        ref = run_baseline(model, prompt, n, PREFILL_CHUNK).tokens
        run_dflash(target, draft, prompt, ref, n, block_size, tokens_per_cycle, seed,
                   draft_cost, prefetch=prefetch)
        run_dflash(target, draft, prompt, ref, n, block_size, tokens_per_cycle, seed,
                   draft_cost, profile=True, prefetch=prefetch)
    base = run_baseline(model, prompt, max_tokens, PREFILL_CHUNK)

    def oracle_run(reference: Sequence[int], profile: bool = False) -> tuple[Side, dict]:
        return run_dflash(target, draft, prompt, reference, max_tokens, block_size,
                          tokens_per_cycle, seed, draft_cost, profile, prefetch)

    # The oracle proposes what the verify itself chooses (see oracle.py), in every dtype.
    reference, rounds = consistent_reference(lambda r: oracle_run(r)[0].tokens, base.tokens)
    flash, cycles = oracle_run(reference)  # timed: one host read per cycle
    pairs = [(base, flash)]
    for _ in range(repeat - 1):  # more pairs, side by side: the machine's rate moves
        pairs.append((run_baseline(model, prompt, max_tokens, PREFILL_CHUNK),
                      oracle_run(reference)[0]))
    _, profiled = oracle_run(reference, profile=True)  # device time per phase
    cycles.update({k: profiled[k] for k in ("cycle_profile_s", "cycle_profile_per_cycle_ms")})
    fwd = forward_timings(model, target, prompt, iters, block_size)
    found = divergence(model, prompt, base.tokens, flash.tokens, PREFILL_CHUNK)
    margins = greedy_margins(model, prompt, max_tokens, PREFILL_CHUNK)
    cfg = text_args(model)
    return {
        "synthetic": True,
        "title": f"SYNTHETIC benchmark (random weights, oracle draft): {name}",
        "model": name,
        "source_config": load_spec(name)["source"],
        "note": ("random weights at the model's shapes, peaked so the greedy continuation "
                 "is robust to rounding; acceptance is set by the oracle "
                 "(--tokens-per-cycle), so speed-ups show the machine's cost structure, "
                 "not a real draft's quality"),
        "weights": WEIGHTS,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **environment(),
        "backend": backend,
        "dtype": dtype,
        "kernels": getattr(getattr(target, "kernels", None), "name", "n/a"),
        "fused_rollback": getattr(getattr(target, "kernels", None), "rollback", None) is not None,
        "target_config": target_config(name, layers, overrides),
        "target_layers": target.num_layers,
        "hidden_size": int(cfg.hidden_size),
        "draft_config": dargs.to_config(),
        "settings": {"ctx": ctx, "max_tokens": max_tokens, "block_size": block_size,
                     "tokens_per_cycle_target": tokens_per_cycle, "greedy": True,
                     "prefill_step": PREFILL_CHUNK, "seed": seed, "iters": iters,
                     "draft_forward_timed": draft_cost, "warmup": warmup,
                     "prefetch_draft": prefetch, "stream_every": target.launch_every},
        "baseline_function": "mlx_lm.generate.generate_step",
        "build_s": build_s,
        "forward": fwd,
        "baseline": base.summary(),
        "dflash": {**flash.summary(), **cycles},
        **versus(base, flash),
        **repeated(pairs),
        "divergence": found,
        "near_tie": near_tie(found, dtype) if found else None,
        "oracle_reference_runs": rounds,
        "oracle_self_consistent": reference == flash.tokens,
        "greedy_margin_min": min(margins),
        "repeated_4gram_share": repeated_ngram_share(base.tokens),
        "definitions": {
            "t_ar_s": "median 1-token mlx-lm forward after ctx tokens",
            "t_forward16_s": "median 16-token mlx-lm forward after ctx tokens",
            "t_verify16_s": "median 16-token adapter verify forward (tape recorded)",
            "cycle_profile": "from a separate run with each phase evaluated on its own "
                             "(device times; the timed run reads the device once per cycle): "
                             "draft: proposer incl. the real draft forward; verify: target "
                             "forward; accept: argmax + accept count; rollback: cache "
                             "rollback + draft context append; host: the rest of the cycle",
            "divergence": "where DFlash's tokens first differ from the baseline's, with the "
                          "baseline's top-1 minus top-2 logit gap there (gap); near_tie: "
                          f"gap < {NEAR_TIE_GAP} with bf16/fp16 activations (allowed), else a "
                          "bug",
            "oracle_reference_runs": "speculative runs recorded until the oracle's reference "
                                     "was what the verify itself commits (oracle.py); 1 when "
                                     "no verify rounded a choice differently",
            "greedy_margin_min": "smallest top-1 minus top-2 logit over the baseline's "
                                 "tokens (plain decoding replayed, untimed)",
            "repeated_4gram_share": "share of the baseline's 4-grams that occurred earlier "
                                    "in it",
            "speedup": "end-to-end tok/s (prefill of ctx included), DFlash / baseline",
            "decode_speedup": "tok/s after the first token, DFlash / baseline",
            "repeats": "with --repeat N: every (baseline, DFlash) pair, run one after the "
                       "other; *_median: the medians over the pairs",
        },
    }


def repeated(pairs: list[tuple[Side, Side]]) -> dict:
    """With more than one (baseline, DFlash) pair: each pair's speed-ups and their medians
    (the report's `baseline`, `dflash` and speed-ups are the first pair's)."""
    if len(pairs) < 2:
        return {}
    rows = [{"baseline_decode_tok_s": b.decode_tokens_per_second,
             "dflash_decode_tok_s": f.decode_tokens_per_second, **versus(b, f)}
            for b, f in pairs]
    return {"repeats": rows,
            "speedup_median": statistics.median(r["speedup"] for r in rows),
            "decode_speedup_median": statistics.median(r["decode_speedup"] or 0 for r in rows),
            "token_match_all": all(r["token_match"] for r in rows)}


def summary_lines(r: dict) -> list[str]:
    f, b, d = r["forward"], r["baseline"], r["dflash"]
    prof = d["cycle_profile_per_cycle_ms"]
    return [
        r["title"] + f" [{r['backend']}, {r['dtype']}, kernels={r['kernels']}, "
        f"{r['target_layers']} layers]",
        f"  ctx {f['ctx']}: T_ar {f['t_ar_s'] * 1e3:.2f} ms, T_fwd16 "
        f"{f['t_forward16_s'] * 1e3:.2f} ms ({f['forward16_over_ar']:.2f}x), T_verify16 "
        f"{f['t_verify16_s'] * 1e3:.2f} ms ({f['verify16_over_ar']:.2f}x)",
        f"  baseline {b['tokens_per_second']:.1f} tok/s (decode "
        f"{b['decode_tokens_per_second']:.1f}); dflash {d['tokens_per_second']:.1f} tok/s "
        f"(decode {d['decode_tokens_per_second']:.1f}); speed-up {r['speedup']:.2f}x e2e, "
        f"{(r['decode_speedup'] or 0):.2f}x decode",
        *([f"  {len(r['repeats'])} pairs side by side: decode speed-up median "
           f"{r['decode_speedup_median']:.2f}x ("
           + ", ".join(f"{x['decode_speedup']:.2f}x" for x in r["repeats"])
           + f"), end to end {r['speedup_median']:.2f}x; every run token-identical: "
           f"{r['token_match_all']}"] if "repeats" in r else []),
        f"  tokens/cycle {d['tokens_per_cycle']:.2f} (target "
        f"{r['settings']['tokens_per_cycle_target']}), {d['cycles']} cycles; per cycle ms: "
        + ", ".join(f"{k} {v:.2f}" for k, v in prof.items()),
        f"  token_match {r['token_match']}"
        + ("" if r["token_match"] else f" (first mismatch at {r['first_mismatch']}, baseline "
           f"top-1 - top-2 gap {r['divergence']['gap']:.4f}: "
           f"{'near-tie' if r['near_tie'] else 'NOT a near-tie'})"),
        f"  oracle reference: {r['oracle_reference_runs']} recorded run(s), self-consistent "
        f"{r['oracle_self_consistent']}; greedy margin min {r['greedy_margin_min']:.2f}, "
        f"repeated 4-grams {r['repeated_4gram_share']:.1%}",
    ]


def parse_overrides(items: list[str]) -> dict:
    """["key=value", ...] -> {key: the JSON value, or the text where it is not JSON}."""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dflash benchmark --synthetic",
        description="SYNTHETIC benchmark: random-weight target at a real model's shapes, "
                    "oracle draft at a chosen tokens/cycle.")
    p.add_argument("--synthetic", required=True, choices=MODELS)
    p.add_argument("--layers", type=int, help="cut the target to N layers (quick runs)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--ctx", type=int, default=2048, help="prompt length (random ids)")
    p.add_argument("--tokens-per-cycle", type=float, default=9.6)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default: bfloat16 on a GPU, float32 on the CPU")
    p.add_argument("--iters", type=int, default=10, help="forward-timing iterations")
    p.add_argument("--repeat", type=int, default=1,
                   help="time N (baseline, DFlash) pairs side by side and report the medians "
                        "of their speed-ups too (the machine's rate moves between runs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kernels", choices=["auto", "portable", "native"],
                   help="GatedDeltaNet kernels (default: $DFLASH_KERNELS or auto)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="target config field (JSON value), e.g. hidden_size=64")
    p.add_argument("--draft-override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--no-draft-forward", action="store_true",
                   help="do not run the real draft forward (draft cost not counted)")
    p.add_argument("--no-warmup", action="store_true")
    add_queueing_args(p)  # as the engine queues work
    p.add_argument("--json", help="write the report here")
    return p


def synthetic_main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 2 <= args.block_size <= 16 or not 1 <= args.tokens_per_cycle <= args.block_size:
        raise SystemExit("--block-size must be 2..16 and --tokens-per-cycle 1..block size")
    if args.repeat < 1:
        raise SystemExit(f"--repeat {args.repeat}: give 1 or more pairs of runs")
    if args.ctx < args.block_size:
        raise SystemExit(f"--ctx must be at least --block-size ({args.block_size})")
    report = run_synthetic(
        args.synthetic, args.layers, parse_overrides(args.override),
        parse_overrides(args.draft_override),
        args.dtype, args.ctx, args.max_tokens, args.tokens_per_cycle, args.block_size,
        args.iters, args.seed, args.kernels, not args.no_draft_forward, not args.no_warmup,
        DFlashConfig(**queueing_from_args(args)), args.repeat)
    report = {"command": shlex.join(sys.argv), "argv": list(sys.argv[1:] if argv is None
                                                            else argv), **report}
    print("\n".join(summary_lines(report)))
    if args.json:
        Path(args.json).expanduser().parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).expanduser().write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    identical = report["token_match"] and report.get("token_match_all", True)
    return 0 if identical or report["near_tie"] else 1
