"""Multi-turn time to first token with conversation-state reuse (issue #14's benchmark).

    python scripts/multiturn_bench.py --json benchmarks/smollm2-multiturn-cpu.json

Two parts, one process, the offline default pair unless --model / --draft say otherwise:
1. MT-Bench's two-turn questions: turn 1 is answered (filling the cache), then turn 2's
   prompt (turn 1, its answer, the follow-up) is timed twice: resumed from the cache, and
   after rt.clear_cache() as a fresh prefill. Both must give the same tokens (lossless).
2. One long conversation (MT-Bench first turns as user messages, the model's answers fed
   back) until it holds --long-tokens tokens or --long-turns turns: each turn's TTFT with
   reuse, and the last turn's fresh-prefill TTFT for scale. Done when the last turn's TTFT
   is within 1.5x of the first turn's.

Timings on a busy machine are noise: run it alone. Reuse removes the re-reading of the
history, not the new tokens' attention over it: on CPU that attention (new x cached scores
per head and layer, bound by MLX's scalar exp) grows with the conversation. The JSON lists
each turn's prefilled tokens so the two are told apart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def main() -> int:
    from engine.blas import ensure_fast_blas

    ensure_fast_blas(sys.argv)
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
    p.add_argument("--json", metavar="PATH", help="write the report here")
    args = p.parse_args()

    import mlx.core as mx

    from engine.device import current as current_backend
    from engine.runtime import DFlashRuntime

    path = find_mt_bench(args.data_dir)
    questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    questions = [q for q in questions if len(q.get("turns", [])) >= 2]
    rt = DFlashRuntime.from_pretrained(args.model, args.draft)
    rt.generate("Hello", max_tokens=4)  # warm-up: first-call costs are not the cache's
    report = {
        "command": "python scripts/multiturn_bench.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "backend": current_backend(), "mlx": mx.__version__,
                    "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
                    "blas_preload": os.environ.get("LD_PRELOAD")},
        "pair": rt.describe(),
        "prompt_cache_bytes": rt.prompt_cache.max_bytes,
    }
    if not args.skip_two_turn:
        report["mt_bench_two_turn"] = two_turn(rt, questions[: args.limit], args.max_tokens,
                                               args.probe_tokens)
    if not args.skip_long:
        report["long_conversation"] = long_conversation(
            rt, questions, args.long_turns, args.long_tokens, args.long_max_tokens)
    if hasattr(os, "getloadavg"):  # other work during the run shows here
        report["machine"]["load_average_after"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
