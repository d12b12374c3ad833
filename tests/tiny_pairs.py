"""Test support: tiny random target + draft pairs written to disk (no network).

They load through the same code as real checkpoints: mlx-lm for the target folder, the
z-lab layout for the draft folder. Lives in tests/, not in the shipped package.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from engine.cycle import DraftProposer
from engine.dflash2 import DFlash2Args, DFlash2Draft, stored_weights
from engine.draft import DFlashDraft, DraftArgs, default_tap_ids

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Speculative decoding drafts tokens and the target verifies them.",
    "What is 12 times 7? It is 84.",
    "Hello! How can I help you today?",
]

TARGET_CONFIGS = {
    "llama": {
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
    },
    "qwen3": {
        "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 4,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": False,
    },
    "qwen3_5": {
        "model_type": "qwen3_5", "hidden_size": 64, "num_hidden_layers": 4,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "rms_norm_eps": 1e-6, "linear_num_value_heads": 4,
        "linear_num_key_heads": 2, "linear_key_head_dim": 32, "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
        "tie_word_embeddings": False, "max_position_embeddings": 4096,
        "rope_parameters": {"type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]},
    },
}


def build_tokenizer(out_dir: Path) -> int:
    """A small byte-level BPE with chat specials; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token=None,
        pad_token="<|endoftext|>", unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return tok.get_vocab_size()


def _init_weights(model: nn.Module, seed: int, scale: float = 0.08) -> None:
    """Gaussian weights big enough that greedy output varies from token to token."""
    mx.random.seed(seed)
    params = []
    for name, p in tree_flatten(model.parameters()):
        if name.endswith("norm.weight") or p.ndim == 1:
            params.append((name, p))
        else:
            params.append((name, mx.random.normal(p.shape) * scale))
    model.load_weights(params)


# The output projections of a layer's token mixer (attention, GatedDeltaNet): what carries
# the context into a position's next-token choice.
MIXER_OUTPUTS = ("self_attn.o_proj.weight", "linear_attn.out_proj.weight")
REPEATING = 0.1  # a `mixing` at which every family's seed-0 replies repeat within 200 tokens


def make_tiny_target(out_dir: Path, family: str = "llama", seed: int = 0,
                     mixing: float = 1.0) -> Path:
    """A tiny random target of `family`, the same for a seed whatever ran before (parameters
    that mlx-lm draws when it builds a model, such as GatedDeltaNet's A_log, included).
    `mixing` scales the token mixers' outputs: small (REPEATING), the next token depends
    mostly on the current one, so greedy replies soon repeat what came before (matches for
    the suffix lookup) while the caches still matter."""
    from mlx_lm.utils import _get_classes

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out_dir)
    config = dict(TARGET_CONFIGS[family], vocab_size=vocab)
    if family == "qwen3_5":
        config = {"model_type": "qwen3_5", "text_config": config}
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    _init_weights(model, seed)
    if mixing != 1.0:
        model.load_weights([(name, p * mixing) for name, p in tree_flatten(model.parameters())
                            if name.endswith(MIXER_OUTPUTS)], strict=False)
    mx.save_safetensors(str(out_dir / "model.safetensors"),
                        dict(tree_flatten(model.parameters())))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def tiny_draft_args(target_config: dict, vocab: int, mask_id: int, layers: int = 2,
                    block_size: int = 16, taps: int = 2) -> DraftArgs:
    cfg = target_config.get("text_config", target_config)
    n_target = cfg["num_hidden_layers"]
    return DraftArgs(
        hidden_size=cfg["hidden_size"], num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128,
        num_target_layers=n_target,
        target_layer_ids=default_tap_ids(n_target, taps) if n_target > 5 else [1, n_target - 2],
        mask_token_id=mask_id, block_size=block_size, vocab_size=vocab,
    )


def save_draft(draft: DFlashDraft, out_dir: Path) -> Path:
    """Write a draft in the published layout: config.json + model.safetensors, no prefix."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(draft.args.to_config(), indent=2))
    mx.save_safetensors(str(out_dir / "model.safetensors"),
                        dict(tree_flatten(draft.parameters())))
    return out_dir


def make_tiny_pair(tmp_dir: Path, family: str = "llama", seed: int = 0,
                   block_size: int = 16, mixing: float = 1.0) -> tuple[Path, Path]:
    """-> (target_dir, draft_dir) loadable by DFlashRuntime.from_pretrained(model=, draft=);
    `mixing` as for make_tiny_target."""
    tmp_dir = Path(tmp_dir)
    name = f"tiny-{family}" if mixing == 1.0 else f"tiny-{family}-mixing{mixing:g}"
    target_dir = make_tiny_target(tmp_dir / name, family, seed, mixing)
    config = json.loads((target_dir / "config.json").read_text())
    tok = json.loads((target_dir / "tokenizer.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]
    mask_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|mask|>")
    draft = DFlashDraft(tiny_draft_args(config, vocab, mask_id, block_size=block_size))
    _init_weights(draft, seed + 1)
    return target_dir, save_draft(draft, tmp_dir / f"{name}-dflash")


def tiny_dflash2_args(target_config: dict, vocab: int, mask_id: int, block_size: int = 8,
                      window: int | None = 6, layer_types: list[str] | None = None,
                      is_causal: bool | None = False, top_k: int = 8, rank: int = 16,
                      **scales: float) -> DFlash2Args:
    """A small DFlash2 draft's args in the published shape: every layer in a sliding window
    (`window` None: full attention) with a bidirectional block, unless told otherwise;
    `scales`: input_embedding_scale, output_multiplier, final_logit_softcapping."""
    base = vars(tiny_draft_args(target_config, vocab, mask_id, block_size=block_size))
    base.update(layer_types=layer_types or [
        "sliding_attention" if window else "full_attention"] * base["num_hidden_layers"],
        sliding_window=window, rope_theta=10000.0, is_causal=is_causal, extra={})
    return DFlash2Args(**base, conv_kernel_size=2, conv_group_size=16, selector_rank=rank,
                       selector_top_k=top_k, **scales)


def save_dflash2(draft: DFlash2Draft, out_dir: Path) -> Path:
    """Write a DFlash2 draft in z-lab's layout: config.json + model.safetensors, the selector's
    codebooks stored without `.weight`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(draft.args.to_config(), indent=2))
    mx.save_safetensors(str(out_dir / "model.safetensors"),
                        stored_weights(dict(tree_flatten(draft.parameters()))))
    return out_dir


SELECTOR_SCALE = 1.0  # codebooks this large make the edges move the path off the argmax


def make_tiny_dflash2(tmp_dir: Path, family: str = "llama", seed: int = 0,
                      name: str = "dflash2", **shape) -> tuple[Path, Path]:
    """-> (target_dir, draft_dir): the tiny `family` target (as make_tiny_pair's) and a
    random-weight DFlash2 draft for it in z-lab's layout; `shape` as for tiny_dflash2_args."""
    tmp_dir = Path(tmp_dir)
    target_dir = tmp_dir / f"tiny-{family}"
    if not (target_dir / "model.safetensors").is_file():
        make_tiny_target(target_dir, family, seed)
    config = json.loads((target_dir / "config.json").read_text())
    tok = json.loads((target_dir / "tokenizer.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]
    mask_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == "<|mask|>")
    draft = DFlash2Draft(tiny_dflash2_args(config, vocab, mask_id, **shape))
    _init_weights(draft, seed + 2)
    selector = draft.candidate_selector
    for book in (selector.predecessor_codebook, selector.successor_codebook):
        book.weight = book.weight * (SELECTOR_SCALE / 0.08)
    mx.eval(draft.parameters())
    return target_dir, save_dflash2(draft, tmp_dir / f"tiny-{family}-{name}")


def sliding_dflash(target_dir: Path, draft_dir: Path, out_dir: Path, window: int = 6,
                   seed: int = 5) -> Path:
    """A random DFlash draft like `draft_dir`'s with the layers of z-lab's newer DFlash drafts:
    a sliding window (`window`) then full attention, no `is_causal` (so the sliding layer's
    block is causal)."""
    args = DraftArgs.from_config(json.loads((draft_dir / "config.json").read_text()))
    args.layer_types, args.sliding_window = ["sliding_attention", "full_attention"], window
    draft = DFlashDraft(args)
    _init_weights(draft, seed)
    return save_draft(draft, out_dir)


class TruthOracle(DraftProposer):
    """Proposes the target's own continuation `truth`, wrong from draft slot `error_at` on
    (None: never); the draft's context still follows every commit."""

    def __init__(self, rt, truth, error_at=None):
        super().__init__(rt.target, rt.draft)
        self.truth, self.error_at = truth, error_at

    def propose(self, staged, size, position):
        drafted = list(self.truth[position + 1: position + size])
        drafted += [0] * (size - 1 - len(drafted))
        if self.error_at is not None and self.error_at < len(drafted):
            drafted[self.error_at] = (drafted[self.error_at] + 1) % 50
        return mx.array([[staged] + drafted])


def plain_greedy(model: nn.Module, ids: list[int], n: int) -> list[int]:
    """mlx-lm's own greedy decoding of `n` tokens after `ids`: what lossless output equals."""
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]


def check_plain_caches(rt, cache: list, draft_cache: list, fed: list[int]) -> None:
    """After speculative cycles that fed `fed`: the target's `cache` and the draft's
    `draft_cache` equal (up to rounding) those of prefilling `fed`, as plain decoding leaves
    them."""
    from engine.cycle import DraftProposer, prefill

    ref = rt.target.make_cache()
    prefill(rt.target, ref, fed, 512)
    for got, want in zip(cache_states(cache), cache_states(ref), strict=True):
        assert got.shape == want.shape and mx.allclose(got, want, atol=1e-4, rtol=1e-4)
    ref_d = DraftProposer(rt.target, rt.draft)
    prefill(rt.target, rt.target.make_cache(), fed, 512, ref_d)
    for got, want in zip(draft_cache, ref_d.cache, strict=True):
        assert got.offset == want.offset
        for a, b in zip(got.keys_and_values(), want.keys_and_values(), strict=True):
            assert mx.allclose(a, b, atol=1e-4, rtol=1e-4)


def cache_states(cache):
    """Comparable arrays of a target cache: KV up to its offset, recurrent states whole."""
    from mlx_lm.models.cache import KVCache

    out = []
    for c in cache:
        if isinstance(c, KVCache):
            out += list(c.keys_and_values())
        else:
            out += [a for _, a in tree_flatten(c.state) if isinstance(a, mx.array)]
    return out


def check_walk_is_the_decode(model: nn.Module, tokenizer, draft: DFlashDraft) -> None:
    """In fp32 the training-side simulation (target features from one forward, a block at
    every anchor) walks exactly the cycles a whole-block greedy decode runs on the same
    reply. `draft` first memorises two replies (25 steps), so cycles accept drafted tokens."""
    import mlx.optimizers as optim
    import numpy as np

    from engine.config import DFlashConfig
    from engine.runtime import DFlashRuntime
    from engine.train.dataset import Dataset
    from engine.train.objective import (
        anchor_runs,
        block_loss,
        make_batch,
        slot_weights,
        target_taps,
        walk_cycles,
    )

    # the draft alone (no suffix lookup): what the simulation walks
    config = DFlashConfig(min_draft_confidence=None, draft_vocab=None, lookup_min_match=None)
    rt = DFlashRuntime(model, tokenizer, draft, config)
    prompts = ([5, 17, 40, 2, 99, 123, 7], [3, 3, 3, 3, 8, 9])
    replies = [list(rt.generate(p, max_tokens=32, speculative=False).tokens) for p in prompts]
    data = Dataset([p + r for p, r in zip(prompts, replies)], [len(p) for p in prompts])
    w = slot_weights(draft.args.block_size, 7.0)
    opt = optim.AdamW(learning_rate=1e-2)
    rng = np.random.default_rng(0)
    for _ in range(25):
        batch = make_batch(data, [0, 1], 32, draft.args.block_size, draft.args.mask_token_id,
                           rng)
        taps = target_taps(rt.target, batch.tokens, draft.args.target_layer_ids)
        loss, grads = nn.value_and_grad(
            draft, lambda b=batch, t=taps: block_loss(draft, rt.target, b, t, w))()
        opt.update(draft, grads)
        mx.eval(loss, draft.parameters(), opt.state)
    longest = 0
    for prompt, reply in zip(prompts, replies):
        result = rt.generate(prompt, max_tokens=32)
        assert list(result.tokens) == reply
        runs = anchor_runs(draft, rt.target, prompt + reply, len(prompt))
        assert walk_cycles(runs, len(reply)) == list(result.cycle_tokens)
        longest = max(longest, *result.cycle_tokens)
    assert longest > 3  # cycles accepted drafted tokens: runs were really compared
