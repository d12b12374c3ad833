"""Where sampled acceptance goes: per block position, temperature and top_p, and what other
exact proposal rules would accept on the same cycles. No timing.

    python scripts/sampled_acceptance.py --limit 2 --max-tokens 128 \\
        --json benchmarks/sampled-acceptance-cpu.json

The offline pair decodes each suite prompt with speculative sampling (whole blocks, lookup off,
pausing off: every cycle is a draft cycle) at each --temperature and --top-p. At every drafted
position j of every cycle, with p_j the target's processed distribution there (given the
drafts before j) and q_j the draft's at the request's settings, it records:

- standard: sum_x min(p_j, q_j), the chance the engine's rule (draw x from q, keep it with
  min(1, p/q)) keeps position j;
- greedy: p_j(argmax q_j), the chance when the draft proposes its top token (q one-hot);
- sharp: sum_x min(p_j, q'_j) with q' the draft at half the request's temperature;
- gumbel: the chance that argmax(log q_j + g) == argmax(log p_j + g) for shared Gumbel noise
  g (GUMBEL_DRAWS draws): a coupling that makes a seed's reply independent of the draft;
- hybrid@c: greedy where the draft's top probability (at the request's settings) is at least
  c, standard elsewhere.

Any q chosen from the draft's own output keeps speculative sampling exact, so each of these
is a rule the engine could run. Per rule the report has the mean per position and the
expected tokens per cycle, 1 + sum_k prod_{j<=k} alpha_j per cycle (an estimate: later
positions' p is the one given the standard rule's drafts), beside the decode's real
tokens/cycle.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

GUMBEL_DRAWS = 16
HYBRID = (0.3, 0.5, 0.7, 0.9)


def rules() -> list[str]:
    return ["standard", "greedy", "sharp", "gumbel", *[f"hybrid@{c}" for c in HYBRID]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", action="append", help="default: all three")
    p.add_argument("--limit", type=int, default=2, help="prompts per suite (spread pick)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperatures", default="0.3,0.7,1.0")
    p.add_argument("--top-ps", default="0.9,1.0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)

    import engine.runtime  # noqa: I001  (before mlx.core: the fast BLAS, engine/blas.py)
    import mlx.core as mx
    from engine import DFlashConfig, DFlashRuntime
    from engine.bench.environment import environment
    from engine.bench.suites import SUITES, encode, load_prompts
    from engine.cycle import DraftProposer, draw_proposal
    from engine.sampling import Sampler, SamplingParams, full_vocab

    suites = args.suite or list(SUITES)
    rt = DFlashRuntime.from_pretrained(config=DFlashConfig(
        min_draft_confidence=None, lookup_min_match=None, pause_speculation=False,
        prompt_cache_bytes=0))
    vocab = rt.target.vocab_size
    stash: dict = {}

    class Recording(DraftProposer):
        def propose_sampled(self, staged, size, position, sampler):
            stash["logits"] = None
            return super().propose_sampled(staged, size, position, sampler)

        def draft_proposal_sampled(self, staged, size, sampler):
            if size == 1:
                return super().draft_proposal_sampled(staged, size, sampler)
            logits = self.draft_logits(staged, size)
            stash["logits"], stash["ids"] = logits[0], self.output_head.ids
            return draw_proposal(staged, logits, self.output_head.ids, vocab, sampler,
                                 self.plan.min_confidence, self.plan.verify_lengths)

    def make(head, cache, context):
        return Recording(rt.target, rt.draft, head, rt.plan, cache, context)

    rt.make_proposer = make
    cycles: list[dict] = []

    class RecordingSampler(Sampler):
        def accept(self, verify_in, probs, q):
            n = q.shape[0]
            logits = stash.get("logits")
            if n and logits is not None:
                cycles.append(measure(self, verify_in, probs, q, logits[:n], stash["ids"]))
            return super().accept(verify_in, probs, q)

    def measure(sampler, verify_in, probs, q, logits, ids) -> dict:
        n = q.shape[0]
        pn = probs[:n]
        params = sampler.params
        sharp = Sampler(SamplingParams(params.temperature / 2, params.top_p, params.top_k,
                                       params.min_p)).probs(logits)
        sharp = full_vocab(sharp, ids, vocab)
        top = mx.argmax(q, axis=-1)
        g = mx.random.gumbel((GUMBEL_DRAWS, n, vocab))
        same = (mx.argmax(mx.log(q)[None] + g, axis=-1)
                == mx.argmax(mx.log(pn)[None] + g, axis=-1))
        out = {
            "standard": mx.sum(mx.minimum(pn, q), axis=-1),
            "greedy": mx.take_along_axis(pn, top[:, None], axis=-1)[:, 0],
            "sharp": mx.sum(mx.minimum(pn, sharp), axis=-1),
            "gumbel": mx.mean(same.astype(mx.float32), axis=0),
            "q_top": mx.max(q, axis=-1),
        }
        return {k: v.tolist() for k, v in out.items()}

    engine.runtime.Sampler = RecordingSampler
    prompts = {s: load_prompts(suite=s, limit=args.limit)[0] for s in suites}
    configs = []
    started = time.time()
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        for top_p in [float(t) for t in args.top_ps.split(",")]:
            cycles.clear()
            decoded = []
            for suite in suites:
                for i, prompt in enumerate(prompts[suite]):
                    result = rt.generate(encode(rt, prompt), max_tokens=args.max_tokens,
                                         temperature=temperature, top_p=top_p,
                                         seed=args.seed + i)
                    decoded.append({"suite": suite, "prompt_id": prompt.id,
                                    "tokens": len(result.tokens),
                                    "tokens_per_cycle": result.tokens_per_cycle})
            configs.append({"temperature": temperature, "top_p": top_p,
                            **summarize(cycles), "replies": decoded,
                            "tokens_per_cycle_real_mean": statistics.fmean(
                                d["tokens_per_cycle"] for d in decoded)})
            c = configs[-1]
            print(f"T={temperature} top_p={top_p}: real {c['tokens_per_cycle_real_mean']:.2f} "
                  "tokens/cycle; expected " + ", ".join(
                      f"{r} {v:.2f}" for r, v in c["expected_tokens_per_cycle"].items()),
                  file=sys.stderr)
    report = {
        "command": "python " + shlex.join(sys.argv if argv is None else [sys.argv[0], *argv]),
        "what": __doc__,
        "model": rt.describe(),
        "environment": environment(),
        "settings": {"suites": suites, "limit": args.limit, "max_tokens": args.max_tokens,
                     "seed": args.seed, "whole_blocks": True, "lookup": False,
                     "gumbel_draws": GUMBEL_DRAWS},
        "seconds": round(time.time() - started, 1),
        "configs": configs,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def summarize(cycles: list[dict]) -> dict:
    """Per rule: the mean acceptance chance at each block position (and how many cycles
    reached it), and the expected tokens per cycle."""
    size = max(len(c["standard"]) for c in cycles)
    per_position: dict[str, list[float | None]] = {}
    expected: dict[str, float] = {}
    for rule in rules():
        alphas = [alpha(c, rule) for c in cycles]
        per_position[rule] = [
            round(statistics.fmean(a[j] for a in alphas if len(a) > j), 4) for j in range(size)]
        runs = []
        for a in alphas:
            run, prod = 1.0, 1.0
            for x in a:
                prod *= x
                run += prod
            runs.append(run)
        expected[rule] = round(statistics.fmean(runs), 3)
    return {"cycles": len(cycles),
            "positions_reached": [sum(len(c["standard"]) > j for c in cycles)
                                  for j in range(size)],
            "q_top_mean": [round(statistics.fmean(c["q_top"][j] for c in cycles
                                                  if len(c["q_top"]) > j), 4)
                           for j in range(size)],
            "acceptance_by_position": per_position, "expected_tokens_per_cycle": expected}


def alpha(cycle: dict, rule: str) -> list[float]:
    if not rule.startswith("hybrid@"):
        return cycle[rule]
    c = float(rule.split("@")[1])
    return [g if top >= c else s for g, s, top in zip(cycle["greedy"], cycle["standard"],
                                                      cycle["q_top"])]


if __name__ == "__main__":
    sys.exit(main())
