"""Store a draft folder's linear layers as affine blocks of 2 to 8 bits (8 by default), to
ship a bigger draft in the same bytes. A CPU dequantizes them when it loads the draft
(`engine.loading.dequantize_floats`), so the draft computes in floats as before; only the
rounding of the stored weights changes, and `scripts/draft_acceptance.py` on both folders
shows what that costs in tokens/cycle. A GPU keeps them quantized.

    python scripts/quantize_draft.py SRC DST [--bits 8] [--group-size 64] [--requantize]

A GPU training call returns a draft over 56 MB stored 8-bit (what one call brings back);
`--requantize` dequantizes such a SRC to bfloat16 first, then stores it at --bits.

DST gets SRC's other files (config.json with a "quantization" entry, token_ranking.json, ...).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401,I001  (first: the fast CPU BLAS)
import mlx.core as mx  # noqa: E402


def quantized_weights(weights: dict[str, mx.array], group_size: int,
                      bits: int) -> dict[str, mx.array]:
    """Every 2-D `*.weight` whose rows split into whole groups, as packed weight, scales and
    biases (MLX's affine format); the rest (norms) as they are."""
    out: dict[str, mx.array] = {}
    for name, value in weights.items():
        if name.endswith(".weight") and value.ndim == 2 and value.shape[1] % group_size == 0:
            packed, scales, biases = mx.quantize(value, group_size=group_size, bits=bits)
            base = name.removesuffix(".weight")
            out[name], out[f"{base}.scales"], out[f"{base}.biases"] = packed, scales, biases
        else:
            out[name] = value
    return out


def dequantized_weights(weights: dict[str, mx.array], group_size: int,
                        bits: int) -> dict[str, mx.array]:
    """`quantized_weights` undone: each packed weight with its scales and biases as one
    bfloat16 `*.weight`."""
    out: dict[str, mx.array] = {}
    for name, value in weights.items():
        base = name.removesuffix(".weight")
        if name.endswith(".weight") and f"{base}.scales" in weights:
            out[name] = mx.dequantize(value, weights[f"{base}.scales"],
                                      weights[f"{base}.biases"], group_size=group_size,
                                      bits=bits).astype(mx.bfloat16)
        elif not name.endswith((".scales", ".biases")):
            out[name] = value
    return out


def quantize_draft(src: Path, dst: Path, bits: int = 8, group_size: int = 64,
                   requantize: bool = False) -> dict:
    """Write SRC's draft to DST with quantized linear layers -> {"bytes_before", "bytes_after"}.
    `requantize`: SRC may be stored quantized (dequantized first)."""
    config = json.loads((src / "config.json").read_text())
    stored = config.pop("quantization", None)
    if stored and not requantize:
        raise SystemExit(f"{src} is stored quantized already ({stored}). Fix: quantize the "
                         "float draft it came from, or pass --requantize.")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy2(f, dst / f.name)
    weights = mx.load(str(src / "model.safetensors"))
    if stored:
        weights = dequantized_weights(weights, stored["group_size"], stored["bits"])
    mx.save_safetensors(str(dst / "model.safetensors"),
                        quantized_weights(weights, group_size, bits),
                        metadata={"format": "mlx", "producer": "scripts/quantize_draft.py"})
    config["quantization"] = {"group_size": group_size, "bits": bits}
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return {"bytes_before": (src / "model.safetensors").stat().st_size,
            "bytes_after": (dst / "model.safetensors").stat().st_size}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", type=Path, help="a draft folder (config.json + model.safetensors)")
    p.add_argument("dst", type=Path, help="the folder to write")
    p.add_argument("--bits", type=int, choices=[2, 3, 4, 5, 6, 8], default=8)
    p.add_argument("--group-size", type=int, choices=[32, 64, 128], default=64)
    p.add_argument("--requantize", action="store_true",
                   help="SRC is stored quantized (a GPU call's 8-bit return): dequantize first")
    args = p.parse_args()
    sizes = quantize_draft(args.src, args.dst, args.bits, args.group_size, args.requantize)
    print(f"wrote {args.dst}: model.safetensors {sizes['bytes_before'] / 1e6:.1f} MB -> "
          f"{sizes['bytes_after'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
