"""Multi-turn time to first token with conversation-state reuse (issue #14's benchmark).

    python scripts/multiturn_bench.py --limit 10 --json benchmarks/smollm2-multiturn-cpu.json

Three parts, one process, the offline default pair unless --model / --draft say otherwise:
1. MT-Bench's two-turn questions: turn 1 is answered (filling the cache), then turn 2's
   prompt (turn 1, its answer, the follow-up) is timed twice: resumed from the cache, and
   after rt.clear_cache() as a fresh prefill. Both must give the same tokens (lossless).
2. One long conversation (MT-Bench first turns as user messages, the model's answers fed
   back) of at least --long-turns turns, until it holds --long-tokens tokens. Per turn: the
   prompt, cached and prefilled tokens, how much of the held state the re-rendered prompt
   repeats (a reply that re-tokenizes differently would show here), the TTFT, and the TTFT
   of the same new tokens alone (no history, no cache); then the last turn's fresh-prefill
   TTFT for scale. Done when the last turn's TTFT is within 1.5x of the first turn's.
3. The history's cost: a 64-token prefill over 0..4,000 tokens of (random) KV history, and
   MLX's elementwise exp against numpy's: reuse removes the re-reading of the history, not
   the new tokens' attention over it, which on CPU MLX computes unfused with a scalar exp.

Timings on a busy machine are noise: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def find_mt_bench(explicit: str | None) -> Path:
    """--data-dir, $DFLASH_EVAL_DATA, the packaged suites, or ../shared/data."""
    candidates = [Path(explicit).expanduser()] if explicit else []
    if os.environ.get("DFLASH_EVAL_DATA"):
        candidates.append(Path(os.environ["DFLASH_EVAL_DATA"]).expanduser())
    candidates += [ROOT / "engine" / "bench" / "data" / "suites", ROOT.parent / "shared" / "data",
                   Path.cwd().parent / "shared" / "data"]
    for folder in candidates:
        if (folder / "mt_bench.jsonl").is_file():
            return folder / "mt_bench.jsonl"
    sys.exit("multiturn_bench: mt_bench.jsonl not found in " + ", ".join(map(str, candidates))
             + ". Fix: pass --data-dir FOLDER.")


def two_turn(rt, questions: list[dict], max_tokens: int, probe_tokens: int) -> dict:
    rows = []
    for q in questions:
        rt.clear_cache()
        messages = [{"role": "user", "content": q["turns"][0]}]
        first = rt.generate(messages, max_tokens=max_tokens)
        messages += [{"role": "assistant", "content": first.text},
                     {"role": "user", "content": q["turns"][1]}]
        reused = rt.generate(messages, max_tokens=probe_tokens)
        rt.clear_cache()
        fresh = rt.generate(messages, max_tokens=probe_tokens)
        rows.append({
            "question_id": q.get("question_id"), "turn1_prompt_tokens": first.prompt_tokens,
            "turn1_reply_tokens": first.total_tokens, "turn1_ttft_s": first.ttft_s,
            "turn2_prompt_tokens": reused.prompt_tokens,
            "turn2_cached_tokens": reused.cached_tokens,
            "turn2_ttft_reuse_s": reused.ttft_s, "turn2_ttft_fresh_s": fresh.ttft_s,
            "same_tokens": reused.tokens == fresh.tokens,
        })
        print(f"q{q.get('question_id')}: turn 2 {reused.prompt_tokens} tokens "
              f"({reused.cached_tokens} cached): ttft {reused.ttft_s * 1000:.0f} ms reused, "
              f"{fresh.ttft_s * 1000:.0f} ms fresh", file=sys.stderr)
    reuse = statistics.median(r["turn2_ttft_reuse_s"] for r in rows)
    fresh = statistics.median(r["turn2_ttft_fresh_s"] for r in rows)
    return {
        "questions": len(rows),
        "median_turn2_prompt_tokens": statistics.median(r["turn2_prompt_tokens"] for r in rows),
        "median_turn2_cached_tokens": statistics.median(r["turn2_cached_tokens"] for r in rows),
        "median_turn2_ttft_reuse_s": reuse, "median_turn2_ttft_fresh_s": fresh,
        "median_speedup": fresh / reuse if reuse else None,
        "all_same_tokens": all(r["same_tokens"] for r in rows),
        "rows": rows,
    }


def long_conversation(rt, questions: list[dict], turns: int, target_tokens: int,
                      max_tokens: int) -> dict:
    """Turns until the conversation holds `target_tokens` (at least `turns` turns). Each turn
    also times its prefilled tokens alone (the same ids, no history, no cache): the gap is
    what attending to the history costs the new tokens; the reuse itself reads nothing."""
    from dataclasses import replace

    from engine.runtime import DFlashRuntime

    bare = DFlashRuntime(rt.model, rt.tokenizer, rt.draft,
                         replace(rt.config, prompt_cache_bytes=0), rt.target_id, rt.draft_id,
                         rt.target, rt.token_ranking)
    rt.clear_cache()
    messages: list[dict] = []
    rows = []
    for i in range(turns * 3):  # short answers: more turns until the conversation is long
        messages.append({"role": "user", "content": questions[i % len(questions)]["turns"][0]})
        ids = rt.encode(messages)
        # the tokens the most recent state holds: the previous prompt and reply as generated
        held = rt.prompt_cache.tokens()[-1] if len(rt.prompt_cache) else []
        result = rt.generate(ids, max_tokens=max_tokens)
        new = ids[result.cached_tokens:]
        alone = bare.generate(new, max_tokens=1)
        rows.append({
            "turn": i + 1, "prompt_tokens": result.prompt_tokens,
            "cached_tokens": result.cached_tokens,
            "prefilled_tokens": len(new),
            # how much of the held state the re-rendered prompt repeats token for token (a
            # reply that tokenizes differently once re-rendered would cut the reuse short)
            "history_tokens": len(held), "history_matching": _common(held, ids),
            "ttft_s": result.ttft_s, "ttft_prefilled_alone_s": alone.ttft_s,
            "reply_tokens": len(result.tokens), "finish_reason": result.finish_reason,
        })
        print(f"turn {i + 1}: {result.prompt_tokens} prompt tokens ({result.cached_tokens} "
              f"cached), ttft {result.ttft_s * 1000:.0f} ms; its {len(new)} new tokens alone "
              f"{alone.ttft_s * 1000:.0f} ms", file=sys.stderr)
        messages.append({"role": "assistant", "content": result.text})
        if i + 1 >= turns and result.prompt_tokens + len(result.tokens) >= target_tokens:
            break
    rt.clear_cache()
    fresh = rt.generate(messages[:-1], max_tokens=4)  # the last turn's prompt again, fresh
    first, last = rows[0], rows[-1]
    ratio = last["ttft_s"] / first["ttft_s"]
    return {
        "turns": rows, "conversation_tokens": last["prompt_tokens"] + last["reply_tokens"],
        "last_turn": last["turn"], "last_turn_prompt_tokens": last["prompt_tokens"],
        "first_turn_ttft_s": first["ttft_s"], "last_turn_ttft_s": last["ttft_s"],
        "last_turn_ttft_fresh_s": fresh.ttft_s,
        "last_vs_first_ttft": ratio, "within_1_5x": ratio <= 1.5,
        # the same ratio without the history's attention: the last turn's new tokens alone
        "last_alone_vs_first_ttft": last["ttft_prefilled_alone_s"] / first["ttft_s"],
        # every later turn resumed from all of the held state its prompt repeats
        "all_history_reused": all(r["cached_tokens"] >= min(r["history_matching"],
                                                            r["prompt_tokens"] - 1)
                                  for r in rows[1:]),
    }


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def history_cost(rt, new: int = 64, histories: tuple[int, ...] = (0, 1000, 2000, 4000)
                 ) -> dict:
    """What a turn's new tokens cost over a history of each length: one prefill forward of
    `new` tokens on top of KV caches holding that many (random) tokens: the cost depends
    only on the shapes. Then MLX's elementwise exp against numpy's, per element: the CPU
    softmax's share of attention. Attention-only targets (KV caches) only."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import KVCache

    cache = rt.target.make_cache()
    if not all(type(c) is KVCache for c in cache):
        return {"skipped": "the target has non-attention layers"}
    args = rt.target.args
    dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    heads = args.num_key_value_heads
    ids = mx.array([list(range(100, 100 + new))])
    rows = []
    for n in histories:
        cache = rt.target.make_cache()
        if n:
            for c in cache:
                c.keys, c.values = (mx.random.normal((1, heads, n, dim)) for _ in "kv")
                c.offset = n
            mx.eval([c.keys for c in cache], [c.values for c in cache])

        def step(cache=cache):
            logits, _ = rt.target.forward(ids, cache, [], last_only=True)
            mx.eval(logits)
            for c in cache:
                c.trim(new)

        rows.append({"history_tokens": n, "new_tokens": new, "prefill_s": _best(step)})
    x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
    y = mx.array(x)
    mx.eval(y)
    return {
        "rows": rows,
        "ms_per_new_token_per_1000_history": 1000 * (rows[-1]["prefill_s"] - rows[0]["prefill_s"])
        / new / (histories[-1] / 1000),
        "mlx_exp_ns_per_element": 1e9 * _best(lambda: mx.eval(mx.exp(y))) / x.size,
        "numpy_exp_ns_per_element": 1e9 * _best(lambda: np.exp(x)) / x.size,
    }


def _best(fn, repeat: int = 3) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    import engine  # noqa: F401  (loads the fast BLAS before MLX)

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--draft", default=None)
    p.add_argument("--data-dir", default=None, help="folder holding mt_bench.jsonl")
    p.add_argument("--limit", type=int, default=20, help="MT-Bench questions (of 80)")
    p.add_argument("--max-tokens", type=int, default=128, help="turn-1 answer length")
    p.add_argument("--probe-tokens", type=int, default=8,
                   help="tokens generated by each timed turn-2 request")
    p.add_argument("--long-turns", type=int, default=10,
                   help="at least this many turns (more while under --long-tokens)")
    p.add_argument("--long-tokens", type=int, default=4000)
    p.add_argument("--long-max-tokens", type=int, default=400, help="answer length per turn")
    p.add_argument("--skip-long", action="store_true", help="MT-Bench two-turn part only")
    p.add_argument("--skip-two-turn", action="store_true", help="long conversation only")
    p.add_argument("--skip-history-cost", action="store_true",
                   help="skip timing new tokens over a history of each length")
    p.add_argument("--json", metavar="PATH", help="write the report here")
    args = p.parse_args()


    from engine.bench.environment import environment
    from engine.runtime import DFlashRuntime

    path = find_mt_bench(args.data_dir)
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    questions = [q for q in questions if len(q.get("turns", [])) >= 2]
    rt = DFlashRuntime.from_pretrained(args.model, args.draft)
    rt.generate("Hello", max_tokens=4)  # warm-up: first-call costs are not the cache's
    report = {
        "command": "python scripts/multiturn_bench.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **environment(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "pair": rt.describe(),
        "prompt_cache_bytes": rt.prompt_cache.max_bytes,
    }
    if not args.skip_two_turn:
        report["mt_bench_two_turn"] = two_turn(rt, questions[: args.limit], args.max_tokens,
                                               args.probe_tokens)
    if not args.skip_long:
        report["long_conversation"] = long_conversation(
            rt, questions, args.long_turns, args.long_tokens, args.long_max_tokens)
    if not args.skip_history_cost:
        report["history_cost"] = history_cost(rt)
    if hasattr(os, "getloadavg"):  # other work during the run shows here
        report["load_average_after"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
