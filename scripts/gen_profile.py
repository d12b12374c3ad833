"""Where batched answer generation's time goes (training data): ms per decode step of a batch.

    python scripts/gen_profile.py [--model ID] [--dtype bfloat16] [--json PATH]

For each batch width and context length (`--widths`, `--contexts`), times `--steps` decode
steps of `B` rows after a prefill of `L` tokens, three ways: equal-length rows in mlx-lm's
plain cache (no mask), the same rows in a left-padded `BatchKVCache` with no padding (its
mask path alone), and with half the rows padded by L/2 (what mixed prompt lengths cost).
Response tokens/s = width / step time. The JSON names the machine and versions.
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


def step_ms(model, cache, tokens, steps: int) -> float:
    import mlx.core as mx

    chunk = max(16, (1 << 16) // tokens.shape[0])  # bounds the prefill's attention scores
    for start in range(0, tokens.shape[1], chunk):
        logits = model(tokens[:, start:start + chunk], cache=cache)[:, -1]
        mx.eval(logits)
    tok = mx.argmax(logits, axis=-1)
    for _ in range(2):  # warm-up steps: first-call kernel builds stay out of the timing
        tok = mx.argmax(model(tok[:, None], cache=cache)[:, -1], axis=-1)
        mx.eval(tok)
    start = time.perf_counter()
    for _ in range(steps):
        tok = mx.argmax(model(tok[:, None], cache=cache)[:, -1], axis=-1)
        mx.async_eval(tok)
    mx.eval(tok)
    return (time.perf_counter() - start) / steps * 1e3


def profile(model_id: str | None, dtype: str, widths: list[int], contexts: list[int],
            steps: int) -> dict:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.bench.environment import machine_info, versions
    from engine.loading import load_target
    from engine.registry import DEFAULT_TARGET
    from engine.targets import adapter_for
    from engine.train.generate import left_padded_cache

    model, _, name = load_target(model_id or DEFAULT_TARGET, dtype)
    vocab = adapter_for(model).vocab_size
    rows = []
    for width in widths:
        for ctx in contexts:
            tokens = mx.random.randint(0, vocab, (width, ctx))
            pads = [0] * width
            half = [ctx // 2 if i % 2 else 0 for i in range(width)]
            row = {"width": width, "context": ctx}
            for name_, cache in (("plain", make_prompt_cache(model)),
                                 ("masked", left_padded_cache(model, pads)),
                                 ("half_padded", left_padded_cache(model, half))):
                ms = step_ms(model, cache, tokens, steps)
                row[f"{name_}_ms"] = round(ms, 3)
                row[f"{name_}_tokens_per_s"] = round(width / ms * 1e3, 1)
                del cache
                mx.clear_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {"command": "python scripts/gen_profile.py " + shlex.join(sys.argv[1:]),
            "model": name, "dtype": dtype, "steps": steps, "machine": machine_info(),
            "versions": versions(), "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="target id or folder (default: the offline default)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--widths", default="128,384,768", help="rows per batch, comma-separated")
    p.add_argument("--contexts", default="256,1024,2048", help="prefill lengths")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps")
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args()
    report = profile(a.model, a.dtype, [int(x) for x in a.widths.split(",")],
                     [int(x) for x in a.contexts.split(",")], a.steps)
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
