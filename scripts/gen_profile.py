"""Where batched answer generation's time goes (training data), in one run.

    python scripts/gen_profile.py [--model ID] [--dtype bfloat16] [--json PATH] [--quick]

Sections of the report (each answers one hypothesis about the slow decode steps):
  sdpa        one layer's attention at [B, H, 1, L] over KV views of a step-256 cache, ms per
              call: MLX's fused kernel without a mask (the floor), with the left-padding mask
              (MLX's CUDA kernels take no array mask: its unfused ops run), engine's
              grouped_sdpa, and the two products of each unfused path alone
  model_step  whole decode steps: equal rows in a plain cache, a BatchKVCache without
              padding, half the rows padded by L/2 (mlx attention and grouped attention),
              queued back to back and (_synced) each after the last
  running     answer_running end to end on real prompts (benchmarks/stage5 data) for a time
              budget each: grouped attention with each step queued after the last
              (in_place) and back to back, back to back at twice the width, and mlx
              attention back to back (the old loop): tokens/s and its seconds by kind
              (decode, sync, check, loops, drop, fill), the drops' and fills' cache work
              evaluated where it happens
  cache       (last; widest batch, shorter context) update_and_fetch on every layer per
              step: alone, with a fused read of each layer's keys and values (steps queued
              back to back, or each after the last), and the read alone. A cache copied on
              every update (no buffer donation: a queued step still reads it) costs its
              whole size per step, and peak memory shows the copies in flight
The JSON names the machine, the versions and the MLX wheels; "summary" puts the deciding
numbers side by side (per decode step of the widest, longest shape). How to read it:
  attention_ms_per_step fused_boolmask >> fused_nomask: the mask's unfused path is the cost
      (then step_ms masked >> plain too); grouped_mask near fused_nomask: --gen-attention
      grouped fixes it; unfused_values alone large: the broadcast batched product
  cache_ms_per_step update_read well above update_read_synced (by about
      cache_copy_estimate_ms), step_peak_gb of queued ways above step_cache_gb: steps queued
      back to back copy the whole cache on every update (no buffer donation);
      RunningBatch(in_place=True) avoids it
  running tokens_per_s: grouped_in_place vs grouped (back to back) vs grouped_<2W>_rows (a
      step's fixed cost shared by twice the rows) vs mlx (the old loop); in the stage-31
      profile's decode steps grouped attention queued back to back was the fastest way, and
      that session answered that way at 1,536 rows; share: decode (building + queueing
      steps) >> sync: Python-bound; loops,
      check, drop or fill large: the GPU waits on that work between chunks of steps
On an H200 (bf16, 30 layers, widths 256/768, contexts 480/1480, 6 timed steps) the stage-31
run took 59 s (benchmarks/stage31/gen-profile-bf16-h200.json); the end-to-end part now runs
four ways of 12 s each plus their last chunk.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import engine  # noqa: E402, F401  (before MLX: its CPU BLAS, engine/blas.py)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "benchmarks" / "stage5" / "data-5-0.npz"


def kv_shape(model) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) of the target's attention."""
    from engine.targets.base import text_args

    args = text_args(model)
    heads = args.num_attention_heads
    kv = getattr(args, "num_key_value_heads", None) or heads
    return heads, kv, getattr(args, "head_dim", None) or args.hidden_size // heads


def timed(fn, reps: int, synced: bool = False) -> float:
    """ms per call of `fn` (-> arrays), `reps` calls queued back to back after two warm-ups;
    `synced`: each call queued once the one before has finished (its graph built meanwhile),
    as RunningBatch(in_place=True) does."""
    import mlx.core as mx

    for _ in range(2):
        mx.eval(fn())
    start = time.perf_counter()
    outs = []
    for _ in range(reps):
        outs.append(fn())
        if synced:
            mx.synchronize()
        mx.async_eval(outs[-1])
    mx.eval(outs)
    return (time.perf_counter() - start) / reps * 1e3


def filled_cache(model, width: int, ctx: int, pads: list[int] | None, dtype):
    """Per-layer caches holding `ctx` random positions per row, as a prefill leaves them
    (capacity in steps of 256). pads=None: mlx-lm's plain KVCache (no mask); else a
    BatchKVCache with that left padding per row."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.train.generate import left_padded_cache

    caches = make_prompt_cache(model) if pads is None else left_padded_cache(model, pads)
    shape = (width, kv_shape(model)[1], ctx, kv_shape(model)[2])
    for c in caches:
        c.update_and_fetch(mx.random.normal(shape).astype(dtype),
                           mx.random.normal(shape).astype(dtype))
        mx.eval(c.keys, c.values)
    return caches


def sdpa_row(n_heads: int, n_kv: int, head_dim: int, width: int, ctx: int, reps: int,
             dtype) -> dict:
    import mlx.core as mx

    from engine.train.generate import grouped_sdpa

    scale = head_dim ** -0.5
    cap = (ctx + 255) // 256 * 256
    q = mx.random.normal((width, n_heads, 1, head_dim)).astype(dtype)
    kb = mx.random.normal((width, n_kv, cap, head_dim)).astype(dtype)
    vb = mx.random.normal((width, n_kv, cap, head_dim)).astype(dtype)
    k, v = kb[..., :ctx, :], vb[..., :ctx, :]  # the views a cache hands attention
    pads = mx.array([ctx // 2 if i % 2 else 0 for i in range(width)])
    mask = (pads[:, None, None, None] <= mx.arange(ctx)[None])  # [B, 1, 1, L]
    additive = mx.where(mask, 0.0, -mx.inf).astype(dtype)
    r = n_heads // n_kv
    q5 = (q * scale).reshape(width, n_kv, r, 1, head_dim)  # MLX's unfused layout
    p5 = mx.softmax(q5 @ k[:, :, None].swapaxes(-1, -2), axis=-1)
    qg = (q * scale).reshape(width, n_kv, r, head_dim)  # grouped layout
    pg = mx.softmax(qg @ k.swapaxes(-1, -2), axis=-1)
    mx.eval(q, kb, vb, mask, additive, q5, p5, qg, pg)
    sdpa = mx.fast.scaled_dot_product_attention
    ways = {
        "fused_nomask": lambda: sdpa(q, k, v, scale=scale),
        "fused_boolmask": lambda: sdpa(q, k, v, scale=scale, mask=mask),
        "fused_addmask": lambda: sdpa(q, k, v, scale=scale, mask=additive),
        "grouped_mask": lambda: grouped_sdpa(q, k, v, scale, mask),
        "grouped_nomask": lambda: grouped_sdpa(q, k, v, scale, None),
        # the products alone: scores (a 1-row product per query head, each KV head
        # broadcast to its query heads) and weighted values, MLX's unfused layout vs grouped
        "unfused_scores": lambda: q5 @ k[:, :, None].swapaxes(-1, -2),
        "unfused_values": lambda: p5 @ v[:, :, None],
        "grouped_scores": lambda: qg @ k.swapaxes(-1, -2),
        "grouped_values": lambda: pg @ v,
    }
    row = {"width": width, "context": ctx, "capacity": cap}
    for name, fn in ways.items():
        row[f"{name}_ms"] = round(timed(fn, reps), 4)
    row["fused_boolmask_vs_nomask"] = round(
        row["fused_boolmask_ms"] / max(row["fused_nomask_ms"], 1e-9), 2)
    kv_bytes = 2 * width * n_kv * ctx * head_dim * q.itemsize
    for way in ("fused_nomask", "fused_boolmask", "grouped_mask"):
        row[f"{way}_kv_gb_per_s"] = round(kv_bytes / max(row[f"{way}_ms"], 1e-9) / 1e6, 1)
    return row


def cache_row(model, width: int, ctx: int, steps: int, dtype) -> dict:
    """update_and_fetch on every layer per step, the steps queued like decoding's."""
    import mlx.core as mx

    n_heads, _, head_dim = kv_shape(model)
    scale = head_dim ** -0.5
    pads = [ctx // 2 if i % 2 else 0 for i in range(width)]
    caches = filled_cache(model, width, ctx, pads, dtype)
    kshape = caches[0].keys.shape
    new = mx.random.normal((width, kshape[1], 1, kshape[3])).astype(dtype)
    q = mx.random.normal((width, n_heads, 1, kshape[3])).astype(dtype)
    mx.eval(new, q)
    sdpa = mx.fast.scaled_dot_product_attention

    # each call's result is a new small array: a view of the cache kept alive would itself
    # stop MLX from updating the buffer in place (as a queued step that reads it does:
    # "update_read" queues steps back to back, "update_read_synced" each after the last)
    def update():
        return [c.update_and_fetch(new, new)[0][:, 0, -1, 0] * 1 for c in caches]

    def update_read():
        return [sdpa(q, *c.update_and_fetch(new, new), scale=scale) for c in caches]

    def read():  # views taken per call: held between calls, they would block the updates
        return [sdpa(q, *c.keys_and_values(), scale=scale) for c in caches]

    row = {"width": width, "context": ctx, "layers": len(caches)}
    # queued back to back last: if copies pile up, the other numbers are in already
    for name, fn, synced in (("read", read, False), ("update_read_synced", update_read, True),
                             ("update", update, False), ("update_read", update_read, False)):
        mx.reset_peak_memory()
        row[f"{name}_ms_per_step"] = round(timed(fn, steps, synced), 3)
        row[f"{name}_peak_gb"] = round(mx.get_peak_memory() / 1e9, 2)
    cache_bytes = sum(c.keys.nbytes + c.values.nbytes for c in caches)
    row["cache_gb"] = round(cache_bytes / 1e9, 3)
    # a full copy (read + write) of every layer's cache at 3 TB/s would take:
    row["copy_all_ms_at_3tb_per_s"] = round(2 * cache_bytes / 3e12 * 1e3, 3)
    return row


def each_shape(section: str, widths: list[int], contexts: list[int], one) -> list[dict]:
    import mlx.core as mx

    rows = []
    for width in widths:
        for ctx in contexts:
            rows.append(one(width, ctx))
            print(section, json.dumps(rows[-1]), flush=True)
            mx.clear_cache()
    return rows


def model_step_row(model, width: int, ctx: int, steps: int, dtype, vocab: int) -> dict:
    """ms per whole decode step (sampling included) of `width` rows over `ctx` positions."""
    import mlx.core as mx

    from engine.targets import adapter_for
    from engine.train.generate import decode_logits

    target = adapter_for(model)
    half = [ctx // 2 if i % 2 else 0 for i in range(width)]
    row = {"width": width, "context": ctx}
    for name, pads, attention, synced in (
            ("plain_synced", None, "mlx", True), ("half_padded_synced", half, "mlx", True),
            ("half_padded_grouped_synced", half, "grouped", True),
            ("plain", None, "mlx", False), ("masked", [0] * width, "mlx", False),
            ("half_padded", half, "mlx", False), ("half_padded_grouped", half, "grouped", False)):
        cache = filled_cache(model, width, ctx, pads, dtype)
        tok = mx.random.randint(0, vocab, (width,))

        def one(tok=tok, cache=cache, attention=attention):
            return mx.argmax(decode_logits(model, tok, cache, attention, target), -1)

        mx.reset_peak_memory()
        ms = timed(one, steps, synced)
        row[f"{name}_ms"] = round(ms, 3)
        row[f"{name}_tokens_per_s"] = round(width / ms * 1e3, 1)
        row[f"{name}_peak_gb"] = round(mx.get_peak_memory() / 1e9, 2)
        if name == "plain_synced":
            row["cache_gb"] = round(sum(c.keys.nbytes + c.values.nbytes for c in cache) / 1e9, 2)
        del cache, one
        mx.clear_cache()
    return row


def load_prompts(path: Path | None, n: int, vocab: int, median: int = 80,
                 seed: int = 0) -> tuple[list, str]:
    """`n` prompts: those of a dataset file (real prompts, real answer lengths), else random
    tokens with chat-like lengths (log-normal around `median` tokens, 2..1536)."""
    import numpy as np

    from engine.train.dataset import Dataset

    if path is not None and path.is_file():
        data = Dataset.load(path)
        prompts = [s[:p] for s, p in zip(data.sequences, data.prompt_lens)]
        rng = np.random.default_rng(seed)
        pick = rng.permutation(len(prompts))[:n]
        return [prompts[i] for i in pick], str(path.relative_to(ROOT) if path.is_relative_to(
            ROOT) else path)
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median), 0.8, n), 2, 1536).astype(int)
    return [rng.integers(0, vocab, k).tolist() for k in lengths], "random tokens"


def running_rows(model, eos: set[int], prompts: list[list[int]], width: int, max_new: int,
                 seconds: float | None) -> list[dict]:
    import mlx.core as mx

    from engine.train.generate import answer_running, running_order

    rows = []
    # grouped attention at `width` each step after the last and back to back, then back to
    # back at twice the width (a step's fixed cost, shared by more rows); the old loop (mlx
    # attention back to back) last: if its cache copies pile up, the others are in already
    for attention, in_place, rows_wide in (("grouped", True, width), ("grouped", False, width),
                                           ("grouped", False, 2 * width), ("mlx", False, width)):
        mx.reset_peak_memory()
        stats: dict = {}
        answers = answer_running(model, prompts, max_new, eos, rows_wide, seconds,
                                 stop_loops=True, order=running_order(prompts, rows_wide),
                                 attention=attention, stats=stats, eager=True,
                                 in_place=in_place)
        tokens = sum(len(a) for a in answers.values())
        wall = stats["wall"]
        counts = stats["counts"]
        row = {"attention": attention, "in_place": in_place, "width": rows_wide,
               "max_new": max_new,
               "answers": len(answers), "tokens": tokens, "wall_s": round(wall, 2),
               "tokens_per_s": round(tokens / wall, 1),
               "ms_per_step": round(1e3 * (stats["seconds"]["decode"] + stats["seconds"][
                   "sync"]) / max(counts["steps"], 1), 3),
               "mean_rows": round(counts["row_steps"] / max(counts["steps"], 1), 1),
               "seconds": {k: round(v, 3) for k, v in stats["seconds"].items()},
               "share": {k: round(v / wall, 3) for k, v in stats["seconds"].items()},
               "counts": counts, "peak_gb": round(mx.get_peak_memory() / 1e9, 2)}
        rows.append(row)
        print("running", json.dumps(row), flush=True)
    return rows


def wheels() -> dict:
    """Installed MLX and CUDA library wheels: which cuBLAS/cuDNN the MLX build loads."""
    from importlib import metadata

    out = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().startswith(("mlx", "nvidia-")):
            out[name] = dist.version
    return dict(sorted(out.items()))


def profile(model_id: str | None, dtype: str, widths: list[int], contexts: list[int],
            steps: int, sdpa_reps: int = 20, running_width: int = 768,
            running_prompts: int = 6144, max_new: int = 1024,
            running_seconds: float | None = 12.0, prompts_file: Path | None = PROMPTS,
            prompt_median: int = 80, json_path: Path | None = None) -> dict:
    import os

    import mlx.core as mx

    from engine.bench.environment import machine_info, versions
    from engine.loading import load_target
    from engine.registry import DEFAULT_TARGET
    from engine.targets import adapter_for
    from engine.targets.base import text_model

    t0 = time.perf_counter()
    model, tokenizer, name = load_target(model_id or DEFAULT_TARGET, dtype)
    vocab = adapter_for(model).vocab_size
    mx_dtype = getattr(mx, dtype)
    heads, kv_heads, head_dim = kv_shape(model)
    layers = len(text_model(model).layers)
    prompts, source = load_prompts(prompts_file, running_prompts, vocab, prompt_median)
    report = {"command": "python scripts/gen_profile.py " + shlex.join(sys.argv[1:]),
              "model": name, "dtype": dtype, "steps": steps, "machine": machine_info(),
              "versions": versions(), "wheels": wheels(),
              "env": {k: v for k, v in os.environ.items() if k.startswith("MLX_")},
              "shape": {"layers": layers, "heads": heads, "kv_heads": kv_heads,
                        "head_dim": head_dim},
              "running_prompts": {"source": source, "count": len(prompts),
                                  "mean_len": round(sum(map(len, prompts)) / len(prompts), 1)}}
    report["load_s"] = round(time.perf_counter() - t0, 2)
    sections = (
        ("sdpa", lambda: each_shape("sdpa", widths, contexts, lambda w, c: sdpa_row(
            heads, kv_heads, head_dim, w, c, sdpa_reps, mx_dtype))),
        ("model_step", lambda: each_shape("model_step", widths, contexts, lambda w, c:
                                          model_step_row(model, w, c, steps, mx_dtype, vocab))),
        ("running", lambda: running_rows(model, set(tokenizer.eos_token_ids), prompts,
                                         running_width, max_new, running_seconds)),
        # last, at the shorter context only: steps queued back to back may pile up copies
        ("cache", lambda: each_shape("cache", widths[-1:], contexts[:1], lambda w, c: cache_row(
            model, w, c, steps, mx_dtype))),
    )
    report["section_s"] = {}
    for key, run in sections:
        t = time.perf_counter()
        try:
            report[key] = run()
        except Exception as exc:  # one failing section must not cost the others' numbers
            report[key] = {"error": f"{type(exc).__name__}: {exc}"}
            print(key, "failed:", report[key]["error"], flush=True)
        report["section_s"][key] = round(time.perf_counter() - t, 2)
        if json_path is not None:  # after every section: a crash later keeps these numbers
            json_path.write_text(json.dumps(report, indent=1))
    report["summary"] = summary(report)
    report["total_s"] = round(time.perf_counter() - t0, 2)
    return report


def summary(report: dict) -> dict:
    """The few numbers that decide issue 12, from the widest and longest shape measured:
    per decode step (all layers), what the padding mask costs in attention and in a whole
    step, what grouped attention saves, whether cache updates cost a copy of the cache, and
    the end-to-end rates."""
    out: dict = {}

    def pick(rows: list[dict]) -> dict:
        return max(rows, key=lambda r: (r["width"], r["context"]))

    layers = report["shape"]["layers"]
    if isinstance(report.get("sdpa"), list) and report["sdpa"]:
        r = pick(report["sdpa"])
        out["attention_ms_per_step"] = {k: round(r[f"{k}_ms"] * layers, 2) for k in (
            "fused_nomask", "fused_boolmask", "grouped_mask", "unfused_scores",
            "unfused_values", "grouped_scores", "grouped_values")}
        out["attention_shape"] = [r["width"], r["context"]]
    if isinstance(report.get("model_step"), list) and report["model_step"]:
        r = pick(report["model_step"])
        out["step_ms"] = {k[:-3]: v for k, v in r.items() if k.endswith("_ms")}
        out["step_peak_gb"] = {k[:-8]: v for k, v in r.items() if k.endswith("_peak_gb")}
        out["step_cache_gb"] = r.get("cache_gb")
        out["step_shape"] = [r["width"], r["context"]]
    if isinstance(report.get("cache"), list) and report["cache"]:
        r = pick(report["cache"])
        out["cache_ms_per_step"] = {k[:-12]: v for k, v in r.items()
                                    if k.endswith("_ms_per_step")}
        out["cache_copy_estimate_ms"] = r["copy_all_ms_at_3tb_per_s"]
    if isinstance(report.get("running"), list):
        narrow = min(r["width"] for r in report["running"])
        runs = {r["attention"] + ("_in_place" if r["in_place"] else "")
                + ("" if r["width"] == narrow else f"_{r['width']}_rows"): r
                for r in report["running"]}
        out["running_tokens_per_s"] = {k: r["tokens_per_s"] for k, r in runs.items()}
        out["running_share"] = {k: r["share"] for k, r in runs.items()}
        out["running_peak_gb"] = {k: r["peak_gb"] for k, r in runs.items()}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="target id or folder (default: the offline default)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--widths", default="256,768", help="rows per batch, comma-separated")
    p.add_argument("--contexts", default="480,1480",
                   help="KV positions per row (under a multiple of 256 by more than the timed "
                        "steps add: no reallocation of the cache inside a timing)")
    p.add_argument("--steps", type=int, default=6, help="timed decode steps per shape")
    p.add_argument("--running-seconds", type=float, default=12.0,
                   help="time budget of each end-to-end run")
    p.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args()
    path = Path(a.json) if a.json else None
    if a.quick:
        report = profile(a.model, a.dtype, [2, 3], [8], steps=2, sdpa_reps=2, running_width=4,
                         running_prompts=12, max_new=8, running_seconds=None, prompts_file=None,
                         prompt_median=12, json_path=path)
    else:
        report = profile(a.model, a.dtype, [int(x) for x in a.widths.split(",")],
                         [int(x) for x in a.contexts.split(",")], a.steps,
                         running_seconds=a.running_seconds, json_path=path)
    if path is not None:
        path.write_text(json.dumps(report, indent=1))
    print(f"total {report['total_s']} s; sections {report['section_s']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
