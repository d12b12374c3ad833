"""A draft folder from what a GPU training call sends back: the meta tar (config, token
ranking, training log) and the weights in halves (a call's files come back under 16 MB each;
benchmarks/train-smollm2-x2.sh `pack`).

    python scripts/unpack_draft.py ~/.cache/dflash-chat/train-data/stage21/half2 /tmp/draft21
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402,F401,I001  (first: the fast CPU BLAS)
import mlx.core as mx  # noqa: E402
from engine.train.loop import CHECKPOINT_METADATA  # noqa: E402


def unpack(src: Path, dst: Path) -> int:
    """-> the number of weight tensors written to dst/model.safetensors."""
    halves = sorted(src.glob("draft-weights-*.safetensors"))
    if not (src / "draft-meta.tar").is_file() or not halves:
        raise SystemExit(f"{src}: needs draft-meta.tar and draft-weights-*.safetensors")
    dst.mkdir(parents=True, exist_ok=True)
    with tarfile.open(src / "draft-meta.tar") as tar:
        tar.extractall(dst, filter="data")
    weights: dict[str, mx.array] = {}
    for half in halves:
        part = mx.load(str(half))
        if overlap := weights.keys() & part.keys():
            raise SystemExit(f"{half}: tensors also in another half: {sorted(overlap)[:3]}")
        weights.update(part)
    mx.save_safetensors(str(dst / "model.safetensors"), weights, metadata=CHECKPOINT_METADATA)
    return len(weights)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="folder with draft-meta.tar and the weight halves")
    p.add_argument("dst", type=Path, help="the draft folder to write")
    args = p.parse_args(argv)
    n = unpack(args.src, args.dst)
    print(f"{args.dst}: {n} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
