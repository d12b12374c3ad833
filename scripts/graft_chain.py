"""A draft folder with another draft's token chain: BASE's files and stored weights as they
are, plus CHAINED's `chain.*` tensors and its chain settings in config.json.

    python scripts/graft_chain.py CHAINED BASE DST

For a chain trained on BASE frozen (`dflash train-draft --init BASE --chain U --chain-only`):
the checkpoint stores BASE's weights again, requantized where BASE was stored quantized, which
moves them slightly; grafting keeps BASE's bytes, so where the engine leaves the chain off
(`--token-chain`, off by default) the grafted draft proposes exactly what BASE does.
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

# What the chain was trained against: a base that differs in these is another draft.
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
DFLASH_KEYS = ("block_size", "target_layer_ids", "mask_token_id")
CHAIN_KEYS = ("chain_units", "chain_candidates")


def graft_chain(chained: Path, base: Path, dst: Path) -> dict:
    """Write BASE with CHAINED's chain to DST -> {"chain_tensors", "bytes"}; SystemExit naming
    the problem where CHAINED has no chain or was trained on another kind of draft."""
    chained_config = json.loads((chained / "config.json").read_text())
    base_config = json.loads((base / "config.json").read_text())
    chain_settings = {k: chained_config.get("dflash_config", {}).get(k) for k in CHAIN_KEYS}
    if not chain_settings["chain_units"]:
        raise SystemExit(f"{chained} has no token chain (no chain_units in its config.json). "
                         "Fix: pass a draft trained with --chain.")
    differ = [k for k in SHAPE_KEYS if chained_config.get(k) != base_config.get(k)]
    differ += [k for k in DFLASH_KEYS if chained_config.get("dflash_config", {}).get(k)
               != base_config.get("dflash_config", {}).get(k)]
    if differ:
        raise SystemExit(f"{chained} and {base} differ in {', '.join(differ)}: the chain was "
                         "trained on another draft. Fix: graft onto the draft it was trained on.")
    if dst.resolve() in (chained.resolve(), base.resolve()):
        raise SystemExit(f"{dst} is one of the inputs. Fix: write to a new folder.")
    weights = mx.load(str(chained / "model.safetensors"))
    chain = {k: v for k, v in weights.items() if k.startswith("chain.")}
    chain_storage = (chained_config.get("quantization")
                     if any(k.endswith(".scales") for k in chain) else None)
    if chain_storage != base_config.get("quantization"):
        raise SystemExit(f"{chained}'s chain is stored as {chain_storage or 'floats'}, {base} as "
                         f"{base_config.get('quantization') or 'floats'}. Fix: store both alike "
                         "(scripts/quantize_draft.py).")
    dst.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy2(f, dst / f.name)
    base_weights = mx.load(str(base / "model.safetensors"))
    mx.save_safetensors(str(dst / "model.safetensors"), {**base_weights, **chain},
                        metadata={"format": "mlx", "producer": "scripts/graft_chain.py"})
    base_config.setdefault("dflash_config", {}).update(chain_settings)
    (dst / "config.json").write_text(json.dumps(base_config, indent=2))
    return {"chain_tensors": len(chain), "bytes": (dst / "model.safetensors").stat().st_size}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("chained", type=Path, help="the draft folder whose token chain to take")
    p.add_argument("base", type=Path, help="the draft folder it was trained on (kept as is)")
    p.add_argument("dst", type=Path, help="the new draft folder")
    args = p.parse_args(argv)
    out = graft_chain(args.chained, args.base, args.dst)
    print(f"{args.dst}: {out['chain_tensors']} chain tensors on {args.base}'s weights, "
          f"{out['bytes'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
