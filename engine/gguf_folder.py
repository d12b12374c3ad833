"""A GGUF with k-quant tensors (Q4_K, Q6_K, ...), converted once into an mlx-lm folder.

MLX cannot read k-quants, and the gguf package's numpy dequantizers take most of a minute for
a 1.5B model, so the first load writes a folder in the cache: Q4_K tensors as MLX affine 4-bit
layers (group 32, float32 scales and biases: the very same weights, bit for bit), every other
tensor dequantized to float32, the tokenizer and config beside them. Later starts read that
folder. Its stamp names the source GGUF (size, mtime) and each file's size; a stale or damaged
folder is converted again. Numpy only (engine/gguf.py, the caller, supplies the tensor names
and the tokenizer).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelNotAvailable

Q4_K = 12
FOLDER_VERSION = 1  # bump to convert cached folders again
WEIGHTS = "model.safetensors"
Progress = Callable[[str, "float | None"], None]


def folder_for(path: Path) -> Path:
    from .cache import cache_root

    return cache_root() / "gguf-mlx" / f"{path.stem}-{path.stat().st_size}"


def source_of(path: Path) -> dict[str, int]:
    stat = path.stat()
    return {"version": FOLDER_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def is_current(folder: Path, path: Path) -> bool:
    """Cheap: the stamp names this GGUF and every file has the size it was written with."""
    try:
        stamp = json.loads((folder / "source.json").read_text())
        return stamp["source"] == source_of(path) and all(
            (folder / name).stat().st_size == size for name, size in stamp["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def converted_folder(path: Path, args: dict[str, Any], name_of: Callable[[str], str],
                     fix_rows: Callable[[str, np.ndarray], np.ndarray],
                     write_tokenizer: Callable[[Path], None],
                     progress: Progress | None = None) -> Path:
    """The mlx-lm folder made from `path` (converted now if missing, stale or damaged): `args`
    its config, `name_of` a GGUF tensor name's mlx-lm name, `fix_rows(name, array)` reorders
    a tensor's rows (llama's q/k), `write_tokenizer(folder)` writes the tokenizer files."""
    folder = folder_for(path)
    if is_current(folder, path):
        return folder
    say = progress or (lambda message, fraction=None: None)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=folder.parent))
    try:
        convert(path, tmp, args, name_of, fix_rows, say)
        write_tokenizer(tmp)
        files = {f.name: f.stat().st_size for f in tmp.iterdir()}
        (tmp / "source.json").write_text(json.dumps({"source": source_of(path),
                                                     "files": files}))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except OSError as exc:
        raise ModelNotAvailable(
            f"cannot write the converted {path.name} to {folder.parent} ({exc}). Fix: free disk "
            "space there (about 2.5x the GGUF), or set DFLASH_CACHE_DIR to another folder."
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def convert(path: Path, folder: Path, args: dict[str, Any], name_of: Callable[[str], str],
            fix_rows: Callable[[str, np.ndarray], np.ndarray], say: Progress) -> None:
    """The weights (`WEIGHTS`) and config.json of the mlx-lm folder."""
    import gguf
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    reader = gguf.GGUFReader(path)

    def converted(tensor: Any) -> dict[str, np.ndarray]:
        name = name_of(tensor.name)
        raw = np.asarray(tensor.data)
        if tensor.tensor_type == Q4_K:
            module = name.removesuffix(".weight")
            return {f"{module}.{key}": np.ascontiguousarray(fix_rows(name, array))
                    for key, array in zip(("weight", "scales", "biases"), q4k_affine(raw))}
        dense = dequantize(raw, tensor.tensor_type).astype(np.float32, copy=False)
        return {name: np.ascontiguousarray(fix_rows(name, dense))}

    # numpy lets go of the GIL in its array work: tensors convert side by side, one per core
    weights: dict[str, np.ndarray] = {}
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for i, arrays in enumerate(pool.map(converted, reader.tensors)):
            say(f"converting {path.name} for MLX (once)", i / len(reader.tensors))
            weights.update(arrays)
    args = {**args, "vocab_size": int(weights["model.embed_tokens.weight"].shape[0])}
    if any(t.tensor_type == Q4_K for t in reader.tensors):
        args["quantization"] = {"group_size": 32, "bits": 4, "mode": "affine"}
    say(f"writing the converted {path.name}", None)
    save_file(weights, str(folder / WEIGHTS))
    (folder / "config.json").write_text(json.dumps(args, indent=1))


def q4k_affine(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K rows [R, bytes] -> MLX affine 4-bit (packed uint32 [R, C/8], scales and biases
    float32 [R, C/32]). A Q4_K weight is d*sc*q - dmin*m per 32 values: scale d*sc and bias
    -dmin*m are exact in float32, so MLX's q*scale + bias rounds exactly as the gguf package's
    dequantizer does."""
    from gguf.quants import Q4_K as Q4K

    rows = raw.shape[0]
    blocks = raw.reshape(-1, 144)  # d, dmin (fp16), 12 bytes of 6-bit scales/mins, 128 of q
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = Q4K.get_scale_min(blocks[:, 4:16])
    scales = (d * sc.astype(np.float32)).reshape(rows, -1)
    biases = (-(dmin * m.astype(np.float32))).reshape(rows, -1)
    # each 32 bytes hold two groups: the low nibbles, then the high ones
    q = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (q & 0x0F).astype(np.uint32).reshape(-1, 8)  # 8 values per uint32, first lowest
    packed = np.zeros(q.shape[0], np.uint32)
    for k in range(8):
        packed |= q[:, k] << np.uint32(4 * k)
    return packed.reshape(rows, -1), scales, biases
