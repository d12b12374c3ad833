"""`dflash benchmark`: plain mlx-lm greedy decoding vs DFlash on the same loaded target.

Both sides get the same chat-templated token ids, run in one process, greedy. Every DFlash
output must equal the baseline's token for token; a mismatch is a correctness bug (exit 1).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .config import add_engine_args, config_from_args
from .errors import DFlashError
from .metrics import DEFINITIONS, loop_start, nonloop_tokens_per_cycle, repeated_ngram_share

SUITES = {"mt-bench": "mt_bench.jsonl", "humaneval": "humaneval.jsonl.gz",
          "gsm8k": "gsm8k_100.jsonl"}
HUMANEVAL_ASK = "Complete the following Python function.\n\n```python\n{prompt}```"
PROMPT_FORMATS = {
    "mt-bench": "turn 1 (turns[0]) as one user chat message, chat template applied",
    "humaneval": ("one user chat message: " + repr(HUMANEVAL_ASK.split("{")[0])
                  + " + the code prompt in a ```python fence, chat template applied"),
    "gsm8k": "the question (`prompt`) as one user chat message, chat template applied",
    "file": "per record turns[0] if present, else `prompt`, as one user chat message, "
            "chat template applied",
    "text": "the --prompt text as one user chat message, chat template applied",
}
EVAL_DATA_ENV = "DFLASH_EVAL_DATA"
REPO_ROOT = Path(__file__).resolve().parents[1]
WARMUP_TOKENS = 8


class BenchError(DFlashError):
    """A benchmark input the user must fix (missing file, bad record, bad option)."""


@dataclass
class BenchPrompt:
    id: str
    text: str  # the user message


@dataclass
class Side:
    """One timed generation: what it produced and how long it took."""

    tokens: list[int]
    elapsed_s: float  # prefill included
    prefill_s: float  # until the first token
    peak_memory_bytes: int
    finish_reason: str

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # Same definition as GenerationResult: tokens after the first over time after it.
        decode_s = self.elapsed_s - self.prefill_s
        return (len(self.tokens) - 1) / decode_s if decode_s > 0 else 0.0


# -- prompts ------------------------------------------------------------------------------
def find_data_dir(explicit: str | None = None) -> Path:
    """--data-dir, else $DFLASH_EVAL_DATA, else ../shared/data next to the repo or the cwd."""
    if explicit or os.environ.get(EVAL_DATA_ENV):
        path = Path(explicit or os.environ[EVAL_DATA_ENV]).expanduser()
        if not path.is_dir():
            raise BenchError(f"evaluation data folder {path} does not exist. Fix: pass the "
                             "folder holding " + ", ".join(SUITES.values()) + ".")
        return path
    tried = [REPO_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for path in tried:
        if path.is_dir():
            return path
    raise BenchError(
        "evaluation data not found (looked in " + ", ".join(map(str, tried)) + "). Fix: put "
        + ", ".join(SUITES.values()) + f" in one of those, set {EVAL_DATA_ENV}, or pass "
        "--data-dir."
    )


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise BenchError(f"{path}: no such file. Fix: check the path.")
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchError(f"{path}:{n}: not JSON ({exc.msg}). Fix: one JSON object "
                                 "per line.") from exc
            if not isinstance(record, dict):
                raise BenchError(f"{path}:{n}: expected a JSON object per line.")
            records.append(record)
    return records


def record_prompt(record: dict, index: int, where: str, suite: str | None = None
                  ) -> BenchPrompt:
    """turns[0] when present (mt-bench style), else `prompt`."""
    turns = record.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        text = turns[0]
    elif isinstance(record.get("prompt"), str):
        text = record["prompt"]
    else:
        raise BenchError(f"{where}: record {index + 1} has neither `turns` (list of strings) "
                         "nor `prompt` (string).")
    if suite == "humaneval":
        text = HUMANEVAL_ASK.format(prompt=text)
    rid = record.get("question_id", record.get("task_id", record.get("id", index)))
    return BenchPrompt(str(rid), text)


def load_prompts(prompt: str | None = None, prompt_file: str | None = None,
                 suite: str | None = None, data_dir: str | None = None,
                 limit: int | None = None) -> tuple[list[BenchPrompt], str]:
    """-> (prompts, prompt_format). Exactly one source should be given."""
    if prompt is not None:
        if not prompt.strip():
            raise BenchError("--prompt is empty. Fix: pass some text.")
        return [BenchPrompt("prompt", prompt)], PROMPT_FORMATS["text"]
    if prompt_file is not None:
        path = Path(prompt_file).expanduser()
        prompts = [record_prompt(r, i, str(path)) for i, r in enumerate(read_jsonl(path))]
        fmt = PROMPT_FORMATS["file"]
    elif suite is not None:
        if suite not in SUITES:
            raise BenchError(f"unknown suite {suite!r}. Fix: use one of {', '.join(SUITES)}.")
        path = find_data_dir(data_dir) / SUITES[suite]
        if not path.is_file():
            raise BenchError(f"{path}: the {suite} prompts are missing. Fix: put "
                             f"{SUITES[suite]} there, or point --data-dir / {EVAL_DATA_ENV} "
                             "at the folder that has it.")
        prompts = [record_prompt(r, i, str(path), suite) for i, r in enumerate(read_jsonl(path))]
        fmt = PROMPT_FORMATS[suite]
    else:
        raise BenchError("no prompts. Fix: pass --prompt, --prompt-file or --suite.")
    prompts = prompts[:limit] if limit else prompts
    if not prompts:
        raise BenchError(f"{path}: no prompts in the file.")
    return prompts, fmt


def encode(rt: Any, prompt: BenchPrompt | str) -> list[int]:
    """The chat-templated ids both sides get (raw text when the target has no template)."""
    text = prompt.text if isinstance(prompt, BenchPrompt) else prompt
    if getattr(rt.tokenizer, "chat_template", None) is None:
        return rt.encode(text)
    return rt.encode([{"role": "user", "content": text}])


# -- timed generations --------------------------------------------------------------------
def run_baseline(rt: Any, ids: list[int], max_tokens: int, no_eos: bool) -> Side:
    """Plain mlx-lm greedy decoding. stream_generate always stops at EOS, so --no-eos uses
    generate_step (what stream_generate wraps) directly. Same prefill step as DFlash."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step, stream_generate

    from .runtime import peak_memory

    step = rt.config.prefill_chunk
    mx.reset_peak_memory()
    tokens: list[int] = []
    first = None
    finish = "length"
    start = time.perf_counter()
    if no_eos:
        for token, _ in generate_step(mx.array(ids), rt.model, max_tokens=max_tokens,
                                      prefill_step_size=step):
            first = first or time.perf_counter()
            tokens.append(int(token))
    else:
        for resp in stream_generate(rt.model, rt.tokenizer, mx.array(ids), max_tokens,
                                    prefill_step_size=step):
            first = first or time.perf_counter()
            if resp.finish_reason == "stop":  # the EOS token itself is not output
                finish = "stop"
                break
            tokens.append(int(resp.token))
    end = time.perf_counter()
    return Side(tokens, end - start, (first or end) - start, peak_memory(), finish)


def baseline_function(no_eos: bool) -> str:
    return "mlx_lm.generate.generate_step" if no_eos else "mlx_lm.stream_generate"


def run_dflash(rt: Any, ids: list[int], max_tokens: int, no_eos: bool) -> tuple[Side, Any]:
    result = rt.generate(ids, max_tokens=max_tokens, no_eos=no_eos)
    side = Side(result.tokens, result.elapsed_s, result.prefill_s, result.peak_memory_bytes,
                result.finish_reason)
    return side, result


# -- one prompt ---------------------------------------------------------------------------
def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def median_side(sides: list[Side]) -> dict:
    """Medians over repeats (tokens are the same every repeat: greedy)."""
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
        "acceptance_rate": first.acceptance_rate,
        "tokens_per_cycle": first.tokens_per_cycle,
        "tokens_per_cycle_nonloop": nonloop_tokens_per_cycle(first.cycle_tokens, start),
        "loop_start": start,
        "cycle_tokens": first.cycle_tokens,
        "cycle_profile": profile,
        "cycle_profile_per_cycle": {k: v / first.cycles if first.cycles else 0.0
                                    for k, v in profile.items()},
    }


def bench_prompt(rt: Any, prompt: BenchPrompt, max_tokens: int, repeat: int, no_eos: bool,
                 pause: Callable[[], None]) -> dict:
    ids = encode(rt, prompt)
    bases: list[Side] = []
    flashes: list[Side] = []
    results = []
    for _ in range(repeat):
        pause()
        bases.append(run_baseline(rt, ids, max_tokens, no_eos))
        pause()
        side, result = run_dflash(rt, ids, max_tokens, no_eos)
        flashes.append(side)
        results.append(result)
    mismatches = [first_mismatch(b.tokens, f.tokens) for b, f in zip(bases, flashes)]
    base, flash = median_side(bases), median_side(flashes)
    flash.update(cycle_json(results))
    bad = next((m for m in mismatches if m is not None), None)  # first index that differs
    return {
        "prompt_id": prompt.id,
        "prompt_preview": prompt.text[:80],
        "prompt_tokens": len(ids),
        "baseline": base,
        "dflash": flash,
        "speedup": (flash["tokens_per_second"] / base["tokens_per_second"]
                    if base["tokens_per_second"] > 0 else None),
        "token_match": all(m is None for m in mismatches),
        "first_mismatch": bad,
        "repeat4_share": repeated_ngram_share(flashes[0].tokens),
        "repeats": [{"baseline_tokens_per_second": b.tokens_per_second,
                     "dflash_tokens_per_second": f.tokens_per_second}
                    for b, f in zip(bases, flashes)],
    }


# -- the whole benchmark ------------------------------------------------------------------
def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def summarize(runs: list[dict]) -> dict:
    flash = [r["dflash"] for r in runs]
    base = [r["baseline"] for r in runs]
    return {
        "runs": len(runs),
        "token_match": all(r["token_match"] for r in runs),
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
        "tokens_per_cycle_nonloop_mean": _mean([f["tokens_per_cycle_nonloop"] for f in flash]),
        "repeat4_share_mean": _mean([r["repeat4_share"] for r in runs]),
        "looping_runs": sum(f["loop_start"] is not None for f in flash),
        "peak_memory_bytes_max": max((f["peak_memory_bytes"] for f in flash), default=0),
    }


def warm_up(rt: Any, prompt: BenchPrompt | str, max_tokens: int, no_eos: bool) -> None:
    """One short generation per side so compilation and allocation are not timed."""
    ids = encode(rt, prompt)
    n = min(WARMUP_TOKENS, max_tokens)
    run_baseline(rt, ids, n, no_eos)
    run_dflash(rt, ids, n, no_eos)


def run_benchmark(rt: Any, prompts: Sequence[BenchPrompt | str], max_tokens: int = 256,
                  repeat: int = 1, cooldown: float = 0.0, no_eos: bool = False,
                  warmup: bool = True, prompt_format: str = PROMPT_FORMATS["text"],
                  progress: Callable[[int, int, BenchPrompt], None] | None = None) -> dict:
    """Benchmark `prompts` (BenchPrompt or plain user messages) on a loaded DFlashRuntime.
    Returns the report dict that --json writes (without the command line)."""
    items = [p if isinstance(p, BenchPrompt) else BenchPrompt(str(i), p)
             for i, p in enumerate(prompts)]
    timed = [0]

    def pause() -> None:  # --cooldown between timed generations, not before the first
        if timed[0] and cooldown > 0:
            time.sleep(cooldown)
        timed[0] += 1

    started = datetime.now(UTC).isoformat(timespec="seconds")
    if warmup and items:
        warm_up(rt, items[0], max_tokens, no_eos)
    runs = []
    for i, prompt in enumerate(items):
        if progress is not None:
            progress(i, len(items), prompt)
        runs.append(bench_prompt(rt, prompt, max_tokens, repeat, no_eos, pause))
    desc = rt.describe()
    return {
        "timestamp": started,
        "machine": machine_info(),
        "backend": desc["backend"],
        "dtype": desc["dtype"],
        "versions": versions(),
        "blas": blas_info(),
        "model": desc,
        "settings": {"max_tokens": max_tokens, "repeat": repeat, "cooldown_s": cooldown,
                     "no_eos": no_eos, "warmup": warmup, "greedy": True,
                     "prefill_step": rt.config.prefill_chunk,
                     "block_size": rt.block_size, "max_ctx": rt.config.max_ctx,
                     "sync_phases": rt.config.sync_phases,
                     "adaptive_block": rt.config.adaptive_block,
                     "min_draft_confidence": rt.min_confidence,
                     "draft_vocab": rt.draft_vocab},
        "baseline_function": baseline_function(no_eos),
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
        "acceptance_rate": "1 - cycles / generated tokens (dflash-mlx's definition)",
        "tokens_per_cycle": "tokens committed by the cycles / cycles (prefill token excluded)",
        "token_match": "DFlash tokens == baseline tokens (up to EOS, or all max_tokens with "
                       "no_eos), on every repeat",
        "cycle_profile": "seconds summed over cycles by phase (median over repeats); "
                         "cycle_profile_per_cycle divides by cycles. With settings.sync_phases "
                         "(--profile) each phase is evaluated on its own (device time); "
                         "without, phases overlap and these are host-side times",
        "repeats": "timings are medians over --repeat runs of each prompt",
        "draft_vocab": "settings.draft_vocab: the draft proposes from the top N tokens of its "
                       "token_ranking.json plus each prompt's own tokens (--draft-vocab); null: "
                       "from the full vocabulary",
        **DEFINITIONS,
    }


# -- environment --------------------------------------------------------------------------
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def machine_info() -> dict:
    import mlx.core as mx

    try:
        device = {k: v for k, v in mx.device_info().items()}
    except Exception:  # older MLX or no device info for this backend
        device = {}
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _total_memory(),
        "default_device": str(mx.default_device()),
        "gpu": device.get("device_name") if on_gpu else None,
        "device_info": device,
    }


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import mlx.core as mx

    from . import __version__

    try:
        mlx_lm = version("mlx-lm")
    except PackageNotFoundError:
        import mlx_lm as m

        mlx_lm = getattr(m, "__version__", "unknown")
    return {"mlx": mx.__version__, "mlx_lm": mlx_lm, "dflash_engine": __version__,
            "python": platform.python_version()}


def blas_info() -> dict:
    """Which BLAS the CPU matmuls use: LD_PRELOAD'ed OpenBLAS or MLX's bundled one."""
    preload = os.environ.get("LD_PRELOAD", "")
    try:  # Linux: the libraries actually mapped into this process
        maps = Path("/proc/self/maps").read_text().splitlines()
        # numpy's scipy_openblas uses suffixed symbols: it never serves MLX's matmuls.
        mapped = sorted({line.split()[-1] for line in maps if "blas" in line.lower()
                         and "/" in line and "scipy_openblas" not in line})
    except OSError:
        mapped = None
    return {"openblas_preloaded": "openblas" in preload.lower(), "ld_preload": preload or None,
            "blas_libraries_loaded": mapped}


# -- terminal + CLI -----------------------------------------------------------------------
def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_report(report: dict, console: Any = None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    model = report["model"]
    table = Table(title=f"DFlash benchmark: {Path(model['target']).name} + "
                  f"{Path(model['draft']).name} ({report['backend']}, {report['dtype']}, "
                  f"baseline {report['baseline_function']})", box=box.SIMPLE_HEAD)
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
            "yes" if r["token_match"] else "[red]NO[/red]",
        )
    s = report["summary"]
    table.add_section()
    table.add_row(
        f"median/mean ({s['runs']})", "", _fmt(s["baseline_tokens_per_second_median"]),
        _fmt(s["dflash_tokens_per_second_median"]), _fmt(s["speedup_median"], ".2f") + "x",
        _fmt(s["acceptance_rate_mean"], ".2f"), _fmt(s["tokens_per_cycle_mean"], ".2f"),
        _fmt(s["tokens_per_cycle_nonloop_mean"], ".2f"), _fmt(s["repeat4_share_mean"], ".2f"),
        "", _fmt(s["peak_memory_bytes_max"] / 2**20),
        "yes" if s["token_match"] else "[red]NO[/red]", style="bold",
    )
    console.print(table)
    console.print("tok/s: medians, prefill included; speed-up: median of end-to-end ratios; "
                  "non-loop: tok/cycle before the first looping 64-token window.")


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
                   "or ../shared/data)")
    p.add_argument("--limit", type=int, help="first N prompts only")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeat", type=int, default=1, help="runs per prompt (median reported)")
    p.add_argument("--cooldown", type=float, default=0.0, help="seconds between runs")
    p.add_argument("--no-eos", action="store_true", help="always generate --max-tokens")
    add_engine_args(p)
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
                                    args.limit)
        from .runtime import DFlashRuntime

        try:
            config = config_from_args(args, sync_phases=args.profile)
        except ValueError as exc:
            raise BenchError(str(exc)) from exc
        with err.status("loading models"):
            rt = DFlashRuntime.from_pretrained(args.model, args.draft, config)

        def progress(i: int, n: int, prompt: BenchPrompt) -> None:
            err.print(f"[dim]prompt {i + 1}/{n}: {prompt.id}[/dim]")

        report = run_benchmark(rt, prompts, args.max_tokens, args.repeat, args.cooldown,
                               args.no_eos, not args.no_warmup, fmt, progress)
    except DFlashError as exc:
        err.print("[red]error:[/red]", escape(str(exc)), highlight=False)
        return 2
    report = {"command": shlex.join(sys.argv), "argv": list(sys.argv[1:] if argv is None
                                                            else argv), **report}
    print_report(report, console)
    if args.json:
        path = Path(args.json).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {path}")
    if not report["summary"]["token_match"]:
        bad = [r["prompt_id"] for r in report["runs"] if not r["token_match"]]
        err.print(f"[red]error:[/red] DFlash output differs from the baseline on {bad}: "
                  "lossless decoding is broken (a correctness bug).")
        return 1
    return 0
