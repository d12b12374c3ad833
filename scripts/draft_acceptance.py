"""Tokens/cycle of one or more drafts on the evaluation suites, without timing: the target is
loaded once and each draft decodes every prompt speculatively with whole blocks and the full
vocabulary (greedy output is the target's own, so tokens/cycle alone tells drafts apart).

    python scripts/draft_acceptance.py --draft engine/drafts/smollm2-135m-instruct-dflash \
        --draft other/folder --limit 4 --json benchmarks/draft-acceptance-cpu.json
    python scripts/draft_acceptance.py --draft D --limit 8 --walk \
        --heldout heldout.npz --heldout-limit 40 --json F
    # held-out answers are kept in git history: SmolLM2's at
    # `git show 2b41663:benchmarks/stage5/heldout.npz`, the Qwen pair's at
    # `git show 9d038af:train-data/qwen-coder/heldout-1.npz`

Reports per suite and draft: tokens/cycle and non-loop tokens/cycle (each the mean over
the suite's replies, with its standard error), the repeated-4-gram share
(engine.bench.metrics) and the share of cycles the suffix lookup proposed (--lookup, the
engine's default; `--lookup off`: the draft alone). The JSON records the command line that
made it.

--walk also runs training's simulation on each reply's tokens, two ways: the anchor mean
(1 + run averaged over a block anchored at every reply position: what training's validation
reports, there on random anchors) and the walk (`engine.train.objective.walk_cycles`: the cycles
a decode runs, anchored at token 0 and then wherever the last cycle stopped), beside the real
cycles. --heldout simulates held-out answers the same way (no real decode).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from engine.bench.environment import machine_info, versions
from engine.bench.metrics import (
    lookup_cycle_share,
    loop_start,
    nonloop_tokens_per_cycle,
    repeated_ngram_share,
)
from engine.bench.suites import PICKS, SUITES, load_prompts
from engine.bench.timing import first_mismatch, run_baseline
from engine.config import DFlashConfig, copy_odds_arg, lookup_arg
from engine.loading import load_draft_folder
from engine.lookup import MIN_MATCH
from engine.runtime import DFlashRuntime
from engine.train.dataset import Dataset
from engine.train.objective import simulate_answer


def report_text(report: dict) -> str:
    """The report as indented JSON with every list of numbers on one line (the per-anchor runs
    and cycles, one per line, would make the file several times its size)."""
    text = json.dumps(report, indent=1)
    return re.sub(r"\[\n\s*([-0-9.eE,\s]+?)\n\s*\]",
                  lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n"


def counted(runs: list[dict], key: str) -> list[float]:
    """The runs' values of `key`, those without one (None) left out."""
    return [r[key] for r in runs if r.get(key) is not None]


def mean(runs: list[dict], key: str) -> float:
    values = counted(runs, key)
    return sum(values) / len(values) if values else float("nan")


def standard_error(runs: list[dict], key: str) -> float | None:
    """The standard error of `mean(runs, key)`: how far another draw of as many prompts may
    read (a few looping replies move a suite's mean a long way); None below two runs."""
    values = counted(runs, key)
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", action="append", required=True, help="draft folder (repeatable)")
    p.add_argument("--model", help="target id or folder (default: the offline default pair's)")
    p.add_argument("--suite", action="append", choices=sorted(SUITES),
                   help="suite (repeatable; default: all three)")
    p.add_argument("--limit", type=int, default=4, help="N prompts of each suite (see --pick)")
    p.add_argument("--pick", choices=PICKS, default="spread",
                   help="which N: spread over a suite's categories (default) or its first N")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--walk", action="store_true",
                   help="also simulate each reply as training does (anchor mean, decode walk)")
    p.add_argument("--heldout", help="also simulate these answers (a Dataset .npz)")
    p.add_argument("--heldout-limit", type=int, default=64)
    p.add_argument("--lookup", type=lookup_arg, default=MIN_MATCH, metavar="N|off",
                   help=f"the suffix lookup's minimum match (default {MIN_MATCH}, as the "
                        "engine); 'off': the draft proposes every cycle")
    p.add_argument("--copy-odds", type=copy_odds_arg, default=None, metavar="P|off",
                   help="finish the draft's proposals from the context at these odds, as the "
                        "engine's --copy-odds (default off)")
    p.add_argument("--check-plain", action="store_true",
                   help="also decode plainly (mlx-lm) and check every reply is identical")
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    # every cycle speculates: a paused cycle (the target alone) would count as one token
    config = DFlashConfig(min_draft_confidence=None, draft_vocab=None, pause_speculation=False,
                          lookup_min_match=args.lookup, copy_odds=args.copy_odds)
    base = DFlashRuntime.from_pretrained(model=args.model, config=config,
                                         draft=args.draft[0] if args.model else None)
    report = {"command": "python " + " ".join(sys.argv), "max_tokens": args.max_tokens,
              "prompt_pick": args.pick,
              "settings": "whole blocks, full vocabulary, greedy, never paused",
              "lookup_min_match": args.lookup, "copy_odds": args.copy_odds,
              "check_plain": args.check_plain,
              "machine": machine_info(),
              "versions": versions(), "drafts": {}}
    plain: dict[tuple[str, str], list[int]] = {}  # (suite, prompt id) -> mlx-lm's reply
    mismatched = 0
    for folder in args.draft:
        draft = load_draft_folder(Path(folder))
        rt = DFlashRuntime(base.model, base.tokenizer, draft, config, target=base.target)
        rows = {}
        for suite in args.suite or sorted(SUITES):
            prompts, _ = load_prompts(suite=suite, limit=args.limit, pick=args.pick)
            runs = []
            for prompt in prompts:
                messages = [{"role": "user", "content": prompt.text}]
                result = rt.generate(messages, max_tokens=args.max_tokens)
                start = loop_start(result.tokens)
                run = {"prompt_id": prompt.id, "tokens": len(result.tokens),
                       "tokens_per_cycle": result.tokens_per_cycle,
                       "tokens_per_cycle_nonloop":
                           nonloop_tokens_per_cycle(result.cycle_tokens, start),
                       "repeat4_share": repeated_ngram_share(result.tokens),
                       "lookup_cycles": result.lookup_cycles, "cycles": result.cycles,
                       "pauses": result.pauses}
                if args.check_plain:
                    key = (suite, prompt.id)
                    if key not in plain:
                        plain[key] = run_baseline(base.model, rt.encode(messages),
                                                  args.max_tokens, rt.prefill_chunk,
                                                  base.tokenizer).tokens
                    bad = first_mismatch(plain[key], list(result.tokens))
                    run.update(token_match=bad is None, first_mismatch=bad)
                    mismatched += bad is not None
                if args.walk:
                    ids = rt.encode(messages)
                    run.update(real_cycles=list(result.cycle_tokens), prompt_tokens=ids,
                               reply=list(result.tokens),
                               **simulate_answer(draft, base.target,
                                                 ids + list(result.tokens), len(ids)))
                runs.append(run)
            keys = ["tokens_per_cycle", "tokens_per_cycle_nonloop", "repeat4_share"]
            if args.walk:
                keys += ["walk", "anchor_mean"]
            rows[suite] = {k: mean(runs, k) for k in keys}
            for k in ("tokens_per_cycle", "tokens_per_cycle_nonloop"):
                rows[suite][k + "_se"] = standard_error(runs, k)
            rows[suite]["lookup_cycle_share"] = lookup_cycle_share(runs)
            if args.check_plain:
                rows[suite]["token_match"] = all(r["token_match"] for r in runs)
            rows[suite]["runs"] = runs
            walked = (f"  walk {rows[suite]['walk']:.2f}  anchor mean "
                      f"{rows[suite]['anchor_mean']:.2f}") if args.walk else ""
            se = rows[suite]["tokens_per_cycle_se"]
            identical = (f"  identical to plain {sum(r['token_match'] for r in runs)}/"
                         f"{len(runs)}") if args.check_plain else ""
            print(f"{folder}  {suite:9s} tokens/cycle {rows[suite]['tokens_per_cycle']:.2f}"
                  f"{f' (se {se:.2f})' if se is not None else ''}  "
                  f"non-loop {rows[suite]['tokens_per_cycle_nonloop']:.2f}  "
                  f"repeated 4-grams {rows[suite]['repeat4_share']:.2f}  lookup cycles "
                  f"{rows[suite]['lookup_cycle_share']:.0%}{walked}{identical}", flush=True)
        if args.heldout:
            data = Dataset.load(Path(args.heldout))
            runs = [simulate_answer(draft, base.target, data.sequences[i], data.prompt_lens[i])
                    for i in range(min(args.heldout_limit, len(data)))]
            rows["heldout"] = {"walk": mean(runs, "walk"), "anchor_mean": mean(runs, "anchor_mean"),
                               "answers": len(runs), "runs": runs}
            print(f"{folder}  heldout   walk {rows['heldout']['walk']:.2f}  anchor mean "
                  f"{rows['heldout']['anchor_mean']:.2f}  ({len(runs)} answers)", flush=True)
        report["drafts"][folder] = rows
    if args.json:
        Path(args.json).write_text(report_text(report))
    if mismatched:
        print(f"{mismatched} replies differ from plain decoding", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
