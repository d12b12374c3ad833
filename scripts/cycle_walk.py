"""How well training's simulated acceptance predicts real decoding: per reply, real whole-block
tokens/cycle against the same draft's simulation on the same tokens, two ways.

    python scripts/cycle_walk.py --draft engine/drafts/smollm2-135m-instruct-dflash --limit 8 \
        --json benchmarks/stage10/cycle-walk-8-cpu.json
    python scripts/cycle_walk.py --draft D --suite none --heldout benchmarks/stage5/heldout.npz

- anchor mean: 1 + run averaged over a block anchored at every reply position (what training's
  validation reports, there on 96 random anchors per answer);
- walk: the cycles a decode runs (`engine.train.objective.walk_cycles`): anchored at token 0,
  then wherever the last cycle stopped, so every miss is a cycle and a long run only one;
- real (suites only): a whole-block greedy decode with the full vocabulary (CPU fp32: the
  reply is the target's own, the tokens the simulation runs on).
Suites: each prompt's reply is decoded for real, then simulated; --heldout: the held-out
answers (first --heldout-limit) are simulated only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.bench.environment import machine_info, versions
from engine.bench.suites import SUITES, load_prompts
from engine.config import DFlashConfig
from engine.loading import load_draft_folder
from engine.runtime import DFlashRuntime
from engine.train.dataset import Dataset
from engine.train.objective import anchor_runs, walk_cycles


def simulate(draft, target, seq: list[int], prompt_len: int) -> dict:
    runs = anchor_runs(draft, target, seq, prompt_len)
    n = len(seq) - prompt_len
    cycles = walk_cycles(runs, n)
    return {"tokens": n, "anchor_mean": float(1 + runs.mean()) if len(runs) else None,
            "walk": (n - 1) / len(cycles) if cycles else None, "walk_cycles": cycles}


def mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", action="append", required=True, help="draft folder (repeatable)")
    p.add_argument("--suite", action="append", choices=[*sorted(SUITES), "none"],
                   help="suite (repeatable; default: all three; none: only --heldout)")
    p.add_argument("--limit", type=int, default=8, help="first N prompts of each suite")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--heldout", help="also simulate these answers (a Dataset .npz)")
    p.add_argument("--heldout-limit", type=int, default=64)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    suites = [] if args.suite == ["none"] else (args.suite or sorted(SUITES))
    config = DFlashConfig(min_draft_confidence=None, draft_vocab=None)
    base = DFlashRuntime.from_pretrained(config=config)
    report = {"command": "python " + " ".join(sys.argv), "max_tokens": args.max_tokens,
              "settings": "whole blocks, full vocabulary, greedy", "machine": machine_info(),
              "versions": versions(), "drafts": {}}
    for folder in args.draft:
        draft = load_draft_folder(Path(folder))
        rt = DFlashRuntime(base.model, base.tokenizer, draft, config, target=base.target)
        rows: dict[str, dict] = {}
        for suite in suites:
            prompts, _ = load_prompts(suite=suite, limit=args.limit)
            runs = []
            for prompt in prompts:
                messages = [{"role": "user", "content": prompt.text}]
                ids = rt.encode(messages)
                result = rt.generate(messages, max_tokens=args.max_tokens)
                sim = simulate(draft, base.target, ids + list(result.tokens), len(ids))
                runs.append({"prompt_id": prompt.id, "real": result.tokens_per_cycle,
                             "real_cycles": list(result.cycle_tokens), **sim,
                             "same_cycles": list(result.cycle_tokens) == sim["walk_cycles"]})
            rows[suite] = {k: mean(runs, k) for k in ("real", "walk", "anchor_mean")}
            rows[suite].update(same_cycles=sum(r["same_cycles"] for r in runs), runs=runs)
        if args.heldout:
            data = Dataset.load(Path(args.heldout))
            runs = [simulate(draft, base.target, list(data.sequences[i]), data.prompt_lens[i])
                    for i in range(min(args.heldout_limit, len(data)))]
            rows["heldout"] = {"walk": mean(runs, "walk"), "anchor_mean": mean(runs, "anchor_mean"),
                               "answers": len(runs), "runs": runs}
        for name, row in rows.items():
            real = f"real {row['real']:.2f}  " if row.get("real") is not None else ""
            print(f"{folder}  {name:9s} {real}walk {row['walk']:.2f}  "
                  f"anchor mean {row['anchor_mean']:.2f}", flush=True)
        report["drafts"][folder] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
