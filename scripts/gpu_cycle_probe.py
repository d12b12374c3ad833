"""Where a speculative cycle's time goes on a GPU, per precision (issue #13).

    OUT=/tmp/out timeout 360 python scripts/gpu_cycle_probe.py  # the H200 run: 3-4 minutes
    python scripts/gpu_cycle_probe.py --small --out /tmp/p.json --model DIR --draft DIR  # CPU
    # host cost per cycle phase, the GPU's weights and dtypes built on a CPU (a minute):
    nice -n 19 python scripts/gpu_cycle_probe.py --parts host \
        --precisions checkpoint-gpu,float32 --out benchmarks/host-cost-cpu.json
    # (benchmarks/host-cost-cpu-before.json: the same at commit 846c07b, 30 iterations)

Writes $OUT/gpu_cycle_probe.json (or --out). Each part is timed and caught on its own (a failure
is recorded, never stops the run) and skipped once --budget seconds are spent:
  sdpa     mx.fast.scaled_dot_product_attention at the pair's attention shapes, query length 1
           and 16, the key length fixed vs new on every call (every cycle has a new one), first
           call vs steady state, per dtype; and the same attention written out (matmul +
           softmax). A per-shape build (cuDNN graph, JIT) shows as varying >> fixed.
  forward  the target's verify forward as the cycle runs it, at a growing KV length: T=16 and
           T=1 per call, a fixed KV length (rolled back), a varying T; the dtypes of logits,
           taps and draft output (a promotion shows here).
  pieces   (not in the default --parts) each piece of the target's decoder layers (norm,
           q/k/v/o projections, RoPE, attention through the engine and through MLX, MLP) at 1
           and 16 new tokens, every layer's piece evaluated together: what a verify pays
           beyond a plain step, piece by piece (llama-style attention only).
  split    (not in the default --parts) a verify forward taken apart: the whole forward at
           T=16 and T=1, T=16 with the head on its last row only, the head alone at 16 and 1
           rows, mlx-lm's own model call at both; each built first and then evaluated (the
           device's time) and built and evaluated together (wall), the KV cache rolled back
           after each: where a 16-token verify's time goes beyond the layers' pieces
  cycle    the real pair through DFlashRuntime per precision: per-phase device times
           (profile=True), per-cycle wall times (first cycles vs steady), tok/s for whole
           blocks and the verify cut, and mlx_lm's generate_step on the same weights.
  host     per phase of a cycle (draft, verify, accept, rollback) and for mlx-lm's own step
           (plain1) and 16-token call (plain16): graph nodes, Python calls, host build time
           without eval and, on a GPU, the async_eval launch time (host_part).
  children (CUDA, or --child-test) the same again in a child process per --child-envs entry
           (MLX reads these once, at first use): by default MLX_CUDA_USE_CUDNN_SDPA=0 (the
           engine's default since issue 13: sdpa and the bf16/checkpoint cycles) and
           MLX_USE_CUDA_GRAPHS=0 (the bf16 cycle). This process runs with cuDNN SDPA on
           (MLX's default) unless the environment says otherwise.
Precisions: float32, bfloat16, float16 (weights dequantized to that dtype), checkpoint (the
default policy: the GGUF's 4-bit blocks with float16 activations on a GPU, float32 on CPU),
checkpoint-gpu (the GPU's policy on any device),
q-bfloat16 (the GGUF's 4-bit blocks with bfloat16 activations; the offline SmolLM2 only).
"""

from __future__ import annotations

import argparse
import collections
import gc
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# This process measures MLX's own defaults (the engine turns cuDNN SDPA off on import);
# the children measure each setting of --child-envs.
os.environ.setdefault("MLX_CUDA_USE_CUDNN_SDPA", "1")

import engine  # noqa: E402,F401,I001  (first: the fast CPU BLAS)
import mlx.core as mx  # noqa: E402,I001
from mlx.utils import tree_flatten  # noqa: E402

PROMPTS = ["Write a Python function that checks whether a number is prime, and explain it.",
           "Tom has 3 boxes with 12 apples each. He gives away 7 apples. How many are left?"]
START = time.perf_counter()
SAVE: list[Callable[[], None]] = []  # writes the report so far (a killed run keeps its parts)


def left(budget: float) -> float:
    return budget - (time.perf_counter() - START)


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def ms(xs: list[float]) -> dict:
    """First call, median and max of the rest, in ms."""
    rest = xs[1:] or xs
    return {"first_ms": xs[0] * 1e3 if xs else None, "median_ms": med(rest) and med(rest) * 1e3,
            "max_ms": max(rest) * 1e3 if rest else None, "n": len(xs)}


def eval_time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - start


def guarded(out: dict, key: str, budget: float, fn: Callable[..., Any], *args: Any) -> None:
    if left(budget) <= 0:
        out[key] = {"skipped": "budget spent"}
        return
    began = time.perf_counter()
    try:
        out[key] = fn(*args)
    except Exception as exc:  # a probe records what broke and goes on
        out[key] = {"error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-2000:]}
    print(f"[{time.perf_counter() - START:6.1f}s] {key} done in "
          f"{time.perf_counter() - began:.1f}s", flush=True)
    for save in SAVE:
        save()


# -- sdpa -----------------------------------------------------------------------------------
def manual_attention(q: mx.array, k: mx.array, v: mx.array, scale: float,
                     causal: bool) -> mx.array:
    rep = q.shape[1] // k.shape[1]
    k, v = mx.repeat(k, rep, axis=1), mx.repeat(v, rep, axis=1)
    s = (q * scale) @ k.swapaxes(-1, -2)
    if causal:
        qL, kL = q.shape[2], k.shape[2]
        allowed = mx.arange(kL)[None] <= (mx.arange(qL) + kL - qL)[:, None]
        s = mx.where(allowed, s, mx.array(-float("inf"), s.dtype))
    return mx.softmax(s.astype(mx.float32), axis=-1).astype(q.dtype) @ v


def sdpa_part(dtypes: list[str], heads: int, kv_heads: int, dim: int, base: int,
              iters: int) -> dict:
    """Per dtype x query length x mask: times for a fixed and a growing key length."""
    out = {}
    for name in dtypes:
        dt = getattr(mx, name)
        for qL, mask in ((1, None), (16, None), (16, "causal")):
            cap = ((base + qL * iters) // 256 + 1) * 256  # a KV cache buffer, as mlx-lm's
            kbuf = mx.random.normal((1, kv_heads, cap, dim)).astype(dt)
            vbuf = mx.random.normal((1, kv_heads, cap, dim)).astype(dt)
            q = mx.random.normal((1, heads, qL, dim)).astype(dt)
            mx.eval(kbuf, vbuf, q)
            row = {}
            for label, grow in (("fixed_kv", 0), ("growing_kv", qL)):
                for impl in ("fast", "manual"):
                    times = []
                    for i in range(iters):
                        kL = base + grow * i
                        k, v = kbuf[:, :, :kL], vbuf[:, :, :kL]
                        start = time.perf_counter()
                        if impl == "fast":
                            mx.eval(mx.fast.scaled_dot_product_attention(
                                q, k, v, scale=dim ** -0.5, mask=mask))
                        else:
                            mx.eval(manual_attention(q, k, v, dim ** -0.5, mask == "causal"))
                        times.append(time.perf_counter() - start)
                    row[f"{label}_{impl}"] = ms(times)
            out[f"{name}_q{qL}_{mask or 'nomask'}"] = row
    return out


# -- loading --------------------------------------------------------------------------------
def load(precision: str, model_id: str | None, draft_id: str | None) -> Any:
    """A DFlashRuntime at `precision` (see the module docstring)."""
    from engine.config import DFlashConfig
    from engine.loading import load_draft, load_target
    from engine.registry import DEFAULT_TARGET
    from engine.runtime import DFlashRuntime, target_model_dtype
    from engine.targets import adapter_for

    model_id = model_id or DEFAULT_TARGET
    if precision == "q-bfloat16":
        if model_id != DEFAULT_TARGET:
            raise ValueError("q-bfloat16 needs the offline SmolLM2 GGUF")
        from engine.gguf import load_gguf_target
        from engine.offline import smollm2_gguf_path

        model, tok = load_gguf_target(smollm2_gguf_path(), "bfloat16", quantized=True)
    elif precision == "checkpoint-gpu":  # a GPU's weights and dtypes on any device
        model, tok, _ = load_target(model_id, None, backend="cuda")
    else:
        model, tok, _ = load_target(model_id, None if precision == "checkpoint" else precision)
    adapter = adapter_for(model)
    draft, did, ranking = load_draft(model_id, draft_id, adapter, target_model_dtype(model))
    config = DFlashConfig(dtype=None, prompt_cache_bytes=0, min_draft_confidence=None)
    return DFlashRuntime(model, tok, draft, config, model_id, did, adapter, ranking)


def weights_kind(rt: Any) -> dict:
    import mlx.nn as nn

    q = [m for _, m in rt.model.named_modules() if isinstance(m, nn.QuantizedLinear)]
    return {"activation_dtype": str(rt.target.inner.norm.weight.dtype),
            "quantized_linears": len(q), "bits": sorted({m.bits for m in q}),
            "draft_dtype": str(rt.draft.fc.weight.dtype)}


# -- forward --------------------------------------------------------------------------------
def forward_part(rt: Any, ctx: int, iters: int) -> dict:
    from engine.cycle import prefill
    from engine.draft_head import DraftHead
    from engine.targets.base import cache_arrays

    target, taps_ids = rt.target, rt.draft.args.target_layer_ids
    prompt = [(7 * i + 11) % 1000 + 100 for i in range(ctx)]
    out: dict = {}

    def fresh() -> list:
        cache = target.make_cache()
        prefill(target, cache, prompt, 512)
        return cache

    def step(cache: list, T: int, keep: int | None) -> float:
        ids = mx.array([[(13 * j + 5) % 1000 + 100 for j in range(T)]])

        def run() -> list:
            target.begin_verify(cache)
            logits, taps = target.forward(ids, cache, taps_ids)
            return [mx.argmax(logits[0], axis=-1), taps, cache_arrays(cache)]

        t = eval_time(run)
        if keep is not None:
            target.rollback(cache, keep=keep, verified=T)
            mx.eval(cache_arrays(cache))
        return t

    for label, T, keep in (("growing_kv_T16", 16, None), ("growing_kv_T1", 1, None),
                           ("fixed_kv_T16", 16, 0)):
        cache = fresh()
        out[label] = ms([step(cache, T, keep) for _ in range(iters)])
    cache = fresh()
    out["fixed_kv_varying_T"] = ms([step(cache, 2 + i % 15, 0) for i in range(iters)])
    cache = fresh()
    ids = mx.array([[5] * 16])
    logits, taps = target.forward(ids, cache, taps_ids)
    hidden = rt.draft(target.embed(ids), rt.draft.make_cache())
    out["dtypes"] = {"logits": str(logits.dtype), "taps": str(taps.dtype),
                     "embed": str(target.embed(ids).dtype), "draft_hidden": str(hidden.dtype),
                     "draft_head_logits": str(DraftHead(target)(hidden).dtype)}
    return out


# -- pieces ---------------------------------------------------------------------------------
def layer_pieces(layer: Any, x: mx.array, k: mx.array,
                 v: mx.array) -> dict[str, Callable[[], mx.array]]:
    """A llama-style decoder layer's pieces on a block x [1, T, H] over keys k, v [1, Hkv, S,
    D], each alone (inputs made up, shapes the layer's); attention through the engine (the
    fused block kernel where it applies) and through MLX."""
    from engine.kernels import cuda_attention

    attn = layer.self_attn
    T, hq, hd = x.shape[1], attn.n_heads, attn.head_dim
    q = mx.zeros((1, hq, T, hd), x.dtype)
    mask = "causal" if T > 1 else None
    return {"norm": lambda: layer.input_layernorm(x),
            "q_proj": lambda: attn.q_proj(x), "k_proj": lambda: attn.k_proj(x),
            "v_proj": lambda: attn.v_proj(x), "rope": lambda: attn.rope(q, offset=k.shape[2] - T),
            "attention": lambda: cuda_attention.scaled_dot_product_attention(
                q, k, v, scale=hd ** -0.5, mask=mask),
            "attention_mlx": lambda: mx.fast.scaled_dot_product_attention(
                q, k, v, scale=hd ** -0.5, mask=mask),
            "o_proj": lambda: attn.o_proj(mx.zeros((1, T, hq * hd), x.dtype)),
            "mlp": lambda: layer.mlp(x)}


def pieces_part(rt: Any, ctx: int, iters: int) -> dict:
    """Device time of each piece of the target's decoder layers at 1 and 16 new tokens after
    `ctx` cached ones: every layer's piece queued, then one evaluation (ms for all layers,
    median of `iters`). What a 16-token verify pays beyond a plain step, piece by piece."""
    from engine.kernels import cuda_attention

    layers, out = rt.target.layers, {}
    attn = layers[0].self_attn
    if not all(hasattr(attn, a) for a in ("q_proj", "n_heads", "n_kv_heads", "head_dim")):
        return {"skipped": f"not a llama-style attention: {type(attn).__name__}"}
    dtype = rt.target.inner.norm.weight.dtype
    hidden = rt.target.inner.norm.weight.shape[0]
    for T in (1, 16):
        x = mx.random.normal((1, T, hidden)).astype(dtype)
        k, v = (mx.random.normal((1, attn.n_kv_heads, ctx + T, attn.head_dim)).astype(dtype)
                for _ in range(2))
        mx.eval(x, k, v)
        pieces = [layer_pieces(layer, x, k, v) for layer in layers]
        row = {}
        for name in pieces[0]:
            times = []
            for _ in range(iters + 2):
                outputs = [p[name]() for p in pieces]  # built first: the device's time alone
                start = time.perf_counter()
                mx.eval(outputs)
                times.append(time.perf_counter() - start)
            row[name] = ms(times[2:])  # the first two build kernels
        out[f"T{T}"] = row
    out["layers"], out["ctx"] = len(layers), ctx
    out["attention_kernel"] = cuda_attention.state()
    return out


def split_part(rt: Any, ctx: int, iters: int) -> dict:
    """A verify forward taken apart (see the module docstring): ms, median of `iters`."""
    from engine.cycle import prefill
    from engine.targets.base import cache_arrays

    target, taps_ids = rt.target, rt.draft.args.target_layer_ids
    cache = target.make_cache()
    prefill(target, cache, [(7 * i + 11) % 1000 + 100 for i in range(ctx)], 512)
    hidden = target.inner.norm.weight.shape[0]
    dtype = target.inner.norm.weight.dtype
    every, target.launch_every = target.launch_every, 0  # one evaluation per call
    out: dict = {"ctx": ctx}

    def verify(T: int, last_only: bool = False) -> Callable[[], list]:
        ids = mx.array([[(13 * j + 5) % 1000 + 100 for j in range(T)]])

        def run() -> list:
            target.begin_verify(cache)
            logits, taps = target.forward(ids, cache, taps_ids, last_only=last_only)
            return [mx.argmax(logits[0], axis=-1), taps, cache_arrays(cache)]
        return run

    def model_call(T: int) -> Callable[[], list]:
        ids = mx.array([[(13 * j + 5) % 1000 + 100 for j in range(T)]])
        return lambda: [mx.argmax(rt.model(ids, cache=cache)[0], axis=-1), cache_arrays(cache)]

    def head(T: int) -> Callable[[], list]:
        h = mx.random.normal((1, T, hidden)).astype(dtype)
        mx.eval(h)
        return lambda: [mx.argmax(target.lm_head(target.inner.norm(h))[0], axis=-1)]

    # name -> (build, tokens the call adds to the cache: rolled back after it)
    cases = {f"forward_T{T}": (verify(T), T) for T in (16, 1)}
    cases["forward_T16_head_last_row"] = (verify(16, last_only=True), 16)
    cases.update({f"head_T{T}": (head(T), 0) for T in (16, 1)})
    cases.update({f"mlx_lm_model_T{T}": (model_call(T), T) for T in (16, 1)})
    for name, (build, added) in cases.items():
        walls, device = [], []
        for i in range(iters + 2):
            start = time.perf_counter()
            outputs = build()
            built = time.perf_counter()
            mx.eval(outputs)
            end = time.perf_counter()
            if i >= 2:  # the first two build kernels
                walls.append(end - start)
                device.append(end - built)
            if added:
                target.rollback(cache, keep=0, verified=added)
                mx.eval(cache_arrays(cache))
        out[name] = {"wall": ms(walls), "eval_after_build": ms(device)}
    target.launch_every = every
    return out


# -- cycle ----------------------------------------------------------------------------------
def host_laps(walls: list[float], laps: list[Any]) -> dict:
    """Where an unsynced cycle's wall time goes, from the host's side (PhaseClock laps):
    building the draft and the verify graphs, then waiting for the verify on the device plus
    building the rollback ("wait_and_rollback"), and what runs outside the cycle between two
    commits (the runtime's detokenising and events: "outside")."""
    ms = {"draft_build": [c.draft_s for c in laps], "verify_build": [c.verify_s for c in laps],
          "wait_and_rollback": [c.rollback_s for c in laps],
          "outside": [w - c.draft_s - c.verify_s - c.rollback_s for w, c in zip(walls, laps)]}
    return {k: (med(v) or 0) * 1e3 for k, v in ms.items()}


def cycle_part(rt: Any, max_tokens: int, prompts: list[str]) -> dict:
    from dataclasses import replace

    from engine.bench.timing import first_mismatch, run_baseline
    from engine.events import Finished

    out: dict = {}
    encoded = [rt.encode([{"role": "user", "content": p}]) for p in prompts]
    rt.generate(encoded[0], max_tokens=8, no_eos=True)  # warm-up, both sides
    run_baseline(rt.model, encoded[0], 8, rt.prefill_chunk)
    for n, ids in enumerate(encoded):
        base = run_baseline(rt.model, ids, max_tokens, rt.prefill_chunk)
        row: dict = {"prompt_tokens": len(ids),
                     "baseline_decode_tok_s": base.decode_tokens_per_second,
                     # a sanity check of the precision: readable text, not an overflow's
                     "baseline_text": rt.tokenizer.decode(base.tokens[:40])}
        whole = rt.plan  # the prefetch, where on, needs whole blocks
        for label, cut in (("wholeblock", None), ("cut0.4", 0.4)):
            rt.plan = replace(whole, min_confidence=cut, prefetch=whole.prefetch and cut is None)
            walls, laps, last, result = [], [], None, None
            for event in rt.stream_generate(ids, max_tokens=max_tokens, no_eos=True):
                now = time.perf_counter()
                if isinstance(event, Finished):
                    result = event.result
                elif event.cycle is not None and last is not None:
                    walls.append(now - last)
                    laps.append(event.cycle)
                last = now
            assert result is not None
            row[label] = {"decode_tok_s": result.decode_tokens_per_second,
                          "tokens_per_cycle": result.tokens_per_cycle,
                          "first_mismatch": first_mismatch(base.tokens, result.tokens),
                          "cycle_wall_first3_ms": [w * 1e3 for w in walls[:3]],
                          "cycle_wall_median_ms": (med(walls) or 0) * 1e3,
                          "host_laps_median_ms": host_laps(walls, laps)}
            row[label]["speedup_decode"] = (row[label]["decode_tok_s"]
                                            / max(base.decode_tokens_per_second, 1e-9))
        rt.plan = whole
        prof = rt.generate(ids, max_tokens=max_tokens, no_eos=True, profile=True)
        cycles = max(len(prof.cycle_tokens), 1)
        row["profiled_wholeblock_ms_per_cycle"] = {k: v * 1e3 / cycles
                                                   for k, v in prof.cycle_profile.items()}
        row["baseline_ms_per_token"] = 1e3 / max(base.decode_tokens_per_second, 1e-9)
        out[f"prompt{n}"] = row
    return out


# -- host -----------------------------------------------------------------------------------
def graph_nodes(*outputs: Any) -> collections.Counter:
    """The primitives (by name) an eval of `outputs` would run: the unevaluated graph, each
    node once (mx.export_to_dot walks it). CPU graphs hold the fallbacks of mx.fast ops (rope,
    rms_norm, sdpa: tens of nodes each) where a GPU runs one kernel."""
    dot = io.StringIO()
    mx.export_to_dot(dot, *outputs)
    return collections.Counter(re.findall(r'label ="([^"]+)", shape=rectangle', dot.getvalue()))


def python_calls(fn: Callable[[], Any]) -> tuple[Any, int]:
    """-> (fn(), the Python functions it called). MLX's own functions are not counted:
    nanobind functions raise no profiler events; the graph's nodes count their work."""
    calls = [0]

    def hook(frame: Any, event: str, arg: Any) -> None:
        calls[0] += event == "call"

    sys.setprofile(hook)
    try:
        return fn(), calls[0]
    finally:
        sys.setprofile(None)


class Frozen:
    """A snapshot of caches that every phase starts from: each restore gives the caches fresh
    handles on the same evaluated arrays (a KV update writes into its buffer's handle)."""

    def __init__(self, caches: list[Any]) -> None:
        self.saved = [(c, dict(vars(c))) for c in caches]

    @staticmethod
    def fresh(v: Any) -> Any:
        if isinstance(v, mx.array):
            return mx.array(v)
        return [Frozen.fresh(a) for a in v] if isinstance(v, list) else v

    def restore(self) -> None:
        for c, saved in self.saved:
            c.__dict__.update({k: self.fresh(v) for k, v in saved.items()})


def zero_filled(caches: list[Any]) -> None:
    """Replace every (lazy) array in the caches by evaluated zeros of its shape: a context
    without computing it (a quantized fp16 forward takes seconds per token on a CPU)."""
    def zero(v: Any) -> Any:
        if isinstance(v, mx.array):
            return mx.zeros(v.shape, v.dtype)
        return [zero(a) for a in v] if isinstance(v, list) else v

    for c in caches:
        c.__dict__.update({k: zero(v) for k, v in vars(c).items()})
    mx.eval([a for c in caches for _, a in tree_flatten(dict(vars(c))) if isinstance(a, mx.array)])


def host_part(rt: Any, ctx: int, iters: int, launch: bool, accepted: int = 3) -> dict:
    """Host cost per phase of one cycle (issue #13): graph nodes and host build time (no
    eval) of mlx-lm's own 1-token step (plain1) and 16-token call (plain16), and of the
    cycle's phases as speculative_decode builds them: the draft forward + head, the verify
    forward with taps (and, where the adapter compiles layer halves, the same through the
    model's own layers),
    accept/read_commit's graph, rollback + append_context. Phases start
    from one snapshot of a zero-filled context of `ctx` tokens; nodes of accept and rollback
    are those they add to the verify's graph. With `launch`, each build is also
    async_eval'ed (its host launch time) and waited for: only where evaluation is cheap."""
    from mlx_lm.generate import generate_step  # noqa: F401  (the step plain1 rebuilds)

    from engine.cycle import DraftProposer, commit_values
    from engine.cycle import accept as accept_fn
    from engine.device import current
    from engine.draft_head import DraftHead
    from engine.runtime import target_model_dtype
    from engine.targets.base import cache_arrays

    target, draft, model = rt.target, rt.draft, rt.model
    size, taps_ids = rt.plan.block_size, draft.args.target_layer_ids
    cache, dcache = target.make_cache(), draft.make_cache()
    target.forward(mx.array([[5] * ctx]), cache, [])
    draft.append_context(mx.zeros((1, ctx, target.hidden_size * len(taps_ids)),
                                  target_model_dtype(model)), dcache)
    zero_filled(cache + dcache)
    frozen = Frozen(cache + dcache)
    ids1, ids = mx.array([[5]]), mx.array([[5 + j for j in range(size)]])
    head = DraftHead(target)
    keep = accepted + 1

    def plain1() -> list:  # mlx_lm.generate_step's _step, greedy
        logits = model(ids1, cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return [mx.argmax(logprobs, axis=-1), logprobs]

    def verify() -> list:
        target.begin_verify(cache)
        return list(target.forward(ids, cache, taps_ids))

    def accept_step(logits: mx.array) -> list:
        a, choice = accept_fn(ids, logits)
        a, following = target.agree(a, choice[a])
        return [a, following, commit_values(ids, a, following)]

    def rollback_step(taps: mx.array) -> list:
        target.rollback(cache, keep=keep, verified=size)
        draft.append_context(taps[:, :keep], dcache)
        return cache_arrays(cache, dcache)

    proposer = DraftProposer(target, draft, head, cache=dcache)  # whole blocks, full head
    phases: dict[str, Callable[[list], list]] = {
        "plain1": lambda _: plain1(),
        "plain16": lambda _: [model(ids, cache=cache)],
        "draft": lambda _: [proposer.draft_proposal(5, size)],
        "verify": lambda _: verify(),
        "accept": lambda prev: accept_step(prev[0]),
        "rollback": lambda prev: rollback_step(prev[1]),
    }
    # The GPU's verify (compiled layer halves, targets/attention.py) on any device, and the
    # same verify through the model's own layers: the A/B.
    halves = None
    if hasattr(target, "compile_halves") and target.compile_halves(True):
        halves = target._halves
    if halves is not None:

        def verify_own_layers(_: list) -> list:
            target._halves = None
            try:
                return verify()
            finally:
                target._halves = halves

        phases["verify_own_layers"] = verify_own_layers
    chain = {"accept": "verify", "rollback": "verify"}  # built on the verify's outputs
    out: dict = {"ctx": ctx, "size": size, "accepted": accepted, "iters": iters}
    builds: dict[str, list[float]] = {k: [] for k in phases}
    launches: dict[str, list[float]] = {k: [] for k in phases}
    gc.disable()
    try:
        for _ in range(iters):  # interleaved: a noisy machine slows every phase alike
            for name, build in phases.items():
                made = prev = None  # freed here: a graph's teardown is not its build
                frozen.restore()
                prev = verify() if name in chain else []
                if launch:
                    mx.eval(prev)
                began = time.perf_counter()
                made = build(prev)
                builds[name].append(time.perf_counter() - began)
                if launch:
                    began = time.perf_counter()
                    mx.async_eval(made)
                    launches[name].append(time.perf_counter() - began)
                    mx.eval(made)
    finally:
        gc.enable()
    for name, build in phases.items():
        frozen.restore()
        prev = verify() if name in chain else []
        made, calls = python_calls(lambda: build(prev))  # noqa: B023
        nodes = graph_nodes(*made, *prev) - graph_nodes(*prev)
        out[name] = {"nodes": sum(nodes.values()), "python_calls": calls,
                     "build_ms": ms(builds[name]), "by_primitive": dict(nodes.most_common())}
        if launch:
            out[name]["launch_ms"] = ms(launches[name])
    if launch or target_model_dtype(model) == mx.float32:  # cheap enough to evaluate
        out["compiled_halves_exact"] = compiled_exact(target, cache, frozen, ids, taps_ids)
    if hasattr(target, "compile_halves"):
        target.compile_halves(current() != "cpu")  # as the runtime has it
    frozen.restore()
    return out


def compiled_exact(target: Any, cache: list, frozen: Frozen, ids: mx.array,
                   taps_ids: list) -> bool | None:
    """Whether a verify with the compiled layer halves (targets/attention.py) equals the
    model's own layers bit for bit (on the zero-filled context); None where the adapter has
    none."""
    halves = getattr(target, "_halves", None)
    if halves is None:
        return None
    outs = []
    try:
        for use in (halves, None):
            target._halves = use
            frozen.restore()
            target.begin_verify(cache)
            outs.append(target.forward(ids, cache, taps_ids))
            mx.eval(outs[-1])
            target.rollback(cache, keep=ids.shape[1], verified=ids.shape[1])
    finally:
        target._halves = halves
    return all(mx.array_equal(a, b).item() for a, b in zip(*outs, strict=True))


# -- main -----------------------------------------------------------------------------------
def child(args: argparse.Namespace, budget: float, setting: str, parts: str,
          precisions: str) -> dict:
    """Parts of the probe again in a child process with `setting` (KEY=VALUE,...) in its
    environment."""
    extra = dict(item.split("=", 1) for item in setting.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "child.json"
        cmd = [sys.executable, __file__, "--out", str(path), "--budget",
               str(max(int(budget), 10)), "--parts", parts, "--precisions", precisions,
               "--child"]
        cmd += ["--small"] if args.small else []
        cmd += ["--model", args.model] if args.model else []
        cmd += ["--draft", args.draft] if args.draft else []
        proc = subprocess.run(cmd, env={**os.environ, **extra}, capture_output=True,
                              text=True, timeout=budget + 90)
        result = json.loads(path.read_text()) if path.is_file() else {}
        return {"env": extra, "rc": proc.returncode, "stderr_tail": proc.stderr[-1500:],
                "result": result}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="JSON path (default: $OUT/gpu_cycle_probe.json)")
    p.add_argument("--model", help="target (default: the offline SmolLM2 GGUF)")
    p.add_argument("--draft", help="draft (default: the registered one)")
    p.add_argument("--precisions", default="checkpoint,bfloat16,float32,q-bfloat16,float16")
    p.add_argument("--parts", default="sdpa,forward,cycle,children")
    p.add_argument("--budget", type=float, default=100,
                   help="seconds for the parts in this process (one that started may run "
                        "over); each child gets --child-budget more")
    p.add_argument("--child-envs",
                   default="MLX_CUDA_USE_CUDNN_SDPA=0:sdpa,cycle:bfloat16,checkpoint;"
                           "MLX_USE_CUDA_GRAPHS=0:cycle:bfloat16",
                   help="ENV=V[,ENV=V]:parts:precisions, ';'-separated")
    p.add_argument("--child-budget", type=float, default=40)
    p.add_argument("--host-launch", choices=("auto", "on", "off"), default="auto",
                   help="host part: also time each phase's async_eval and wait for it "
                        "(auto: on a GPU; a CPU evaluates in async_eval itself)")
    p.add_argument("--small", action="store_true", help="CPU sizes: few iterations, tokens")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-test", action="store_true",
                   help="run the nocudnn child even without CUDA (tests the mechanics)")
    args = p.parse_args()
    out_path = Path(args.out or Path(os.environ.get("OUT", ".")) / "gpu_cycle_probe.json")
    from engine.bench.environment import environment
    from engine.device import current

    backend = current()
    parts = set(args.parts.split(","))
    iters = 6 if args.small else 40
    max_tokens = 24 if args.small else 96
    budget = args.budget
    report: dict = {"command": " ".join(sys.argv), "backend": backend, **environment(),
                    "env": {k: v for k, v in os.environ.items() if k.startswith("MLX_")},
                    "settings": {"iters": iters, "max_tokens": max_tokens, "small": args.small,
                                 "budget_s": args.budget}}
    precisions = args.precisions.split(",")
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        report["elapsed_s"] = time.perf_counter() - START
        out_path.write_text(json.dumps(report, indent=1, default=str))

    SAVE.append(save)
    if "sdpa" in parts:
        dtypes = ["float32", "bfloat16", "float16"]
        # SmolLM2's attention: 9 query heads, 3 KV heads, head dim 64 (target and draft).
        guarded(report, "sdpa", budget, sdpa_part, dtypes, 9, 3, 64,
                64 if args.small else 300, iters)
    report["precisions"] = {}
    for precision in precisions:
        row: dict = {}
        report["precisions"][precision] = row
        if left(budget) <= 0:
            row["skipped"] = "budget spent"
            continue
        try:
            began = time.perf_counter()
            rt = load(precision, args.model, args.draft)
            row["load_s"] = time.perf_counter() - began
            row["weights"] = weights_kind(rt)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            continue
        if "forward" in parts:
            guarded(row, "forward", budget, forward_part, rt, 32 if args.small else 300, iters)
        if "pieces" in parts:
            guarded(row, "pieces", budget, pieces_part, rt, 32 if args.small else 300, iters)
        if "split" in parts:
            guarded(row, "split", budget, split_part, rt, 32 if args.small else 300, iters)
        if "host" in parts:  # before the cycle part: the budget skipped it twice after it
            launch = {"on": True, "off": False}.get(args.host_launch, backend != "cpu")
            guarded(row, "host", budget, host_part, rt, 32 if args.small else 300,
                    5 if args.small else 100, launch)
        if "cycle" in parts:
            guarded(row, "cycle", budget, cycle_part, rt, max_tokens, PROMPTS[:1])
        rt = None
        mx.clear_cache()
    if "children" in parts and not args.child and (backend == "cuda" or args.child_test):
        report["children"] = {}
        for spec in filter(None, args.child_envs.split(";")):
            setting, child_parts, child_precisions = spec.split(":")
            guarded(report["children"], setting, float("inf"), child, args,
                    args.child_budget, setting, child_parts, child_precisions)
    save()
    print(f"wrote {out_path} ({report['elapsed_s']:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
