"""`dflash benchmark` at two checkouts of this repository, interleaved prompt by prompt: the A/B
of an engine change on one machine in one run (a shared machine's speed drifts; each prompt's
two runs share the same moment).

    python scripts/ab_bench.py --checkout before=/path/to/old/checkout --checkout after=. \\
        --suite humaneval --suite gsm8k --suite mt-bench --limit 4 --json F

or two settings of one checkout (any `dflash benchmark` engine flags, per side):

    python scripts/ab_bench.py --checkout auto=. --checkout v32k=. \\
        --engine-args v32k="--draft-vocab 32768" --suite humaneval --no-baseline --json F

Each checkout runs in a worker process of its own (its folder first on PYTHONPATH) that loads
the offline default pair once with the engine's defaults or its `--engine-args` (`--model`/
`--draft` for another pair),
warms up, then benchmarks each prompt it is sent as `dflash benchmark` does
(engine.bench.compare.bench_prompt: mlx-lm's plain decoding, then DFlash, on the same loaded
target; greedy, token match checked; no conversation-state reuse). The prompts alternate which
checkout runs first. `--no-baseline` times DFlash alone (the engine change's side of the
row, at a fraction of the time: plain decoding is the slow half), and each row keeps its
tokens: the two checkouts must commit the same ones. The JSON holds both sides' rows and, per
suite and overall, each side's medians and the second checkout's DFlash tok/s (and speed-up)
over the first's, prompt by prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

PREFIX = "ab-bench: "  # a worker's protocol lines on stdout (anything else is passed through)


def worker(args: argparse.Namespace) -> int:
    """Load the pair once, then answer `SUITE INDEX` lines with a benchmark row each."""
    import engine
    from engine import DFlashConfig, DFlashRuntime
    from engine.bench.compare import (
        Options,
        bench_prompt,
        cycle_json,
        median_side,
        run_dflash,
        warm_up,
    )
    from engine.bench.environment import environment
    from engine.bench.metrics import repeated_ngram_share
    from engine.bench.suites import encode, load_prompts

    prompts = {suite: load_prompts(suite=suite, limit=args.limit)[0] for suite in args.suite}
    config = DFlashConfig(prompt_cache_bytes=0)
    if args.worker_engine_args:
        from engine.config import add_engine_args, config_from_args

        flags = argparse.ArgumentParser(prog="--engine-args")
        add_engine_args(flags)
        config = config_from_args(flags.parse_args(shlex.split(args.worker_engine_args)),
                                  prompt_cache_bytes=0)
    rt = DFlashRuntime.from_pretrained(args.model, args.draft, config)
    sampling = ({"temperature": args.temperature, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                 "seed": args.seed} if args.temperature else {})
    opts = Options(max_tokens=args.max_tokens, sampling=sampling)
    if args.no_baseline:  # compilation and allocation outside the timed runs
        run_dflash(rt, encode(rt, prompts[args.suite[0]][0]), opts)
    else:
        warm_up(rt, prompts[args.suite[0]][0], opts)
    say({"ready": True, "engine": engine.__file__, "model": rt.describe(),
         "environment": environment()})
    for line in sys.stdin:
        suite, index = line.split()
        prompt = prompts[suite][int(index)]
        if not args.no_baseline:
            say({"suite": suite, **bench_prompt(rt, prompt, opts, args.repeat, lambda: None),
                 "load_average": os.getloadavg()})  # after the row: a shared machine's load
            continue
        ids = encode(rt, prompt)
        sides, results = zip(*(run_dflash(rt, ids, opts) for _ in range(args.repeat)))
        say({"suite": suite, "prompt_id": prompt.id, "prompt_tokens": len(ids),
             "dflash": {**median_side(list(sides)), **cycle_json(list(results))},
             "repeat4_share": repeated_ngram_share(sides[0].tokens),
             "tokens": sides[0].tokens})
    return 0


def say(message: dict) -> None:
    print(PREFIX + json.dumps(message, default=str), flush=True)


def listen(proc: subprocess.Popen) -> dict:
    """The worker's next protocol line (other output goes to our stderr)."""
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX):])
        sys.stderr.write(line)
    raise SystemExit(f"a worker exited early (code {proc.wait()})")


def start(name: str, folder: Path, args: argparse.Namespace, engine_args: str = ""
          ) -> subprocess.Popen:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker",
            "--max-tokens", str(args.max_tokens), "--limit", str(args.limit),
            "--repeat", str(args.repeat), *[a for s in args.suite for a in ("--suite", s)]]
    argv += ["--no-baseline"] if args.no_baseline else []
    argv += ["--temperature", str(args.temperature), "--seed", str(args.seed)]
    argv += ["--model", args.model] if args.model else []
    argv += ["--draft", args.draft] if args.draft else []
    argv += [f"--worker-engine-args={engine_args}"] if engine_args else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])}
    print(f"{name}: starting at {folder}", file=sys.stderr)
    return subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)


def commit_of(folder: Path) -> str:
    top = subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
                         capture_output=True, text=True).stdout.strip()
    if not top or Path(top).resolve() != folder.resolve():
        # a copy inside another repository (say a `git archive` unpacked in an ignored folder)
        # would report that repository's commit
        return "not a git checkout (name its commit in the report's note)"
    run = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True,
                         text=True)
    dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--",
                            "engine"], capture_output=True, text=True).stdout.strip()
    return run.stdout.strip() + (" (engine/ modified)" if dirty else "")


def median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def summary(rows: dict[str, list[dict]], names: list[str]) -> dict:
    """Each side's medians and means over `rows` (per side, prompt for prompt), and the second
    side's ratios over the first's."""
    out: dict[str, Any] = {"prompts": len(rows[names[0]])}
    for name in names:
        runs = rows[name]
        flash = [r["dflash"] for r in runs]
        out[name] = {
            "dflash_tokens_per_second_median": median([f["tokens_per_second"] for f in flash]),
            "dflash_decode_tokens_per_second_median": median(
                [f["decode_tokens_per_second"] for f in flash]),
            "tokens_per_cycle_mean": mean([f["tokens_per_cycle"] for f in flash]),
            "tokens_per_cycle_nonloop_mean": mean([f["tokens_per_cycle_nonloop"] for f in flash]),
            "repeat4_share_mean": mean([r["repeat4_share"] for r in runs]),
            # pausing (engine/pause.py); absent where the checkout has none
            "pauses": sum(f.get("pauses", 0) for f in flash),
            "paused_tokens": sum(f.get("paused_tokens", 0) for f in flash),
            "generated_tokens": sum(f["generated_tokens"] for f in flash),
        }
        if "baseline" in runs[0]:  # dflash benchmark's whole row
            out[name].update({
                "baseline_tokens_per_second_median": median(
                    [r["baseline"]["tokens_per_second"] for r in runs]),
                "speedup_median": median([r["speedup"] for r in runs]),
                "speedup_min": min(r["speedup"] for r in runs),
                "speedup_min_prompt": min(runs, key=lambda r: r["speedup"])["prompt_id"],
                "cycle_cost_steps_median": median([r.get("cycle_cost_steps") for r in runs]),
                "token_match": all(r["token_match"] is not False for r in runs)})
    a, b = (rows[n] for n in names)
    ratios: dict[str, Any] = {"dflash_tokens_per_second_ratio_median": median(
        [y["dflash"]["tokens_per_second"] / x["dflash"]["tokens_per_second"]
         for x, y in zip(a, b)])}
    if "baseline" in a[0]:
        ratios["speedup_ratio_median"] = median([y["speedup"] / x["speedup"]
                                                 for x, y in zip(a, b)])
    else:
        ratios["same_tokens"] = all(x["tokens"] == y["tokens"] for x, y in zip(a, b))
    if "baseline" in a[0]:  # each side's DFlash over its own mlx-lm run, the worst prompt
        ratios["dflash_over_mlx_lm_min"] = {n: out[n]["speedup_min"] for n in names}
    out[f"{names[1]}_over_{names[0]}"] = ratios
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", action="append", default=[], metavar="NAME=FOLDER",
                   help="a checkout of this repository (twice: the first is the base)")
    p.add_argument("--suite", action="append", required=True,
                   help="mt-bench | humaneval | gsm8k (repeatable)")
    p.add_argument("--limit", type=int, default=4, help="prompts per suite (spread pick)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeat", type=int, default=1, help="runs per prompt and side (median)")
    p.add_argument("--model", help="target id or folder (default: the offline default pair)")
    p.add_argument("--draft", help="draft id or folder")
    p.add_argument("--no-baseline", action="store_true",
                   help="time DFlash alone (no mlx-lm run per prompt); rows keep their tokens")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sample at this temperature (both sides, mlx-lm too; top_p 1); 0: greedy")
    p.add_argument("--seed", type=int, default=0, help="the sampled runs' seed")
    p.add_argument("--engine-args", action="append", default=[], metavar="NAME=FLAGS",
                   help="`dflash benchmark` engine flags for that side (e.g. "
                        "v32k=\"--draft-vocab 32768\"); the same folder may then serve both")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-engine-args", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if len(args.checkout) != 2 or not all("=" in c for c in args.checkout):
        p.error("give two --checkout NAME=FOLDER")
    sides = [(name, Path(folder).resolve())
             for name, folder in (c.split("=", 1) for c in args.checkout)]
    names = [name for name, _ in sides]
    if len(set(names)) != 2:
        p.error("give the two --checkout sides different names")
    engine_args = dict(e.split("=", 1) for e in args.engine_args if "=" in e)
    if len(engine_args) != len(args.engine_args) or not set(engine_args) <= set(names):
        p.error("--engine-args takes NAME=FLAGS, NAME one of the --checkout names")
    commits = {name: commit_of(folder) for name, folder in sides}  # before anything runs
    procs = {name: start(name, folder, args, engine_args.get(name, "")) for name, folder in sides}
    ready = {name: listen(proc) for name, proc in procs.items()}
    rows: dict[str, dict[str, list[dict]]] = {s: {n: [] for n in names} for s in args.suite}
    order = 0
    for index in range(args.limit):
        for suite in args.suite:
            turn = names if order % 2 == 0 else names[::-1]  # who runs first alternates
            order += 1
            for name in turn:
                procs[name].stdin.write(f"{suite} {index}\n")  # type: ignore[union-attr]
                procs[name].stdin.flush()  # type: ignore[union-attr]
                row = listen(procs[name])
                rows[suite][name].append(row)
                print(f"{suite} {index} {name}: DFlash {row['dflash']['tokens_per_second']:.1f} "
                      f"tok/s ({row['dflash']['decode_tokens_per_second']:.1f} decoding), "
                      f"{row['dflash']['tokens_per_cycle']:.2f} tokens/cycle", file=sys.stderr)
    for proc in procs.values():
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait()
    everything = {n: [r for s in args.suite for r in rows[s][n]] for n in names}
    report = {
        "command": "python " + shlex.join(sys.argv if argv is None else [sys.argv[0], *argv]),
        "checkouts": {name: {"folder": str(folder), "commit": commits[name],
                             "engine": ready[name]["engine"], "model": ready[name]["model"],
                             "engine_args": engine_args.get(name, "")}
                      for name, folder in sides},
        "environment": ready[names[1]]["environment"],
        "settings": {"max_tokens": args.max_tokens, "limit": args.limit,
                     "repeat": args.repeat, "greedy": not args.temperature,
                     "temperature": args.temperature,
                     "seed": args.seed if args.temperature else None, "pick": "spread",
                     "baseline": not args.no_baseline,
                     "order": "alternating: even positions run the first checkout first"},
        "summary": {"all": summary(everything, names),
                    **{s: summary(rows[s], names) for s in args.suite}},
        "runs": rows,
    }
    print(json.dumps(report["summary"], indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    every = report["summary"]["all"]
    same = (every[f"{names[1]}_over_{names[0]}"].get("same_tokens", True)
            and all(every[n].get("token_match", True) for n in names))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
