"""`dflash benchmark`: plain mlx-lm decoding vs DFlash on the same loaded target.

Both sides get the same chat-templated token ids and run in one process. Greedy (the
default): every DFlash output must equal the baseline's token for token in float32; with
bf16/fp16 activations a divergence must be a near-tie (the baseline's top-1 minus top-2
logit gap there below 0.25, reported per run); anything else is a correctness bug (exit 1).
`--ar-draft MODEL` adds mlx-lm's own speculative decoding with that autoregressive draft, at
each `--num-draft-tokens` K (default 2..6), on the same loaded target and prompt ids: what an
MLX user would run instead; the summary names its best K and DFlash's speed-up over it.
`--plain-engine` adds this engine with speculation off (`generate(speculative=False)`, what
`dflash generate --no-speculative` runs: the target alone through the runtime), so one run
gives the three rows of the README's results table: mlx-lm, speculation off, DFlash.
`--oracle-tokens-per-cycle K` replaces the draft's proposals by the target's own
continuation, wrong at a drawn place so that a cycle commits K tokens on average (oracle.py):
the cost of the cycle, independent of the draft's quality. With --temperature > 0 both
sides sample (mlx-lm's make_sampler, DFlash's speculative sampling, same settings and
seed): outputs differ by design, so the
report has speed and acceptance, and token_match is null (tests/test_sampling.py checks
that the distribution is the target's).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..config import add_engine_args, add_sampling_args, config_from_args, sampling_from_args
from ..errors import DFlashError
from .ar_draft import DEFAULT_KS, ArDraft, load_ar_draft, parse_ks
from .environment import environment, load_average
from .metrics import (
    DEFINITIONS,
    lookup_cycle_share,
    loop_start,
    nonloop_tokens_per_cycle,
    repeated_ngram_share,
)
from .oracle import Oracle, OracleProposer, consistent_reference
from .suites import (
    EVAL_DATA_ENV,
    PICKS,
    PROMPT_FORMATS,
    BenchError,
    BenchPrompt,
    encode,
    load_prompts,
)
from .timing import (
    NEAR_TIE_GAP,
    Side,
    baseline_function,
    divergence,
    first_mismatch,
    near_tie,
    run_baseline,
)

# The warm-up reply runs as long as a timed one (up to this): on a fresh GPU machine a reply's
# later cycles (lookup choices, longer histories) still compiled kernels after a short one.
WARMUP_TOKENS = 256


@dataclass
class Options:
    """How each side generates: the same for every prompt and repeat."""

    max_tokens: int = 256
    no_eos: bool = False
    profile: bool = False  # DFlash: device time per cycle phase
    sampling: dict[str, Any] = field(default_factory=dict)  # generate() keywords; {}: greedy
    oracle: float | None = None  # an oracle proposer at this mean tokens/cycle; None: draft
    oracle_seed: int = 0
    ar_draft: Any = None  # an autoregressive draft model for mlx-lm's speculative row
    ar_ks: tuple[int, ...] = ()  # its num_draft_tokens values, one row each
    plain_engine: bool = False  # also time the runtime with speculation off

    def __post_init__(self) -> None:
        # Sampled, the sides' replies differ, and their lengths would too (a reply cut short by
        # its EOS is mostly prefill): each side generates max_tokens tokens
        self.no_eos = self.no_eos or not self.greedy

    @property
    def greedy(self) -> bool:
        return not self.sampling.get("temperature")


# -- timed generations --------------------------------------------------------------------
def baseline(rt: Any, ids: list[int], opts: Options, k: int | None = None) -> Side:
    """The mlx-lm side on the runtime's own model (stream_generate, or generate_step with
    --no-eos: stream_generate always stops at EOS), sampling like DFlash when asked; with
    `k`, mlx-lm's speculative decoding with opts.ar_draft proposing k tokens a step."""
    sampler = None
    if not opts.greedy:
        import mlx.core as mx
        from mlx_lm.sample_utils import make_sampler

        s = opts.sampling
        sampler = make_sampler(s["temperature"], top_p=s["top_p"] if s["top_p"] < 1 else 0.0,
                               min_p=s["min_p"], top_k=s["top_k"])
        mx.random.seed(s["seed"] or 0)  # mlx-lm draws from MLX's global generator
    spec = {} if k is None else {"draft_model": opts.ar_draft, "num_draft_tokens": k}
    return run_baseline(rt.model, ids, opts.max_tokens, rt.prefill_chunk,
                        None if opts.no_eos else rt.tokenizer, sampler, **spec)


@contextmanager
def oracle_proposals(rt: Any, reference: list[int] | None, opts: Options) -> Iterator[None]:
    """With opts.oracle and a reference: the runtime's proposer is the oracle on it (its
    draft forward still runs, on the runtime's head, and its context follows every commit)."""
    if opts.oracle is None or reference is None:
        yield
        return

    def make(head: Any, cache: list[Any], context: list[int]) -> OracleProposer:
        oracle = Oracle(reference, opts.oracle, rt.plan.block_size, rt.target.vocab_size,
                        opts.oracle_seed)
        return OracleProposer(rt.target, rt.draft, oracle, True, head, cache, rt.plan.prefetch)

    rt.make_proposer = make
    step_s, rt.step_s = rt.step_s, None  # no pausing: the oracle measures the cycle's cost
    try:
        yield
    finally:
        del rt.make_proposer
        rt.step_s = step_s


def run_dflash(rt: Any, ids: list[int], opts: Options, reference: list[int] | None = None,
               speculative: bool = True) -> tuple[Side, Any]:
    with oracle_proposals(rt, reference, opts):
        result = rt.generate(ids, max_tokens=opts.max_tokens, no_eos=opts.no_eos,
                             speculative=speculative, profile=opts.profile and speculative,
                             **opts.sampling)
    side = Side(result.tokens, result.elapsed_s, result.prefill_s, result.peak_memory_bytes,
                result.finish_reason)
    return side, result


# -- one prompt ---------------------------------------------------------------------------
def median_side(sides: list[Side]) -> dict:
    """Medians over repeats (tokens are the same every repeat: greedy, or one seed)."""
    med = statistics.median
    return {
        "generated_tokens": len(sides[0].tokens),
        "tokens_per_second": med(s.tokens_per_second for s in sides),
        "decode_tokens_per_second": med(s.decode_tokens_per_second for s in sides),
        "elapsed_s": med(s.elapsed_s for s in sides),
        "prefill_s": med(s.prefill_s for s in sides),
        "peak_memory_bytes": max(s.peak_memory_bytes for s in sides),
        "finish_reason": sides[0].finish_reason,
    }


def cycle_json(results: list[Any]) -> dict:
    first = results[0]
    profile = {k: statistics.median(r.cycle_profile.get(k, 0.0) for r in results)
               for k in first.cycle_profile}
    start = loop_start(first.tokens)
    return {
        "speculative": first.speculative,
        "fallback_reason": first.fallback_reason,
        "block_size": first.block_size,
        "cycles": first.cycles,
        "lookup_cycles": first.lookup_cycles,
        "pauses": first.pauses,  # speculation paused (engine/pause.py), and for how long
        "paused_tokens": first.paused_tokens,
        "pause_reason": first.pause_reason,
        "acceptance_rate": first.acceptance_rate,
        "tokens_per_cycle": first.tokens_per_cycle,
        "tokens_per_cycle_nonloop": nonloop_tokens_per_cycle(first.cycle_tokens, start),
        "loop_start": start,
        "cycle_tokens": first.cycle_tokens,
        "cycle_profile": profile,
        "cycle_profile_per_cycle": {k: v / first.cycles if first.cycles else 0.0
                                    for k, v in profile.items()},
    }


def bench_prompt(rt: Any, prompt: BenchPrompt, opts: Options, repeat: int,
                 pause: Callable[[], None]) -> dict:
    ids = encode(rt, prompt)
    bases: list[Side] = []
    flashes: list[Side] = []
    ar: dict[int, list[Side]] = {k: [] for k in opts.ar_ks}
    plains: list[Side] = []
    results = []
    reference, rounds = None, None
    for _ in range(repeat):
        pause()
        bases.append(baseline(rt, ids, opts))
        if opts.oracle is not None and reference is None:
            # Untimed: the oracle's reference is what the verify itself commits (oracle.py).
            reference, rounds = consistent_reference(
                lambda ref: run_dflash(rt, ids, opts, ref)[0].tokens, bases[0].tokens)
        pause()
        side, result = run_dflash(rt, ids, opts, reference)
        flashes.append(side)
        results.append(result)
        for k, sides in ar.items():
            pause()
            sides.append(baseline(rt, ids, opts, k))
        if opts.plain_engine:
            pause()
            plains.append(run_dflash(rt, ids, opts, speculative=False)[0])
    mismatches = [first_mismatch(b.tokens, f.tokens) for b, f in zip(bases, flashes)]
    base, flash = median_side(bases), median_side(flashes)
    flash.update(cycle_json(results))
    bad = next((m for m in mismatches if m is not None), None)  # first index that differs
    found = None
    if opts.greedy and bad is not None:
        i = next(i for i, m in enumerate(mismatches) if m is not None)
        found = divergence(rt.model, ids, bases[i].tokens, flashes[i].tokens,
                           rt.prefill_chunk)
    return {
        "prompt_id": prompt.id,
        "prompt_preview": prompt.text[:80],
        "prompt_tokens": len(ids),
        "baseline": base,
        "dflash": flash,
        "speedup": (flash["tokens_per_second"] / base["tokens_per_second"]
                    if base["tokens_per_second"] > 0 else None),
        "cycle_cost_steps": cycle_cost_steps(base, flash),
        "token_match": all(m is None for m in mismatches) if opts.greedy else None,
        "first_mismatch": bad if opts.greedy else None,
        "divergence": found,
        "near_tie": near_tie(found, rt.describe()["dtype"]) if found else None,
        "oracle_reference_runs": rounds,
        "repeat4_share": repeated_ngram_share(flashes[0].tokens),
        "repeats": [{"baseline_tokens_per_second": b.tokens_per_second,
                     "dflash_tokens_per_second": f.tokens_per_second}
                    for b, f in zip(bases, flashes)],
        **({"ar_draft": {str(k): ar_row(rt, ids, bases, sides, opts) for k, sides in ar.items()}}
           if ar else {}),
        **({"plain_engine": plain_row(bases, plains, opts)} if plains else {}),
    }


def plain_row(bases: list[Side], sides: list[Side], opts: Options) -> dict:
    """The engine with speculation off on a prompt: timings, speed-up over mlx-lm and
    (greedy) whether its tokens are mlx-lm's."""
    row = median_side(sides)
    base = statistics.median(b.tokens_per_second for b in bases)
    row["speedup"] = row["tokens_per_second"] / base if base else None
    row["token_match"] = (all(first_mismatch(b.tokens, s.tokens) is None
                              for b, s in zip(bases, sides)) if opts.greedy else None)
    return row


def ar_row(rt: Any, ids: list[int], bases: list[Side], sides: list[Side],
           opts: Options) -> dict:
    """mlx-lm's speculative decoding at one K on a prompt: timings against plain mlx-lm, the
    share of tokens its draft proposed, and (greedy) where its tokens leave plain greedy's."""
    row = median_side(sides)
    row["speedup"] = (row["tokens_per_second"] / statistics.median(
        b.tokens_per_second for b in bases)) if bases[0].tokens_per_second else None
    row["from_draft_share"] = sides[0].from_draft / max(len(sides[0].tokens), 1)
    mismatch = first_mismatch(bases[0].tokens, sides[0].tokens) if opts.greedy else None
    row["token_match"] = None if not opts.greedy else mismatch is None
    row["divergence"] = (divergence(rt.model, ids, bases[0].tokens, sides[0].tokens,
                                    rt.prefill_chunk) if mismatch is not None else None)
    return row


def cycle_cost_steps(base: dict, flash: dict) -> float | None:
    """A cycle's decode time in plain decoding steps: tokens/cycle x the baseline's decode
    rate / DFlash's. The speed-up is tokens/cycle over it, so it is the cost side of the
    ratio, whatever the draft proposes (issue 13: about one step is the goal)."""
    tpc, b, f = (flash.get("tokens_per_cycle"), base.get("decode_tokens_per_second"),
                 flash.get("decode_tokens_per_second"))
    return tpc * b / f if tpc and b and f else None


# -- the whole benchmark ------------------------------------------------------------------
def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def summarize_ar(runs: list[dict]) -> dict:
    """The speculative rows over the suite: each K's median speed-up over plain mlx-lm, the
    best K (highest median tok/s) and DFlash's median speed-up over mlx-lm at that K."""
    ks = list(runs[0]["ar_draft"])
    tps = {k: _median([r["ar_draft"][k]["tokens_per_second"] for r in runs]) for k in ks}
    best = max(ks, key=lambda k: tps[k] or 0.0)
    return {
        "ar_draft_tokens_per_second_median_by_k": tps,
        "ar_draft_speedup_median_by_k": {k: _median([r["ar_draft"][k]["speedup"] for r in runs])
                                         for k in ks},
        "ar_draft_from_draft_share_mean_by_k": {
            k: _mean([r["ar_draft"][k]["from_draft_share"] for r in runs]) for k in ks},
        "ar_draft_token_match_by_k": {
            k: (None if any(r["ar_draft"][k]["token_match"] is None for r in runs)
                else all(r["ar_draft"][k]["token_match"] for r in runs)) for k in ks},
        "ar_draft_best_k": int(best),
        "speedup_over_ar_draft_median": _median([
            r["dflash"]["tokens_per_second"] / r["ar_draft"][best]["tokens_per_second"]
            for r in runs if r["ar_draft"][best]["tokens_per_second"]]),
    }


def summarize_plain(runs: list[dict]) -> dict:
    """The speculation-off side over the suite: its median tok/s and speed-up over mlx-lm,
    DFlash's median speed-up over it, and whether every greedy reply was mlx-lm's."""
    rows = [r["plain_engine"] for r in runs]
    return {
        "plain_engine_tokens_per_second_median": _median([p["tokens_per_second"] for p in rows]),
        "plain_engine_speedup_median": _median([p["speedup"] for p in rows]),
        "speedup_over_plain_engine_median": _median([
            r["dflash"]["tokens_per_second"] / p["tokens_per_second"]
            for r, p in zip(runs, rows) if p["tokens_per_second"]]),
        "plain_engine_token_match": (None if any(p["token_match"] is None for p in rows)
                                     else all(p["token_match"] for p in rows)),
    }


def summarize(runs: list[dict]) -> dict:
    flash = [r["dflash"] for r in runs]
    base = [r["baseline"] for r in runs]
    diverged = [r for r in runs if r.get("divergence")]
    gaps = [r["divergence"]["gap"] for r in diverged if r["divergence"]["gap"] is not None]
    return {
        "runs": len(runs),
        "token_match": (None if any(r["token_match"] is None for r in runs)
                        else all(r["token_match"] for r in runs)),
        "speedup_median": _median([r["speedup"] for r in runs]),
        "speedup_mean": _mean([r["speedup"] for r in runs]),
        "speedup_basis": "end-to-end tok/s (prefill included), DFlash / baseline",
        "baseline_tokens_per_second_median": _median([b["tokens_per_second"] for b in base]),
        "dflash_tokens_per_second_median": _median([f["tokens_per_second"] for f in flash]),
        "baseline_decode_tokens_per_second_median":
            _median([b["decode_tokens_per_second"] for b in base]),
        "dflash_decode_tokens_per_second_median":
            _median([f["decode_tokens_per_second"] for f in flash]),
        "acceptance_rate_mean": _mean([f["acceptance_rate"] for f in flash]),
        "tokens_per_cycle_mean": _mean([f["tokens_per_cycle"] for f in flash]),
        "cycle_cost_steps_median": _median([r.get("cycle_cost_steps") for r in runs]),
        "tokens_per_cycle_nonloop_mean": _mean([f["tokens_per_cycle_nonloop"] for f in flash]),
        "repeat4_share_mean": _mean([r["repeat4_share"] for r in runs]),
        "lookup_cycle_share": lookup_cycle_share(flash),
        "looping_runs": sum(f["loop_start"] is not None for f in flash),
        "peak_memory_bytes_max": max((f["peak_memory_bytes"] for f in flash), default=0),
        "divergences": len(diverged),
        "near_tie_gap_max": max(gaps) if gaps else None,
        "divergences_all_near_ties": all(r["near_tie"] for r in diverged) if diverged else None,
        **(summarize_ar(runs) if runs and "ar_draft" in runs[0] else {}),
        **(summarize_plain(runs) if runs and "plain_engine" in runs[0] else {}),
    }


def warm_up(rt: Any, prompt: BenchPrompt | str, opts: Options) -> None:
    """One untimed generation per side so compilation and allocation are not timed."""
    ids = encode(rt, prompt)
    untimed = Options(min(WARMUP_TOKENS, opts.max_tokens), opts.no_eos, opts.profile,
                      opts.sampling, ar_draft=opts.ar_draft)
    baseline(rt, ids, untimed)
    run_dflash(rt, ids, untimed)
    for k in opts.ar_ks:
        baseline(rt, ids, untimed, k)
    if opts.plain_engine:
        run_dflash(rt, ids, untimed, speculative=False)


def run_benchmark(rt: Any, prompts: Sequence[BenchPrompt | str], max_tokens: int = 256,
                  repeat: int = 1, cooldown: float = 0.0, no_eos: bool = False,
                  warmup: bool = True, prompt_format: str = PROMPT_FORMATS["text"],
                  progress: Callable[[int, int, BenchPrompt], None] | None = None,
                  profile: bool = False, sampling: dict[str, Any] | None = None,
                  oracle: float | None = None, oracle_seed: int = 0,
                  ar_draft: ArDraft | None = None, plain_engine: bool = False) -> dict:
    """Benchmark `prompts` (BenchPrompt or plain user messages) on a loaded DFlashRuntime.
    `sampling`: generate() keywords (temperature, top_p, top_k, min_p, seed); None: greedy.
    `oracle`: propose the target's own continuation at this mean tokens/cycle (greedy only).
    `ar_draft`: also time mlx-lm's speculative decoding with it at each of its Ks.
    `plain_engine`: also time the runtime with speculation off (the target alone).
    Returns the report dict that --json writes (without the command line)."""
    opts = Options(max_tokens, no_eos, profile, dict(sampling or {}), oracle, oracle_seed,
                   ar_draft.model if ar_draft else None, ar_draft.ks if ar_draft else (),
                   plain_engine)
    if oracle is not None and not opts.greedy:
        raise BenchError("--oracle-tokens-per-cycle needs greedy decoding: drop --temperature.")
    items = [p if isinstance(p, BenchPrompt) else BenchPrompt(str(i), p)
             for i, p in enumerate(prompts)]
    timed = [0]

    def pause() -> None:  # --cooldown between timed generations, not before the first
        if timed[0] and cooldown > 0:
            time.sleep(cooldown)
        timed[0] += 1

    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = load_average()
    if warmup and items:
        warm_up(rt, items[0], opts)
    runs = []
    for i, prompt in enumerate(items):
        if progress is not None:
            progress(i, len(items), prompt)
        runs.append(bench_prompt(rt, prompt, opts, repeat, pause))
    desc = rt.describe()
    return {
        "timestamp": started,
        "load_average_before": load_before,
        **environment(),
        "backend": desc["backend"],
        "dtype": desc["dtype"],
        "model": desc,
        "settings": {"max_tokens": max_tokens, "repeat": repeat, "cooldown_s": cooldown,
                     "no_eos": opts.no_eos, "warmup": warmup, "greedy": opts.greedy,
                     "sampling": None if opts.greedy else opts.sampling,
                     "prefill_step": rt.prefill_chunk,
                     "block_size": rt.plan.block_size, "max_ctx": rt.config.max_ctx,
                     "sync_phases": profile,
                     "min_draft_confidence": None if oracle else rt.plan.min_confidence,
                     "verify_lengths": None if oracle else desc["verify_lengths"],
                     "draft_vocab": rt.plan.draft_vocab,
                     "lookup_min_match": None if oracle else rt.config.lookup_min_match,
                     "oracle_tokens_per_cycle": oracle, "oracle_seed": oracle_seed if oracle
                     else None, "plain_engine": plain_engine},
        "baseline_function": baseline_function(opts.no_eos)
        + ("" if opts.greedy else " + mlx_lm.sample_utils.make_sampler"),
        "ar_draft": ar_draft.describe() if ar_draft else None,
        "prompt_format": prompt_format,
        "definitions": definitions(),
        "runs": runs,
        "summary": summarize(runs),
    }


def definitions() -> dict:
    return {
        "tokens_per_second": "generated tokens / wall time of the call, prefill included",
        "decode_tokens_per_second": "(generated tokens - 1) / wall time after the first token",
        "speedup": "DFlash tokens_per_second / baseline tokens_per_second (end-to-end)",
        "cycle_cost_steps": "a cycle's decode time in plain decoding steps: tokens_per_cycle x "
                            "baseline decode_tokens_per_second / DFlash's (the decode "
                            "speed-up is tokens_per_cycle over it)",
        "acceptance_rate": "1 - cycles / generated tokens (dflash-mlx's definition)",
        "tokens_per_cycle": "tokens committed by the cycles / cycles (prefill token excluded)",
        "lookup_cycles": "cycles whose proposal was the suffix lookup's (a repeat of earlier "
                         "tokens, settings.lookup_min_match or more long), not a draft "
                         "forward; summary.lookup_cycle_share: their share of all cycles",
        "token_match": "DFlash tokens == baseline tokens (up to EOS, or all max_tokens with "
                       "no_eos), on every repeat; null when sampling (settings.sampling): "
                       "sampled outputs differ by design",
        "cycle_profile": "seconds summed over cycles by phase (median over repeats); "
                         "cycle_profile_per_cycle divides by cycles. With settings.sync_phases "
                         "(--profile) each phase is evaluated on its own (device time); "
                         "without, phases overlap and these are host-side times",
        "repeats": "timings are medians over --repeat runs of each prompt",
        "divergence": "greedy runs whose tokens differ from the baseline: the first index "
                      "(first_mismatch), both tokens, the baseline's top-1 minus top-2 logit "
                      "gap there (gap; dflash_gap: top-1 minus DFlash's token), replayed "
                      "untimed; near_tie: gap < "
                      f"{NEAR_TIE_GAP} with bf16/fp16 activations (allowed by the numerics "
                      "policy); a float32 divergence or a larger gap is a bug",
        "oracle_tokens_per_cycle": "settings: the draft's proposals replaced by the target's "
                                   "own continuation, wrong at a drawn place so a cycle "
                                   "commits this many tokens on average (whole blocks; the "
                                   "real draft forward still runs); oracle_reference_runs: "
                                   "untimed oracle runs until its reference was what the "
                                   "verify commits",
        "verify_lengths": "settings.verify_lengths[n]: the tokens verified when the verify cut "
                          "keeps n (the cheapest forward length at or above n, measured on "
                          "this machine: engine/verify_lengths.py); null: exactly n",
        "ar_draft": "mlx-lm's own speculative decoding with the autoregressive draft named in "
                    "the report's ar_draft, per K (num_draft_tokens): its timings, speedup over "
                    "the plain baseline, from_draft_share (tokens its draft proposed and the "
                    "target kept / generated tokens) and token_match with plain greedy; "
                    "summary.ar_draft_best_k: the K with the highest median tok/s, "
                    "speedup_over_ar_draft_median: median of DFlash tok/s / that K's",
        "plain_engine": "this engine with speculation off (settings.plain_engine, "
                        "--plain-engine): generate(speculative=False), the target alone "
                        "through the runtime, timed in the same run; its speedup is over the "
                        "mlx-lm baseline, summary.speedup_over_plain_engine_median: median of "
                        "DFlash tok/s / its",
        "draft_vocab": "settings.draft_vocab: the draft proposes from the top N tokens of its "
                       "token_ranking.json plus each prompt's own tokens (--draft-vocab); null: "
                       "from the full vocabulary",
        **DEFINITIONS,
    }


# -- terminal + CLI -----------------------------------------------------------------------
def _match(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "[red]NO[/red]"


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_report(report: dict, console: Any = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    model = report["model"]
    oracle = report["settings"].get("oracle_tokens_per_cycle")
    proposer = (f"ORACLE at {oracle} tokens/cycle (cost only)" if oracle
                else Path(model["draft"]).name)
    table = Table(title=f"DFlash benchmark: {Path(model['target']).name} + {proposer} "
                  f"({report['backend']}, {report['dtype']}, baseline "
                  f"{report['baseline_function']})", box=box.SIMPLE_HEAD)
    for col in ("prompt", "toks", "base t/s", "dfl t/s", "speedup", "accept", "tok/cyc",
                "nonloop", "rep4", "pf ms", "peak MB", "match"):
        table.add_column(col, justify="left" if col == "prompt" else "right", no_wrap=True)
    for r in report["runs"]:
        b, f = r["baseline"], r["dflash"]
        table.add_row(
            r["prompt_id"][:18], str(f["generated_tokens"]), _fmt(b["tokens_per_second"]),
            _fmt(f["tokens_per_second"]), _fmt(r["speedup"], ".2f") + "x",
            _fmt(f["acceptance_rate"], ".2f"), _fmt(f["tokens_per_cycle"], ".2f"),
            _fmt(f["tokens_per_cycle_nonloop"], ".2f"), _fmt(r["repeat4_share"], ".2f"),
            _fmt(f["prefill_s"] * 1000), _fmt(f["peak_memory_bytes"] / 2**20),
            _match(r["token_match"]),
        )
    s = report["summary"]
    table.add_section()
    table.add_row(
        f"median/mean ({s['runs']})", "", _fmt(s["baseline_tokens_per_second_median"]),
        _fmt(s["dflash_tokens_per_second_median"]), _fmt(s["speedup_median"], ".2f") + "x",
        _fmt(s["acceptance_rate_mean"], ".2f"), _fmt(s["tokens_per_cycle_mean"], ".2f"),
        _fmt(s["tokens_per_cycle_nonloop_mean"], ".2f"), _fmt(s["repeat4_share_mean"], ".2f"),
        "", _fmt(s["peak_memory_bytes_max"] / 2**20),
        _match(s["token_match"]), style="bold",
    )
    console.print(table)
    console.print("tok/s: medians, prefill included; speed-up: median of end-to-end ratios; "
                  "non-loop: tok/cycle before the first looping 64-token window.")
    if s.get("cycle_cost_steps_median"):
        console.print(f"a cycle cost {s['cycle_cost_steps_median']:.2f} plain decoding steps "
                      "(median): the decode speed-up is tokens/cycle over that.")
    if report.get("ar_draft"):
        a = report["ar_draft"]
        by_k = ", ".join(f"K={k} {v:.2f}x" for k, v in s["ar_draft_speedup_median_by_k"].items())
        console.print(f"mlx-lm speculative with {Path(a['model']).name} over plain mlx-lm "
                      f"(median): {by_k}; best K={s['ar_draft_best_k']}. DFlash over it: "
                      f"{_fmt(s['speedup_over_ar_draft_median'], '.2f')}x (median).")
    if s.get("plain_engine_tokens_per_second_median"):
        console.print(f"speculation off (this engine, the target alone): "
                      f"{s['plain_engine_tokens_per_second_median']:.1f} tok/s, "
                      f"{_fmt(s['plain_engine_speedup_median'], '.2f')}x mlx-lm; DFlash over it: "
                      f"{_fmt(s['speedup_over_plain_engine_median'], '.2f')}x (medians).")
    if s.get("lookup_cycle_share"):
        console.print(f"suffix lookup proposed {s['lookup_cycle_share']:.0%} of the cycles "
                      "(a repeat of earlier tokens), the draft the rest.")
    for line in divergence_lines(report):
        console.print(line, highlight=False)


def divergence_lines(report: dict) -> list[str]:
    """One line per run whose tokens differ from the baseline's, then the largest gap."""
    lines = []
    for r in report["runs"]:
        d = r.get("divergence")
        if not d:
            continue
        gap = "unknown" if d["gap"] is None else f"{d['gap']:.4f}"
        verdict = ("a near-tie" if r["near_tie"] else
                   f"NOT a near-tie (< {NEAR_TIE_GAP} with bf16/fp16 activations): a bug")
        lines.append(f"{r['prompt_id']}: first divergence at token {d['index']} (baseline "
                     f"{d['baseline_token']}, DFlash {d['dflash_token']}); baseline top-1 - "
                     f"top-2 logit gap {gap}: {verdict}")
    s = report["summary"]
    if s.get("divergences"):
        top = s["near_tie_gap_max"]
        lines.append(f"{s['divergences']} run(s) diverged; largest gap "
                     f"{'unknown' if top is None else format(top, '.4f')}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dflash benchmark",
        description="Greedy mlx-lm baseline vs DFlash on the same loaded target.")
    p.add_argument("--model", help="target id or folder (default: the offline default pair)")
    p.add_argument("--draft", help="draft id or folder (default: the registered draft)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one user message")
    src.add_argument("--prompt-file", help='JSONL with "prompt" or "turns" per record')
    src.add_argument("--suite", help="mt-bench | humaneval | gsm8k")
    p.add_argument("--data-dir", help=f"folder with the suite files (default: ${EVAL_DATA_ENV} "
                   "or the suites packaged with dflash)")
    p.add_argument("--limit", type=int, help="N prompts only (see --pick)")
    p.add_argument("--pick", choices=PICKS, default="spread",
                   help="which N prompts --limit takes: spread over the suite's categories "
                        "(MT-Bench's eight; default) or the file's first N")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeat", type=int, default=1, help="runs per prompt (median reported)")
    p.add_argument("--cooldown", type=float, default=0.0, help="seconds between runs")
    p.add_argument("--no-eos", action="store_true", help="always generate --max-tokens")
    add_engine_args(p)
    add_sampling_args(p)
    p.add_argument("--oracle-tokens-per-cycle", type=float, metavar="K",
                   help="cost benchmark: propose the target's own continuation (from the "
                        "baseline run), wrong at a drawn place so a cycle commits K tokens on "
                        "average (1..block size); the draft forward still runs")
    p.add_argument("--oracle-seed", type=int, default=0, help="the oracle's draws")
    p.add_argument("--ar-draft", metavar="MODEL",
                   help="also time mlx-lm's own speculative decoding with this autoregressive "
                        "draft (same tokenizer as the target; a folder, hub id, .gguf or an "
                        "offline model such as qwen2.5-coder-0.5b)")
    p.add_argument("--num-draft-tokens", metavar="K", default=None,
                   help="--ar-draft's tokens per step: one K, a list (2,4) or a range "
                        f"(default {DEFAULT_KS[0]}-{DEFAULT_KS[-1]}: each reported, and the best)")
    p.add_argument("--plain-engine", action="store_true",
                   help="also time this engine with speculation off (the target alone, as "
                        "`dflash generate --no-speculative` runs it): a third side in the "
                        "same run")
    p.add_argument("--profile", action="store_true",
                   help="evaluate each cycle phase separately: exact per-phase device times "
                        "(adds a few syncs per cycle)")
    p.add_argument("--no-warmup", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", metavar="PATH", help="write the full report here")
    return p


def check_args(args: argparse.Namespace) -> None:
    for name, low in (("max_tokens", 1), ("repeat", 1), ("limit", 1), ("max_ctx", 16)):
        value = getattr(args, name)
        if value is not None and value < low:
            raise BenchError(f"--{name.replace('_', '-')}={value}: use at least {low}.")
    if args.cooldown < 0:
        raise BenchError(f"--cooldown={args.cooldown}: use 0 or more seconds.")
    k = args.oracle_tokens_per_cycle
    if k is not None and not 1 <= k <= (args.block_size or 16):
        raise BenchError(f"--oracle-tokens-per-cycle={k}: use 1..the block size "
                         f"({args.block_size or 16}).")
    if k is not None and args.temperature:
        raise BenchError("--oracle-tokens-per-cycle needs greedy decoding: drop --temperature.")
    if args.num_draft_tokens is not None and not args.ar_draft:
        raise BenchError("--num-draft-tokens sets --ar-draft's K: give --ar-draft MODEL too.")
    if args.num_draft_tokens is not None:
        parse_ks(args.num_draft_tokens)
    from ..sampling import SamplingParams

    SamplingParams(**sampling_from_args(args))  # a bad sampling flag: ConfigError


def benchmark_main(argv: list[str] | None = None) -> int:
    """0 ok, 1 DFlash output differs from the baseline (a bug), 2 bad arguments / inputs."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage and the error
        return int(exc.code or 0)
    from rich.console import Console
    from rich.markup import escape

    console = Console(width=None if sys.stdout.isatty() else 140)  # logs: no squeezed table
    err = Console(stderr=True)
    try:
        check_args(args)
        prompts, fmt = load_prompts(args.prompt, args.prompt_file, args.suite, args.data_dir,
                                    args.limit, args.pick)
        from ..console import load_progress
        from ..runtime import DFlashRuntime

        try:
            # Every run prefills in full: conversation-state reuse would time cached prompts.
            config = config_from_args(args, prompt_cache_bytes=0)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc
        with load_progress(err, "loading models") as progress:
            rt = DFlashRuntime.from_pretrained(args.model, args.draft, config, progress)
            ar = (load_ar_draft(args.ar_draft, rt, parse_ks(args.num_draft_tokens)
                                if args.num_draft_tokens else DEFAULT_KS)
                  if args.ar_draft else None)

        def progress(i: int, n: int, prompt: BenchPrompt) -> None:
            err.print(f"[dim]prompt {i + 1}/{n}: {prompt.id}[/dim]")

        report = run_benchmark(rt, prompts, args.max_tokens, args.repeat, args.cooldown,
                               args.no_eos, not args.no_warmup, fmt, progress, args.profile,
                               sampling_from_args(args), args.oracle_tokens_per_cycle,
                               args.oracle_seed, ar, args.plain_engine)
    except DFlashError as exc:
        err.print("[red]error:[/red]", escape(str(exc)), highlight=False)
        return 2
    report = {"command": shlex.join(sys.argv), "argv": list(sys.argv[1:] if argv is None
                                                            else argv),
              "prompt_pick": args.pick if args.limit else "all", **report}
    print_report(report, console)
    if args.json:
        path = Path(args.json).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {path}")
    bad = [r["prompt_id"] for r in report["runs"]
           if (r["token_match"] is False and not r.get("near_tie"))
           or r.get("plain_engine", {}).get("token_match") is False]
    if bad:
        err.print(f"[red]error:[/red] DFlash output differs from the baseline on {bad}, not "
                  "at a near-tie: lossless decoding is broken (a correctness bug).")
        return 1
    return 0
