"""Where a 16-token verify forward's time goes beyond a plain 1-token step, piece by piece, on
a synthetic GatedDeltaNet target (issue 13: T_verify16 / T_ar <= 1.3 in bf16).

    python scripts/verify_pieces.py --synthetic qwen3.5-9b \
        --json "$OUT/verify-pieces-qwen3.5-9b-bf16-h200.json"   # an H200: about 2 minutes
    python scripts/verify_pieces.py --synthetic qwen3.5-9b --layers 4 --ctx 64 --iters 3 \
        --override hidden_size=64 ...                           # CPU shapes (tests)

First the whole forwards after `--ctx` cached tokens (engine.bench.synthetic.forward_timings:
mlx-lm's 1- and 16-token forwards, the adapter's 16-token verify with its rollback tape).
Then each piece of every layer at T = 1 and T = 16 new tokens, inputs made up at the layer's
shapes: every layer's piece built first, then one evaluation (median ms, all layers together).
GatedDeltaNet layers: the input projections (each, and as the verify merges them on a GPU:
`gdn_in_proj_merged`), the causal conv, the q/k norms and gates, the
recurrence as plain decoding runs it (mlx-lm's gated_delta_update) and as the verify runs it
(the engine's kernel, tape recorded), the gated norm with the output projection. Attention
layers: the projections, and the whole mixer over the cached keys through the engine's
attention and through mlx-lm's. Every layer: its two norms and its MLP. Once: the head (final
norm and lm_head) and the argmax over its logits. `extra_ms` ranks the pieces by what 16
tokens cost over 1: where a verify's time beyond a plain step goes. Last, the rollback after a
16-token verify to 1, 8 and 15 kept tokens, whole (build and device) and its tape replays
alone.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import engine  # noqa: E402,F401,I001  (before mlx: the CPU's BLAS)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx_lm.models.gated_delta import compute_g, gated_delta_update, normalize_qk  # noqa: E402

from engine.bench.environment import environment  # noqa: E402
from engine.bench.synthetic import (  # noqa: E402
    MODELS,
    build_target,
    forward_timings,
    parse_overrides,
    rollback_timings,
)
from engine.cycle import prefill  # noqa: E402
from engine.kernels import cuda_attention  # noqa: E402
from engine.targets import adapter_for  # noqa: E402
from engine.targets.base import TargetAdapter, cache_arrays  # noqa: E402
from engine.targets.cpu_attention import attention_call  # noqa: E402
from engine.targets.gated_delta import GatedDeltaAdapter  # noqa: E402

Pieces = dict[str, Callable[[], Any]]


def rand(shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    return (0.1 * mx.random.normal(shape)).astype(dtype)


def linear_pieces(target: GatedDeltaAdapter, index: int, attn: nn.Module,
                  x: mx.array) -> Pieces:
    """A GatedDeltaNet mixer's pieces (mlx-lm's qwen3_5 layout) on x [1, T, H]; with
    `gdn_in_proj_merged` where the verify merges the layer's input projections (a GPU in half
    precision: engine/targets/merged.py)."""
    T, dtype = x.shape[1], x.dtype
    Hk, Hv, Dk, Dv = attn.num_k_heads, attn.num_v_heads, attn.head_k_dim, attn.head_v_dim
    conv_state = rand((1, attn.conv_kernel_size - 1, attn.conv_dim), dtype)
    qkv = rand((1, T, attn.conv_dim), dtype)
    q, k = rand((1, T, Hk, Dk), dtype), rand((1, T, Hk, Dk), dtype)
    v, z = rand((1, T, Hv, Dv), dtype), rand((1, T, Hv, Dv), dtype)
    a, b = rand((1, T, Hv), dtype), rand((1, T, Hv), dtype)
    state = rand((1, Hv, Dv, Dk), mx.float32)
    g, beta = compute_g(attn.A_log, a, attn.dt_bias), mx.sigmoid(b)
    mx.eval(conv_state, qkv, q, k, v, z, a, b, state, g, beta)

    def verify() -> list[mx.array]:
        y, final, tape = target.kernels.verify(q, k, v, g, beta, state)
        return [y, final, *tape]

    merged = target.merged_projection(index)
    pieces: Pieces = {} if merged is None else {"gdn_in_proj_merged": lambda: merged(x)}
    return pieces | {
        "gdn_in_proj_qkv": lambda: attn.in_proj_qkv(x),
        "gdn_in_proj_z": lambda: attn.in_proj_z(x),
        "gdn_in_proj_ba": lambda: [attn.in_proj_b(x), attn.in_proj_a(x)],
        "gdn_conv": lambda: nn.silu(attn.conv1d(mx.concatenate([conv_state, qkv], axis=1))),
        "gdn_qk_gates": lambda: [*normalize_qk(q, k, inv_scale=Dk ** -0.5, eps=1e-6),
                                 compute_g(attn.A_log, a, attn.dt_bias), mx.sigmoid(b)],
        "gdn_recurrence_mlx": lambda: list(gated_delta_update(q, k, v, a, b, attn.A_log,
                                                              attn.dt_bias, state)),
        "gdn_recurrence_verify": verify,
        "gdn_norm_out": lambda: attn.out_proj(attn.norm(v, z).reshape(1, T, -1)),
    }


def attention_pieces(attn: nn.Module, x: mx.array, cache: Any) -> Pieces:
    """A full-attention mixer's projections, and the whole mixer over `cache`'s keys (the
    caller trims the T new keys after each evaluation)."""
    T = x.shape[1]
    mask = "causal" if T > 1 else None
    attended = rand((1, T, attn.o_proj.weight.shape[1]), x.dtype)
    engine_call = attention_call(attn)
    pieces: Pieces = {
        "attn_projections": lambda: [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x),
                                     attn.o_proj(attended)],
        "attn_mixer_mlx": lambda: attn(x, mask, cache),
    }
    if engine_call is not None:  # the fused verify-block kernel (CUDA), or the CPU softmax
        pieces["attn_mixer_engine"] = lambda: engine_call(attn, x, mask, cache)
    return pieces


def time_piece(build: list[Callable[[], Any]], iters: int,
               after: Callable[[], Any] | None = None) -> dict:
    """Every layer's piece built, then one evaluation: median and min ms over `iters` (two
    warm-ups first: kernels compile); `after` runs after each evaluation."""
    times = []
    for i in range(iters + 2):
        outputs = [fn() for fn in build]
        start = time.perf_counter()
        mx.eval(outputs)
        if i >= 2:
            times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return {"ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times)}


def pieces_at(target: TargetAdapter, cache: list[Any], T: int, iters: int) -> dict:
    layers, dtype = target.layers, target.inner.norm.weight.dtype
    x = rand((1, T, target.hidden_size), dtype)
    mx.eval(x)
    by_name: dict[str, list[Callable[[], Any]]] = {}
    for i, layer in enumerate(layers):
        if layer.is_linear:
            pieces = linear_pieces(target, i, layer.linear_attn, x)
        else:
            pieces = attention_pieces(layer.self_attn, x, cache[i])
        pieces["norms"] = lambda layer=layer: [layer.input_layernorm(x),
                                               layer.post_attention_layernorm(x)]
        pieces["mlp"] = lambda layer=layer: layer.mlp(x)
        for name, fn in pieces.items():
            by_name.setdefault(name, []).append(fn)
    logits = target.lm_head(target.inner.norm(x))
    mx.eval(logits)
    by_name["head"] = [lambda: target.lm_head(target.inner.norm(x))]
    by_name["argmax"] = [lambda: mx.argmax(logits, axis=-1)]
    kv = [c for layer, c in zip(layers, cache, strict=True) if not layer.is_linear]
    row = {}
    for name, build in by_name.items():
        trim = (lambda: [c.trim(T) for c in kv]) if name.startswith("attn_mixer") else None
        row[name] = time_piece(build, iters, trim)
        row[name]["layers"] = len(build)
        mx.eval(cache_arrays(cache))
    return row


def rollback_pieces(target: TargetAdapter, cache: list[Any], iters: int,
                    keeps: tuple[int, ...] = (1, 8, 15)) -> dict:
    """After a 16-token verify (evaluated, untimed): the adapter's whole rollback to `keep`
    tokens (build and device), and the tape replays alone (every linear layer's, one
    evaluation): what a cycle's rollback phase pays beyond the replay kernels."""
    from engine.kernels.portable import Tape

    block = mx.array([[(17 * i) % (target.vocab_size - 1) + 1 for i in range(16)]])
    mixer = next(layer.linear_attn for layer in target.layers if layer.is_linear)
    Hk, Hv, Dk, Dv = mixer.num_k_heads, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim
    n_linear = sum(layer.is_linear for layer in target.layers)
    states = [rand((1, Hv, Dv, Dk), mx.float32) for _ in range(n_linear)]
    tape = Tape(rand((1, 16, Hv, Dv), mx.float32), rand((1, 16, Hk, Dk), mx.float32),
                mx.full((1, 16, Hv), 0.9))
    mx.eval(states, *tape)
    out = {}
    for keep in keeps:
        timed = rollback_timings(target, cache, block, keep, iters)
        replay = time_piece([lambda st=st, keep=keep: target.kernels.replay(st, tape, keep)
                             for st in states], iters)
        out[f"keep{keep}"] = {"rollback_ms": timed["rollback_total_ms"],
                              "rollback_build_ms": timed["rollback_build_ms"],
                              "replay_kernels_ms": replay["ms"], "linear_layers": n_linear}
    return out


def sum_as_run(row: dict, verify: bool) -> float:
    """The pieces a plain step (mlx-lm's recurrence and attention) or a verify (the engine's)
    runs, summed; the attention projections are inside the mixers."""
    engine_mixer = "attn_mixer_engine" in row
    separate = {"gdn_in_proj_qkv", "gdn_in_proj_z", "gdn_in_proj_ba"}
    projections = (separate if verify and "gdn_in_proj_merged" in row
                   else {"gdn_in_proj_merged"})
    skip = projections | {"attn_projections",
            "gdn_recurrence_mlx" if verify else "gdn_recurrence_verify",
            "attn_mixer_mlx" if verify and engine_mixer else "attn_mixer_engine"}
    return sum(v["ms"] for k, v in row.items() if k not in skip)


def measure(name: str, layers: int | None, overrides: dict, dtype: str, ctx: int,
            iters: int, kernels: str | None) -> dict:
    model = build_target(name, layers, overrides, dtype)
    target = adapter_for(model, enable_tape_replay=True, kernels=kernels)
    cuda_attention.check()  # as the runtime does: a failing kernel keeps MLX's attention
    target.warm_up()
    prompt = [(31 * i) % (target.vocab_size - 1) + 1 for i in range(ctx)]
    whole = forward_timings(model, target, prompt, iters)
    say(f"T_ar {1e3 * whole['t_ar_s']:.2f} ms, T_forward16 {whole['forward16_over_ar']:.2f}x, "
        f"T_verify16 {whole['verify16_over_ar']:.2f}x")
    cache = target.make_cache()
    prefill(target, cache, prompt, 512)
    rows = {}
    for T in (1, 16):  # printed as measured: a call cut short by its time limit keeps them
        rows[f"T{T}"] = pieces_at(target, cache, T, iters)
        say(f"T={T}: " + ", ".join(f"{k} {v['ms']:.3f}" for k, v in rows[f"T{T}"].items()))
    rollback = rollback_pieces(target, cache, iters)
    extra = sorted(((k, rows["T16"][k]["ms"] - rows["T1"][k]["ms"]) for k in rows["T1"]),
                   key=lambda kv: -kv[1])
    return {
        "whole": whole,
        "pieces": rows,
        "pieces_sum_ms": {"plain_T1": sum_as_run(rows["T1"], verify=False),
                          "verify_T16": sum_as_run(rows["T16"], verify=True)},
        "extra_ms": [{"piece": k, "ms": v} for k, v in extra],
        "rollback": rollback,
        "kernels": target.kernels.name,
    }


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--synthetic", default="qwen3.5-9b", choices=MODELS)
    p.add_argument("--layers", type=int, help="cut the target to N layers")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default: bfloat16 on a GPU, float32 on the CPU")
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--kernels", choices=["auto", "portable", "native"])
    p.add_argument("--json")
    args = p.parse_args(argv)
    dtype = args.dtype or ("float32" if mx.default_device() == mx.cpu else "bfloat16")
    mx.random.seed(0)
    report = {"command": shlex.join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)]),
              "synthetic": True, "model": args.synthetic, "dtype": dtype, "ctx": args.ctx,
              "iters": args.iters, "layers": args.layers,
              "overrides": parse_overrides(args.override),
              **measure(args.synthetic, args.layers, parse_overrides(args.override), dtype,
                        args.ctx, args.iters, args.kernels),
              **environment()}
    print("pieces as run: "
          + ", ".join(f"{t} {v:.2f} ms" for t, v in report["pieces_sum_ms"].items()))
    for e in report["extra_ms"]:
        t1, t16 = (report["pieces"][t][e["piece"]]["ms"] for t in ("T1", "T16"))
        print(f"  {e['piece']:24s} T1 {t1:8.3f}  T16 {t16:8.3f}  extra {e['ms']:+8.3f} ms")
    for keep, r in report["rollback"].items():
        print(f"  rollback {keep}: {r['rollback_ms']:.3f} ms (build {r['rollback_build_ms']:.3f}),"
              f" the {r['linear_layers']} tape replays alone {r['replay_kernels_ms']:.3f} ms")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
