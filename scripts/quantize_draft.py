"""Store a draft folder's linear layers as affine blocks of 2 to 8 bits (8 by default), to
ship a bigger draft in the same bytes. A CPU dequantizes them when it loads the draft
(`engine.loading.dequantize_floats`), so the draft computes in floats as before; only the
rounding of the stored weights changes, and `scripts/draft_acceptance.py` on both folders
shows what that costs in tokens/cycle. A GPU keeps them quantized.

    python scripts/quantize_draft.py SRC DST [--bits 8] [--group-size 64] [--requantize]
    python scripts/quantize_draft.py SRC DST --bits 4 --calibrate ANSWERS.npz [--model M]

A GPU training call returns a draft over 56 MB stored 8-bit (what one call brings back);
`--requantize` dequantizes such a SRC to bfloat16 first, then stores it at --bits.

Without --calibrate each group rounds to the nearest step of its own range (MLX's
`mx.quantize`). --calibrate runs the draft as training does on the target's answers in a
Dataset .npz (TRAINING answers: never the held-out ones it is measured on) and records
what every linear layer reads; each layer is then rounded column by column, the error of
each column moved onto the columns not yet rounded as that input data says it cancels best
(GPTQ, Frantar et al. 2022), and each group's range chosen by least squared error.

DST gets SRC's other files (config.json with a "quantization" entry, token_ranking.json, ...).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401,I001  (first: the fast CPU BLAS)
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

# Ranges tried for a group, as fractions of its own (min, max) about the midpoint
SHRINKS = np.linspace(1.0, 0.6, 21)
DAMPING = 0.01  # of the mean diagonal, added to every layer's input second moments


def quantized_weights(weights: dict[str, mx.array], group_size: int, bits: int,
                      hessians: dict[str, np.ndarray] | None = None) -> dict[str, mx.array]:
    """Every 2-D `*.weight` whose rows split into whole groups, as packed weight, scales and
    biases (MLX's affine format); the rest (norms) as they are. A weight with an entry in
    `hessians` (its layer's input second moments) is rounded by `gptq`."""
    out: dict[str, mx.array] = {}
    for name, value in weights.items():
        base = name.removesuffix(".weight")
        if name.endswith(".weight") and value.ndim == 2 and value.shape[1] % group_size == 0:
            if hessians is not None and base in hessians:
                q, scales, biases = gptq(np.array(value.astype(mx.float32)), hessians[base],
                                         bits, group_size, value.dtype)
                packed = mx.array(pack(q, bits))
                scales, biases = (mx.array(scales).astype(value.dtype),
                                  mx.array(biases).astype(value.dtype))
            else:
                packed, scales, biases = mx.quantize(value, group_size=group_size, bits=bits)
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


def stored(x: np.ndarray, dtype: mx.Dtype) -> np.ndarray:
    """x as it reads back after a round trip through `dtype` (the scales' storage)."""
    return np.array(mx.array(x.astype(np.float32)).astype(dtype).astype(mx.float32))


def group_grid(w: np.ndarray, bits: int, dtype: mx.Dtype) -> tuple[np.ndarray, np.ndarray]:
    """Per row of w [rows, group]: the (scale, bias) of the affine grid, stored in `dtype`,
    that rounds the row with the least squared error among ranges shrunk about its
    midpoint (`SHRINKS`): a narrower range can trade a clipped outlier for finer steps."""
    top = 2**bits - 1
    lo, hi = w.min(1), w.max(1)
    mid = (lo + hi) / 2
    best = np.full(len(w), np.inf)
    scale, bias = np.ones(len(w)), lo.copy()
    for shrink in SHRINKS:
        s = stored(np.maximum((hi - lo) * shrink / top, 1e-8), dtype)
        b = stored(mid - (mid - lo) * shrink, dtype)
        q = np.clip(np.rint((w - b[:, None]) / s[:, None]), 0, top)
        err = ((q * s[:, None] + b[:, None] - w) ** 2).sum(1)
        better = err < best
        best[better], scale[better], bias[better] = err[better], s[better], b[better]
    return scale, bias


def gptq(w: np.ndarray, hessian: np.ndarray, bits: int, group_size: int, dtype: mx.Dtype,
         block: int = 128) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w [out, in] rounded to `bits` in groups of `group_size` inputs, column by column in
    order, each column's error carried onto the later columns through the inverse of
    `hessian` (the layer's input second moments, [in, in]) so the layer's outputs on that
    data move least. -> (q [out, in] ints, scales and biases [out, in / group_size])."""
    w = w.astype(np.float64)
    n, top = w.shape[1], 2**bits - 1
    h = hessian.astype(np.float64)
    dead = np.diag(h) == 0  # inputs never seen: their weights cannot matter
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h[np.diag_indices(n)] += DAMPING * np.mean(np.diag(h))
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: row i carries column i's error on
    block = max(block // group_size, 1) * group_size
    q = np.zeros(w.shape, np.int64)
    scales = np.zeros((w.shape[0], n // group_size))
    biases = np.zeros_like(scales)
    for i0 in range(0, n, block):
        i1 = min(i0 + block, n)
        part, errors = w[:, i0:i1].copy(), np.zeros((w.shape[0], i1 - i0))
        for j in range(i1 - i0):
            col = i0 + j
            if col % group_size == 0:
                g = col // group_size
                scales[:, g], biases[:, g] = group_grid(part[:, j:j + group_size], bits, dtype)
            s, b = scales[:, col // group_size], biases[:, col // group_size]
            q[:, col] = np.clip(np.rint((part[:, j] - b) / s), 0, top)
            errors[:, j] = (part[:, j] - (q[:, col] * s + b)) / u[col, col]
            part[:, j + 1:] -= np.outer(errors[:, j], u[col, col + 1:i1])
        w[:, i1:] -= errors @ u[i0:i1, i1:]
    return q, scales, biases


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Integers [rows, n] in [0, 2**bits) as MLX packs them: one little-endian bit stream
    per row in uint32 words."""
    stream = ((q[..., None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(len(q), -1)
    return np.packbits(stream, axis=1, bitorder="little").view(np.uint32)


class _Recorder(nn.Module):
    """A linear layer that also adds its inputs' second moments into `sums[name]`."""

    def __init__(self, linear: nn.Module, name: str, sums: dict[str, mx.array]):
        super().__init__()
        self.linear, self.name, self.sums = linear, name, sums

    def __call__(self, x: mx.array) -> mx.array:
        flat = x.reshape(-1, x.shape[-1]).astype(mx.float32)
        self.sums[self.name] = self.sums.get(self.name, 0) + flat.T @ flat
        return self.linear(x)


def input_hessians(draft: nn.Module, target, sequences: Sequence[Sequence[int]],
                   prompt_lens: Sequence[int], chunk: int = 64) -> dict[str, np.ndarray]:
    """Every linear layer's input second moments [in, in], by module path, over blocks
    anchored at every response position of the sequences (training's forward on the
    target's features, as `engine.train.objective.anchor_hits` runs them)."""
    from engine.train.objective import every_anchor, slot_hidden, target_taps

    sums: dict[str, mx.array] = {}
    linears = [(name, m) for name, m in draft.named_modules() if isinstance(m, nn.Linear)]
    parents = dict(draft.named_modules())

    def swap(to_recorders: bool) -> None:
        for name, layer in linears:
            parent_name, _, attr = name.rpartition(".")
            parent = parents[parent_name] if parent_name else draft
            setattr(parent, attr, _Recorder(layer, name, sums) if to_recorders else layer)

    swap(True)
    try:
        for seq, prompt_len in zip(sequences, prompt_lens):
            taps = target_taps(target, mx.array([list(seq)]), draft.args.target_layer_ids)
            for batch in every_anchor(seq, prompt_len, draft.args.block_size,
                                      draft.args.mask_token_id, chunk):
                mx.eval(slot_hidden(draft, target, batch, taps), sums)
    finally:
        swap(False)
    return {name: np.array(value, np.float64) for name, value in sums.items()}


def calibration_hessians(src: Path, model: str | None, data: Path,
                         limit: int) -> dict[str, np.ndarray]:
    """`input_hessians` of SRC's draft (floats) under its target, on the first `limit`
    answers of `data`."""
    from engine.errors import PairingError
    from engine.loading import check_pair, load_draft_folder, load_target
    from engine.registry import DEFAULT_TARGET
    from engine.targets import adapter_for
    from engine.train.dataset import Dataset

    answers = Dataset.load(data)
    target_model, _, _ = load_target(model or DEFAULT_TARGET)
    draft = load_draft_folder(src, mx.float32)
    target = adapter_for(target_model)
    try:
        check_pair(target, draft.args)
    except PairingError as exc:
        raise SystemExit(f"{exc} With --calibrate, --model names that target.") from exc
    n = min(limit, len(answers))
    return input_hessians(draft, target, answers.sequences[:n], answers.prompt_lens[:n])


def stored_quantization(src: Path, requantize: bool) -> dict | None:
    """SRC's "quantization" entry (None: stored in floats); refused unless `requantize`."""
    if not (src / "config.json").is_file():
        raise SystemExit(f"{src} has no config.json. Fix: pass a draft folder.")
    stored_as = json.loads((src / "config.json").read_text()).get("quantization")
    if stored_as and not requantize:
        raise SystemExit(f"{src} is stored quantized already ({stored_as}). Fix: quantize the "
                         "float draft it came from, or pass --requantize.")
    return stored_as


def quantize_draft(src: Path, dst: Path, bits: int = 8, group_size: int = 64,
                   requantize: bool = False,
                   hessians: dict[str, np.ndarray] | None = None) -> dict:
    """Write SRC's draft to DST with quantized linear layers -> {"bytes_before", "bytes_after"}.
    `requantize`: SRC may be stored quantized (dequantized first). `hessians`
    (`calibration_hessians`): round the layers they name by `gptq`."""
    stored_as = stored_quantization(src, requantize)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization", None)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy2(f, dst / f.name)
    weights = mx.load(str(src / "model.safetensors"))
    if stored_as:
        weights = dequantized_weights(weights, stored_as["group_size"], stored_as["bits"])
    mx.save_safetensors(str(dst / "model.safetensors"),
                        quantized_weights(weights, group_size, bits, hessians),
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
    p.add_argument("--calibrate", type=Path, metavar="ANSWERS.npz",
                   help="round by GPTQ on these training answers (a Dataset .npz)")
    p.add_argument("--calibrate-limit", type=int, default=16,
                   help="answers of --calibrate to run (default 16)")
    p.add_argument("--model", help="the draft's target, id or GGUF (default: the offline "
                   "default pair's); needed with --calibrate")
    args = p.parse_args()
    if args.calibrate and not args.calibrate.is_file():
        raise SystemExit(f"--calibrate {args.calibrate}: no such file. Fix: pass a training "
                         "answers .npz (the Qwen pair's are in git history: see "
                         "docs/training.md).")
    stored_quantization(args.src, args.requantize)  # refused before a calibration, not after
    hessians = (calibration_hessians(args.src, args.model, args.calibrate,
                                     args.calibrate_limit) if args.calibrate else None)
    sizes = quantize_draft(args.src, args.dst, args.bits, args.group_size, args.requantize,
                           hessians)
    print(f"wrote {args.dst}: model.safetensors {sizes['bytes_before'] / 1e6:.1f} MB -> "
          f"{sizes['bytes_after'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
