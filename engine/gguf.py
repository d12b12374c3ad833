"""Load a llama or qwen2 GGUF (llama.cpp's format) as an mlx-lm model + tokenizer.

Two ways to hold the weights. Dequantized (`quantized=False`, the CPU's way): on CPU, MLX's
quantized matmuls are far slower than plain fp32 ones with a fast BLAS. At checkpoint precision
(`quantized=True`, GPUs and Metal): Q4_0/Q4_1/Q8_0 tensors stay as MLX affine 4/8-bit layers at
group size 32 (`mx.load` reads them into exactly that layout: Q4_1 is MLX's affine format, and
Q4_0/Q8_0 are affine with a bias of -8 / -128 scales), so the same weights run at a quarter of
the memory traffic. F32/F16/Q4_0/Q4_1/Q8_0 tensors load through `mx.load` (fast). MLX mis-reads
or refuses the other types (Q4_K, Q6_K, Q5_0, ...): such a file is converted once, through the
`gguf` package's dequantizers, into an mlx-lm folder in the cache (engine/gguf_folder.py), and
always loads dequantized.

The tokenizer is rebuilt from the GGUF metadata with transformers' GGUF converter (no torch) and
written once as a tokenizer folder next to the GGUF, which mlx-lm then loads like any other.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map, tree_unflatten
from mlx_lm.tokenizer_utils import TokenizerWrapper

from .errors import ModelNotAvailable, UnsupportedModel

# ggml type ids: the ones `mx.load` reads correctly (Q4_0/Q4_1/Q8_0 as packed uint32 + scales).
F32, F16, Q4_0, Q4_1, Q8_0 = 0, 1, 2, 3, 8
MLX_TYPES = {F32, F16, Q4_0, Q4_1, Q8_0}
GROUP = 32  # block size of Q4_0/Q4_1/Q8_0
TOKENIZER_VERSION = 2  # bump to rebuild cached tokenizer folders
Progress = Callable[[str, "float | None"], None]

# GGUF metadata value types -> struct format (8 = string, 9 = array are handled apart).
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}


def load_gguf_target(path: Path, dtype: str | None = None, quantized: bool = False,
                     progress: Progress | None = None) -> tuple[nn.Module, TokenizerWrapper]:
    """An mlx-lm llama `Model` and its tokenizer.

    `quantized=False`: every weight dequantized to `dtype` (None: float32, fast on CPU with
    BLAS). `quantized=True`: Q4_0/Q4_1/Q8_0 weights kept as MLX affine quantized layers, the
    float tensors (scales, biases, norms) in `dtype` (None: float16, the dtype the GGUF stores
    its scales in, so the weights are exactly the file's); that dtype is the activations'.
    A GGUF with other types (k-quants) loads through its converted folder (`_load_converted`).
    """
    path = Path(path).expanduser()
    metadata, types = read_header(path)
    args = model_args(metadata, types, path)
    if not all(t in MLX_TYPES for t in types.values()):
        return _load_converted(path, metadata, args, dtype, quantized, progress)
    keep = quantized and all(t in MLX_TYPES for t in types.values())
    target = getattr(mx, dtype) if dtype else (mx.float16 if keep else default_dtype())
    weights, bits = load_weights(path, types, args, target, keep)
    model = build_model(args)
    if bits:
        nn.quantize(model, class_predicate=lambda p, m: p in bits and {
            "group_size": GROUP, "bits": bits[p], "mode": "affine"})
    model.load_weights(list(weights.items()), strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model, load_tokenizer(path, metadata)


def _load_converted(path: Path, metadata: dict[str, Any], args: dict[str, Any],
                    dtype: str | None, quantized: bool, progress: Progress | None
                    ) -> tuple[nn.Module, TokenizerWrapper]:
    """A k-quant GGUF through the mlx-lm folder converted once (engine/gguf_folder.py), every
    weight dequantized: to `dtype`, else float32 on the CPU and bfloat16 where the caller asks
    for checkpoint precision (GPUs: MLX has no k-quant kernels, and there a dense 16-token
    verify costs less against a 1-token step than a 4-bit one)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer_folder
    from mlx_lm.utils import load_model

    from .gguf_folder import converted_folder

    def write_tokenizer(folder: Path) -> None:
        build_backend_tokenizer(metadata).save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(metadata)))

    def fix_rows(name: str, rows: np.ndarray) -> np.ndarray:  # llama.cpp permutes llama's
        if args["model_type"] == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = args["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            return unpermute(rows, heads)
        return rows

    try:
        folder = converted_folder(path, args, lambda name: _mlx_name(name, path), fix_rows,
                                  write_tokenizer, progress)
        model, _ = load_model(folder, lazy=True)
    except (ValueError, RuntimeError, KeyError, IndexError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotAvailable(
            f"{path}: damaged GGUF ({detail}). Fix: download it again; a partial or corrupt "
            "copy looks like this."
        ) from exc
    target = getattr(mx, dtype) if dtype else (mx.bfloat16 if quantized else default_dtype())
    dense_layers(model, target)
    model.update(tree_map(lambda p: p.astype(target) if mx.issubdtype(p.dtype, mx.floating)
                          else p, model.parameters()))
    model.eval()
    mx.eval(model.parameters())
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    return model, load_tokenizer_folder(folder, eos_token_ids=[eos] if eos is not None else None)


def dense_layers(model: nn.Module, dtype: mx.Dtype) -> None:
    """Every affine group-32 quantized layer of `model` as a plain one in `dtype`, with
    `dequantize` (exact, and faster on CPU than mx.dequantize). On a CPU most of the time is
    the kernel handing the process fresh pages for the float weights, so the layers alternate
    between two CPU streams, two layers in flight at a time: both cores take the faults."""
    quantized = [(name, module) for name, module in model.named_modules()
                 if isinstance(module, nn.QuantizedLinear | nn.QuantizedEmbedding)]
    on_cpu = mx.default_device() == mx.cpu
    streams = [mx.new_stream(mx.cpu) for _ in range(2)] if on_cpu else [mx.default_stream(
        mx.default_device())]
    dense, weights = [], []
    for i, (name, module) in enumerate(quantized):
        with mx.stream(streams[i % len(streams)]):
            weight = dequantize(module.weight, module.scales, module.biases).astype(dtype)
        weights.append(weight)
        if len(weights) == len(streams) or i == len(quantized) - 1:
            mx.eval(*weights)
            weights = []
        if isinstance(module, nn.QuantizedEmbedding):
            layer = nn.Embedding(*weight.shape)
        else:
            layer = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in module)
            if "bias" in module:
                layer.bias = module.bias
        layer.weight = weight
        dense.append((name, layer))
    if dense:
        model.update_modules(tree_unflatten(dense))


def build_model(args: dict[str, Any]) -> nn.Module:
    """An empty mlx-lm model of `model_args`' architecture."""
    from importlib import import_module

    module = import_module(f"mlx_lm.models.{args['model_type']}")
    return module.Model(module.ModelArgs(**args))


def default_dtype() -> mx.Dtype:
    # float32 everywhere: the fast dtype on CPU, cheap for a small GGUF model on a GPU, and
    # the one where a 16-token verify and 1-token decoding agree exactly (bf16 rounding flips
    # near-ties: measured on the H200, benchmarks/smollm2-humaneval-bf16-h200.json).
    return mx.float32


# ---------------------------------------------------------------------------------------------
# Header


def read_header(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """(metadata, {tensor name: ggml type}) read straight from the file, no tensor data."""
    if not path.is_file():
        raise ModelNotAvailable(f"{path}: no such GGUF file. Fix: check the path.")
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_header(buf)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelNotAvailable(
            f"{path}: not a readable GGUF file ({exc}). Fix: re-download it; a partial or "
            "corrupt download looks like this."
        ) from exc


def _parse_header(buf: mmap.mmap) -> tuple[dict[str, Any], dict[str, int]]:
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF" or version < 2:
        raise ValueError(f"bad magic {magic!r} or unsupported version {version}")
    pos, metadata = 24, {}
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        metadata[key], pos = _value(buf, pos, vtype)
    types = {}
    for _ in range(n_tensors):
        name, pos = _string(buf, pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * n_dims
        (types[name],) = struct.unpack_from("<I", buf, pos)
        pos += 12  # type (u32) + data offset (u64)
    return metadata, types


def _string(buf: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8 : pos + 8 + n].decode("utf-8"), pos + 8 + n


def _value(buf: mmap.mmap, pos: int, vtype: int) -> tuple[Any, int]:
    if vtype in _SCALAR:
        fmt = "<" + _SCALAR[vtype]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if vtype == 8:
        return _string(buf, pos)
    if vtype != 9:
        raise ValueError(f"unknown metadata value type {vtype}")
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in _NUMPY:
        arr = np.frombuffer(buf, dtype=_NUMPY[etype], count=count, offset=pos).copy()
        return arr.tolist(), pos + arr.nbytes
    items = []
    for _ in range(count):
        item, pos = _value(buf, pos, etype)
        items.append(item)
    return items, pos


# ---------------------------------------------------------------------------------------------
# Model


ARCHITECTURES = ("llama", "qwen2")


def model_args(metadata: dict[str, Any], types: dict[str, int], path: Path) -> dict[str, Any]:
    """mlx-lm `ModelArgs` fields (llama or qwen2) from the `<architecture>.*` metadata."""
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModel(
            f"{path}: GGUF architecture {arch!r} is not supported (only llama: Llama, SmolLM, "
            "TinyLlama, ...; and qwen2: Qwen2, Qwen2.5). Fix: use such a GGUF or the model's "
            "HF safetensors."
        )

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise UnsupportedModel(f"{path}: GGUF metadata lacks {arch}.{key}. Fix: re-convert "
                                   "it.")
        return value

    hidden, heads = get("embedding_length"), get("attention.head_count")
    scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise UnsupportedModel(f"{path}: rope scaling {scaling!r} is not supported.")
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    args = dict(
        model_type=arch,
        hidden_size=hidden,
        num_hidden_layers=get("block_count"),
        intermediate_size=get("feed_forward_length"),
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon"),
        vocab_size=get("vocab_size", len(tokens)),
        max_position_embeddings=get("context_length"),
        rope_theta=get("rope.freq_base", 10000.0),
        # llama: we undo llama.cpp's q/k permutation, back to HF's layout; qwen2 has none
        rope_traditional=False,
        rope_scaling=({"type": "linear", "factor": get("rope.scaling.factor")}
                      if scaling == "linear" else None),
        tie_word_embeddings="output.weight" not in types,
    )
    if arch == "llama":  # qwen2 derives head_dim from hidden / heads
        args["head_dim"] = get("attention.key_length", hidden // heads)
    return args


def load_weights(path: Path, types: dict[str, int], args: dict[str, Any], dtype: mx.Dtype,
                 quantized: bool = False) -> tuple[dict[str, mx.array], dict[str, int]]:
    """-> (mlx-lm parameter name -> weight, q/k rows back in HF order; module path -> bits of
    the layers kept quantized). `quantized`: Q4_0/Q4_1/Q8_0 tensors stay packed, with their
    scales and biases in `dtype`; otherwise every weight is dequantized to `dtype`."""
    try:
        raw = _load_with_mlx(path, types, quantized)
    except (ValueError, RuntimeError, OSError, KeyError, IndexError) as exc:
        # A truncated or damaged file: mx.load says e.g. "Tensor ... extends past the end".
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotAvailable(
            f"{path}: damaged GGUF ({detail}). Fix: download it again; a partial or corrupt "
            "copy looks like this."
        ) from exc
    weights, bits = {}, {}
    for name, w in raw.items():
        if name == "rope_freqs.weight":
            raise UnsupportedModel(f"{path}: llama3-style rope_freqs are not supported.")
        mlx_name = _mlx_name(name, path)
        module = mlx_name.removesuffix(".weight")
        parts = w if isinstance(w, tuple) else (w,)
        # llama's q/k rows (output features) back in HF order: packed rows, scales and biases
        # alike (llama.cpp permutes only llama's).
        if args["model_type"] == "llama" and mlx_name.endswith("q_proj.weight"):
            parts = tuple(unpermute(p, args["num_attention_heads"]) for p in parts)
        elif args["model_type"] == "llama" and mlx_name.endswith("k_proj.weight"):
            parts = tuple(unpermute(p, args["num_key_value_heads"]) for p in parts)
        if len(parts) == 3:
            packed, scales, biases = parts
            bits[module] = packed.shape[-1] * 32 // (scales.shape[-1] * GROUP)
            weights[mlx_name] = packed
            weights[f"{module}.scales"] = scales.astype(dtype)
            weights[f"{module}.biases"] = biases.astype(dtype)
        else:
            weights[mlx_name] = parts[0].astype(dtype)
    # The embedding's rows are the model's vocabulary (the token list may be shorter).
    args["vocab_size"] = weights["model.embed_tokens.weight"].shape[0]
    return weights, bits


def _mlx_name(name: str, path: Path) -> str:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise UnsupportedModel(f"{path}: unexpected tensor {name!r} for a llama or qwen2 GGUF.")


def unpermute(w: Any, n_head: int) -> Any:
    """Invert convert_hf_to_gguf's `permute` of q/k rows (interleaved -> half-split rope), of
    an mx or numpy array."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _load_with_mlx(path: Path, types: dict[str, int], quantized: bool = False
                   ) -> dict[str, mx.array | tuple[mx.array, mx.array, mx.array]]:
    """name -> fp32 tensor, or with `quantized` (packed, scales, biases) for quantized ones."""
    arrays = mx.load(str(path))
    out: dict[str, mx.array | tuple[mx.array, mx.array, mx.array]] = {}
    for name in types:
        base = name.removesuffix(".weight")
        if f"{base}.scales" not in arrays:
            out[name] = arrays[name].astype(mx.float32)
            continue
        packed, scales, biases = (arrays[name], arrays[f"{base}.scales"],
                                  arrays[f"{base}.biases"])
        out[name] = (packed, scales, biases) if quantized else dequantize(packed, scales,
                                                                          biases)
    return out


def dequantize(packed: mx.array, scales: mx.array, biases: mx.array) -> mx.array:
    """fp32 weights from MLX's affine layout (group 32), as `mx.load` gives Q4_0/Q4_1/Q8_0.

    Not `mx.dequantize`: that rounds to the scales' fp16, and on CPU it is 2x slower than this.
    """
    bits = packed.shape[-1] * 32 // (scales.shape[-1] * GROUP)
    shifts = mx.arange(0, 32, bits, dtype=mx.uint32)
    q = (packed[..., None] >> shifts) & ((1 << bits) - 1)
    q = q.reshape(*scales.shape, GROUP).astype(mx.float32)
    w = q * scales[..., None].astype(mx.float32) + biases[..., None].astype(mx.float32)
    return w.reshape(*scales.shape[:-1], -1)


# ---------------------------------------------------------------------------------------------
# Tokenizer


def load_tokenizer(path: Path, metadata: dict[str, Any]) -> TokenizerWrapper:
    """mlx-lm's TokenizerWrapper over a tokenizer folder built once from the GGUF metadata."""
    from mlx_lm.tokenizer_utils import load as load_folder

    folder = tokenizer_folder(path, metadata)
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    return load_folder(folder, eos_token_ids=[eos] if eos is not None else None)


def tokenizer_folder(path: Path, metadata: dict[str, Any]) -> Path:
    """`<gguf>.tokenizer/` (or one in the cache if that is read-only), rebuilt when stale or
    damaged: its stamp names the GGUF it came from and the sha256 of each file written."""
    from .cache import cache_root, sha256_file

    source = tokenizer_source(path)
    folders = (path.with_name(path.name + ".tokenizer"),
               cache_root() / "gguf-tokenizers" / f"{path.name}-{source['size']}")
    for folder in folders:
        stamp = _read_stamp(folder)
        files = stamp.get("files") if stamp and stamp.get("source") == source else None
        try:
            if files and all(sha256_file(folder / n) == d for n, d in files.items()):
                return folder
        except OSError:
            pass  # a file is missing or unreadable: rebuild
        try:
            _write_tokenizer(folder, metadata, source)
            return folder
        except OSError:
            continue
    raise ModelNotAvailable(
        f"{path}: cannot write its tokenizer next to it or in {folders[1].parent}. Fix: make "
        "one of them writable, or set DFLASH_CACHE_DIR to a writable folder."
    )


def tokenizer_source(path: Path) -> dict:
    """What a tokenizer folder's stamp records of the GGUF it was built from."""
    stat = path.stat()
    return {"version": TOKENIZER_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def stamp_tokenizer(folder: Path, source: dict) -> None:
    """Write `folder`'s stamp: built from `source`, with the sha256 of each file."""
    from .cache import sha256_file

    files = {n: sha256_file(folder / n) for n in ("tokenizer.json", "tokenizer_config.json")}
    (folder / "source.json").write_text(json.dumps({"source": source, "files": files}))


def _read_stamp(folder: Path) -> dict | None:
    try:
        stamp = json.loads((folder / "source.json").read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _write_tokenizer(folder: Path, metadata: dict[str, Any], source: dict) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=folder.parent))
    try:
        build_backend_tokenizer(metadata).save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(metadata)))
        stamp_tokenizer(tmp, source)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def tokenizer_config(metadata: dict[str, Any]) -> dict[str, Any]:
    tokens = metadata["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if index is not None and index < len(tokens) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"), "eos_token": token("eos"), "unk_token": token("unknown"),
        "pad_token": token("padding"),
        # llama.cpp defaults add_bos to true for sentencepiece ("llama") vocabularies only.
        "add_bos_token": metadata.get("tokenizer.ggml.add_bos_token",
                                      metadata.get("tokenizer.ggml.model") == "llama"),
        "add_eos_token": metadata.get("tokenizer.ggml.add_eos_token", False),
        "model_max_length": metadata.get(
            f"{metadata.get('general.architecture', 'llama')}.context_length", 4096),
        "clean_up_tokenization_spaces": False,
    }
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config


def build_backend_tokenizer(metadata: dict[str, Any]) -> Any:
    """A `tokenizers.Tokenizer` from `tokenizer.ggml.*`, via transformers' converter (no torch)."""
    from tokenizers import pre_tokenizers

    model = metadata.get("tokenizer.ggml.model")
    tok_dict = {
        "tokenizer_type": model,
        "pre_tokenizer_type": metadata.get("tokenizer.ggml.pre"),
        "tokens": metadata["tokenizer.ggml.tokens"],
        "token_type": metadata.get("tokenizer.ggml.token_type"),
    }
    if "tokenizer.ggml.add_space_prefix" in metadata:  # absent: the converters' own default
        tok_dict["add_prefix_space"] = metadata["tokenizer.ggml.add_space_prefix"]
    for key, name in (("merges", "merges"), ("scores", "scores")):
        if f"tokenizer.ggml.{key}" in metadata:
            tok_dict[name] = metadata[f"tokenizer.ggml.{key}"]
    try:
        backend = _convert(metadata.get("general.architecture", "llama"), tok_dict)
    except (KeyError, ValueError) as exc:
        raise UnsupportedModel(f"GGUF tokenizer {model!r} is not supported ({exc}).") from exc
    if tok_dict["pre_tokenizer_type"] == "smollm":
        # As SmolLM2's own tokenizer.json: digits split one by one, then GPT-2 byte-level.
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    return backend


def _convert(architecture: str, tok_dict: dict[str, Any]) -> Any:
    try:  # the later transformers 5 layout; this module imports no torch (its siblings do)
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:
        try:  # the earlier transformers 5 releases kept it here
            from transformers.integrations.ggml import convert_gguf_tokenizer
        except ImportError as exc:
            raise UnsupportedModel(
                "building a tokenizer from a GGUF needs transformers >= 5. "
                "Fix: pip install -U 'transformers>=5'"
            ) from exc
    return convert_gguf_tokenizer(architecture, tok_dict)[0]
