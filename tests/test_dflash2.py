"""DFlash2 drafts (engine/dflash2.py) in z-lab's layout: they load unchanged and are checked
like DFlash drafts; the forward and the candidate selector compute what the architecture says
(a plain numpy recomputation here; z-lab's own reference in test_zlab_reference.py); greedy
decoding with them stays mlx-lm's greedy decoding. Sampling: tests/test_sampling.py."""

from __future__ import annotations

import json
import math
import shutil

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from tiny_pairs import plain_greedy

from engine import DFlashConfig, DFlashRuntime
from engine.cycle import DraftProposer, prefill
from engine.dflash2 import CODEBOOKS, DFlash2Args, DFlash2Draft, stored_weights
from engine.errors import DraftCheckpointError, PairingError
from engine.loading import load_draft_folder
from engine.sampling import Sampler, SamplingParams

FAMILIES = ["llama", "qwen3", "qwen3_5"]
PROMPT = "The quick brown fox jumps over the lazy dog. What is 12 times 7?"

# z-lab/Qwen3.8-27B-DFlash2's config.json, as published (the fields a loader reads)
PUBLISHED = {
    "architectures": ["DFlash2DraftModel"], "attention_bias": False, "is_causal": False,
    "dflash_config": {"block_size": 8, "conv_group_size": 16, "conv_kernel_size": 2,
                      "mask_token_id": 248070, "selector_rank": 256, "selector_top_k": 16,
                      "target_layer_ids": [5, 19, 33, 47, 61]},
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 17408,
    "layer_types": ["sliding_attention"] * 5, "max_position_embeddings": 262144,
    "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 5,
    "num_key_value_heads": 8, "num_target_layers": 64, "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
    "sliding_window": 2048, "tie_word_embeddings": False, "vocab_size": 248320,
}


def runtime(pair, **config) -> DFlashRuntime:
    target, draft = pair
    return DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                         config=DFlashConfig(**config))


# -- the layout -------------------------------------------------------------------------------
def test_the_published_config_reads_as_the_reference_reads_it():
    args = DFlash2Args.from_config(PUBLISHED)
    assert (args.hidden_size, args.num_hidden_layers, args.head_dim) == (5120, 5, 128)
    assert args.target_layer_ids == [5, 19, 33, 47, 61] and args.num_target_layers == 64
    assert (args.block_size, args.mask_token_id, args.vocab_size) == (8, 248070, 248320)
    assert (args.conv_kernel_size, args.conv_group_size) == (2, 16)
    assert (args.selector_rank, args.selector_top_k) == (256, 16)
    assert args.is_causal is False and args.sliding_window == 2048
    assert args.rope_theta == 1e7 and args.layer_types == ["sliding_attention"] * 5
    again = DFlash2Args.from_config(args.to_config())
    assert again == args and again.to_config() == args.to_config()
    assert set(PUBLISHED) <= set(args.to_config()) | {"head_dim"}


def test_the_parameters_carry_z_labs_names_and_shapes():
    """The names and shapes of z-lab's published safetensors header (a DFlash2 checkpoint's),
    for a small config: codebooks without `.weight`, a conv's projection to 2 * K * groups."""
    config = json.loads(json.dumps(PUBLISHED))
    config.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=50,
                  num_target_layers=8, layer_types=["sliding_attention"] * 2)
    config["dflash_config"].update(target_layer_ids=[1, 5], selector_rank=8, selector_top_k=4,
                                   mask_token_id=49)
    draft = DFlash2Draft(DFlash2Args.from_config(config))
    shapes = {k: tuple(v.shape) for k, v in
              stored_weights(dict(tree_flatten(draft.parameters()))).items()}
    expected = {"fc.weight": (64, 128), "hidden_norm.weight": (64,), "norm.weight": (64,),
                "candidate_selector.hidden_projection.weight": (8, 64),
                "candidate_selector.predecessor_codebook": (50, 8),
                "candidate_selector.successor_codebook": (50, 8)}
    for i in range(2):
        layer = {"input_layernorm.weight": (64,), "post_attention_layernorm.weight": (64,),
                 "self_attn.q_proj.weight": (64, 64), "self_attn.k_proj.weight": (32, 64),
                 "self_attn.v_proj.weight": (32, 64), "self_attn.o_proj.weight": (64, 64),
                 "self_attn.q_norm.weight": (16,), "self_attn.k_norm.weight": (16,),
                 "mlp.gate_proj.weight": (96, 64), "mlp.up_proj.weight": (96, 64),
                 "mlp.down_proj.weight": (64, 96)}
        for conv in ("attention_conv", "mlp_conv"):
            layer |= {f"{conv}.base_kernel": (2, 2, 64),
                      f"{conv}.kernel_projection.weight": (2 * 2 * 64 // 16, 64)}
        expected |= {f"layers.{i}.{k}": v for k, v in layer.items()}
    assert shapes == expected


def test_a_folder_loads_unchanged(tiny_dflash2):
    target, folder = tiny_dflash2("llama")
    stored = mx.load(str(folder / "model.safetensors"))
    assert set(CODEBOOKS) <= set(stored) and not any(f"{c}.weight" in stored for c in CODEBOOKS)
    draft = load_draft_folder(folder)
    assert isinstance(draft, DFlash2Draft) and not draft.can_prefetch
    loaded = stored_weights(dict(tree_flatten(draft.parameters())))
    assert set(loaded) == set(stored)
    assert all(mx.array_equal(loaded[k], stored[k]) for k in stored)
    # it proposes its selector's path alone: no prefetch or context copy
    rt = runtime((target, folder), copy_odds=0.1)
    assert isinstance(rt.draft, DFlash2Draft) and not rt.plan.prefetch
    assert rt.plan.copy_odds is None


def edited(folder, tmp_path, name, config=None, weights=None):
    """A copy of a draft folder with its config.json and weights edited."""
    out = tmp_path / name
    shutil.copytree(folder, out)
    cfg = json.loads((out / "config.json").read_text())
    if config:
        config(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    if weights:
        stored = mx.load(str(out / "model.safetensors"))
        weights(stored)
        mx.save_safetensors(str(out / "model.safetensors"), stored)
    return out


def test_broken_folders_are_one_line_errors(tiny_dflash2, tmp_path):
    _, folder = tiny_dflash2("llama")
    cases = [
        (lambda c: c["dflash_config"].pop("selector_top_k"), None,
         "lacks dflash_config.selector_top_k: not a DFlash2 draft config. Fix: use a "
         "checkpoint in the z-lab *-DFlash2 layout."),
        (lambda c: c["dflash_config"].update(conv_group_size=24), None,
         "hidden_size 64 is not a multiple of dflash_config.conv_group_size 24"),
        (lambda c: c.pop("sliding_window"), None, "sliding_attention layers need a"),
        (lambda c: c.update(layer_types=["sliding_attention"]), None, "layer_types lists 1"),
        (None, lambda w: w.update({"candidate_selector.successor_codebook.weight":
                                   w["candidate_selector.successor_codebook"]}),
         "both candidate_selector.successor_codebook and"),
        (None, lambda w: w.pop("layers.1.mlp_conv.base_kernel"),
         "weights missing for layers.1.mlp_conv.base_kernel"),
    ]
    for i, (config, weights, message) in enumerate(cases):
        with pytest.raises(DraftCheckpointError, match="Fix:") as caught:
            load_draft_folder(edited(folder, tmp_path, f"case{i}", config, weights))
        assert message in str(caught.value) and "\n" not in str(caught.value)


def test_pair_checks_are_the_dflash_ones(tiny_dflash2, tmp_path):
    target, folder = tiny_dflash2("qwen3")
    wrong = edited(folder, tmp_path, "wrong", lambda c: c.update(num_target_layers=6))
    with pytest.raises(PairingError, match="trained for a 6-layer target, this target has 4"):
        runtime((target, wrong))


# -- the forward, recomputed plainly ----------------------------------------------------------
def rms(x, weight, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def rope(x, positions, theta):
    """x [L, heads, d] at `positions` [L]: the rotation of halves (not interleaved)."""
    half = x.shape[-1] // 2
    angles = positions[:, None, None] * theta ** (-np.arange(half) * 2 / x.shape[-1])
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(angles) - b * np.sin(angles),
                           b * np.cos(angles) + a * np.sin(angles)], axis=-1)


def convolve(x, dynamic, base, group):
    """y[t, c] = sum over o of (base[o, c] + dynamic[t, o, c // group]) * x[t - o, c]."""
    y = np.zeros_like(x)
    for t in range(len(x)):
        for o in range(len(base)):
            if t - o >= 0:
                y[t] += (base[o] + np.repeat(dynamic[t, o], group)) * x[t - o]
    return y


def plain_block(weights, cfg, features, embedded, start):
    """DFlash2's forward written out (DFlash's without the convolutions): context `features`
    [T, n_taps * H] at positions 0..T-1, the block's embeddings [B, H] at start.. -> normed
    hidden states [B, H]."""
    eps = cfg["rms_norm_eps"]
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    dflash = cfg["dflash_config"]
    K, group = dflash.get("conv_kernel_size"), dflash.get("conv_group_size")
    ctx = rms(features @ weights["fc.weight"].T, weights["hidden_norm.weight"], eps)
    T, B = len(ctx), len(embedded)
    positions = np.concatenate([np.arange(T), start + np.arange(B)])
    x = embedded
    for i, kind in enumerate(cfg["layer_types"]):
        w = {k.removeprefix(f"layers.{i}."): v for k, v in weights.items()
             if k.startswith(f"layers.{i}.")}
        sliding = kind == "sliding_attention"
        causal = sliding if cfg.get("is_causal") is None else cfg["is_causal"]

        def conv(name, y, dynamic=None, w=w):
            if f"{name}.base_kernel" not in w:  # a DFlash layer: no convolutions
                return (y, ()) if dynamic is None else y
            if dynamic is None:
                dyn = (y @ w[f"{name}.kernel_projection.weight"].T).reshape(B, 2, K, -1)
                return convolve(y, dyn[:, 0], w[f"{name}.base_kernel"][0], group), dyn[:, 1]
            return convolve(y, dynamic, w[f"{name}.base_kernel"][1], group)

        def project(y, name, n, norm=None, w=w):
            out = (y @ w[f"self_attn.{name}.weight"].T).reshape(len(y), n, hd)
            return out if norm is None else rms(out, w[f"self_attn.{norm}.weight"], eps)

        a, dynamic = conv("attention_conv", rms(x, w["input_layernorm.weight"], eps))
        q = rope(project(a, "q_proj", heads, "q_norm"), positions[T:], theta)
        both = np.concatenate([ctx, a])
        k = rope(project(both, "k_proj", kv, "k_norm"), positions, theta)
        v = project(both, "v_proj", kv)
        out = np.zeros((B, heads, hd))
        for h in range(heads):
            g = h // (heads // kv)
            for i_q in range(B):
                seen = [j for j in range(T + B) if (
                    j < T and (not sliding or start + i_q - j < cfg["sliding_window"])) or (
                    j >= T and (not causal or j - T <= i_q))]
                scores = k[seen, g] @ q[i_q, h] / math.sqrt(hd)
                p = np.exp(scores - scores.max())
                out[i_q, h] = (p / p.sum()) @ v[seen, g]
        attended = out.reshape(B, heads * hd) @ w["self_attn.o_proj.weight"].T
        x = x + conv("attention_conv", attended, dynamic)
        m, dynamic = conv("mlp_conv", rms(x, w["post_attention_layernorm.weight"], eps))
        gate, up = m @ w["mlp.gate_proj.weight"].T, m @ w["mlp.up_proj.weight"].T
        mixed = (gate / (1 + np.exp(-gate)) * up) @ w["mlp.down_proj.weight"].T
        x = x + conv("mlp_conv", mixed, dynamic)
    return rms(x, weights["norm.weight"], eps)


def plain_path(weights, hidden, logits, staged, top_k, temperature=None, draws=None):
    """The selector's path by brute force over each slot's top-k: every candidate's score
    (its logit plus <predecessor code (x) projected hidden, successor code>) given the pick
    before it; the best one, or with `draws` (the tokens actually drawn) each slot's
    distribution softmax(scores / temperature) over its candidates -> (path, rows)."""
    pred = weights["candidate_selector.predecessor_codebook"]
    succ = weights["candidate_selector.successor_codebook"]
    projected = hidden @ weights["candidate_selector.hidden_projection.weight"].T
    path, rows, previous = [], [], staged
    for slot in range(len(hidden)):
        candidates = np.argsort(-logits[slot], kind="stable")[:top_k]
        scores = {int(c): logits[slot, c] + float(np.sum(pred[previous] * projected[slot]
                                                         * succ[c])) for c in candidates}
        if draws is None:
            previous = max(scores, key=scores.get)
        else:
            values = np.array(list(scores.values())) / temperature
            p = np.exp(values - values.max())
            rows.append(dict(zip(scores, p / p.sum(), strict=True)))
            previous = draws[slot]
        path.append(previous)
    return path, rows


SCALES = {"input_embedding_scale": 1.5, "output_multiplier": 0.5,
          "final_logit_softcapping": 2.0}  # config keys some DFlash2 checkpoints carry


def plain_logits_of(rt, cfg, states):
    """The target's head on the draft's states, then the draft's own scaling and cap."""
    logits = np.array(rt.target.lm_head(mx.array(states, dtype=mx.float32)), dtype=np.float64)
    logits = logits * cfg["dflash_config"].get("output_multiplier", 1.0)
    cap = cfg["dflash_config"].get("final_logit_softcapping")
    return np.tanh(logits / cap) * cap if cap else logits


@pytest.mark.parametrize("family, name", [(f, "dflash2") for f in FAMILIES]
                         + [("llama", "scaled")])
def test_forward_and_path_match_a_plain_recomputation(tiny_dflash2, family, name):
    """Block logits within 1e-4 (float32 against float64) and the same greedy path, at
    contexts longer than the sliding window (6) so its masks count; the path leaves each
    slot's argmax somewhere, so the selector is really compared. `scaled`: with the
    embedding scale, logit multiplier and soft cap a config may set."""
    target, folder = tiny_dflash2(family, name, **(SCALES if name == "scaled" else {}))
    rt = runtime((target, folder))
    cfg = json.loads((folder / "config.json").read_text())
    weights = {k: np.array(v, dtype=np.float64)
               for k, v in mx.load(str(folder / "model.safetensors")).items()}
    ids = rt.encode(PROMPT)
    off_argmax = 0
    for n in (len(ids) - 9, len(ids)):
        context = ids[:n]
        proposer = DraftProposer(rt.target, rt.draft)
        staged = int(mx.argmax(prefill(rt.target, rt.target.make_cache(), context, 5, proposer)))
        B = rt.draft.args.block_size
        hidden, logits = proposer.path_outputs(staged, B)
        verify_in = proposer.propose(staged, B, n)
        _, taps = rt.target.forward(mx.array([context]), rt.target.make_cache(),
                                    rt.draft.args.target_layer_ids)
        block = mx.array([[staged] + [rt.draft.args.mask_token_id] * (B - 1)])
        embedded = np.array(rt.target.embed(block)[0], dtype=np.float64)
        states = plain_block(weights, cfg, np.array(taps[0], dtype=np.float64),
                             embedded * cfg["dflash_config"].get("input_embedding_scale", 1), n)
        plain_logits = plain_logits_of(rt, cfg, states[1:])
        assert np.abs(np.array(logits) - plain_logits).max() < 1e-4
        assert np.abs(np.array(hidden) - states[1:]).max() < 1e-4
        path, _ = plain_path(weights, states[1:], plain_logits, staged,
                             cfg["dflash_config"]["selector_top_k"])
        assert verify_in[0].tolist() == [staged, *path]
        off_argmax += sum(p != a for p, a in zip(path, plain_logits.argmax(-1), strict=True))
    assert off_argmax > 0


def test_dflash_sliding_layers_match_a_plain_recomputation(tiny_pairs, tmp_path):
    """DFlash drafts share the masks: a sliding-window layer (its block causal, as z-lab's
    newer DFlash configs have it) then a full one, at a context longer than the window."""
    from tiny_pairs import sliding_dflash

    target, draft = tiny_pairs("qwen3")
    folder = sliding_dflash(target, draft, tmp_path / "sliding")
    rt = runtime((target, folder))
    cfg = json.loads((folder / "config.json").read_text())
    weights = {k: np.array(v, dtype=np.float64)
               for k, v in mx.load(str(folder / "model.safetensors")).items()}
    ids = rt.encode(PROMPT)
    proposer = DraftProposer(rt.target, rt.draft)
    staged = int(mx.argmax(prefill(rt.target, rt.target.make_cache(), ids, 5, proposer)))
    B = rt.draft.args.block_size
    logits = proposer.draft_logits(staged, B)[0]
    _, taps = rt.target.forward(mx.array([ids]), rt.target.make_cache(),
                                rt.draft.args.target_layer_ids)
    block = mx.array([[staged] + [rt.draft.args.mask_token_id] * (B - 1)])
    states = plain_block(weights, cfg, np.array(taps[0], dtype=np.float64),
                         np.array(rt.target.embed(block)[0], dtype=np.float64), len(ids))
    plain_logits = np.array(rt.target.lm_head(mx.array(states[1:], dtype=mx.float32)))
    assert np.abs(np.array(logits) - plain_logits).max() < 1e-4


def test_sampled_paths_carry_their_draws_distributions(tiny_dflash2):
    """At T > 0 each slot's q is softmax(scores / T) over its candidates, the scores following
    the token drawn before it (not the slot's argmax)."""
    target, folder = tiny_dflash2("llama")
    rt = runtime((target, folder))
    weights = {k: np.array(v, dtype=np.float64)
               for k, v in mx.load(str(folder / "model.safetensors")).items()}
    proposer = DraftProposer(rt.target, rt.draft)
    ids = rt.encode(PROMPT)
    staged = int(mx.argmax(prefill(rt.target, rt.target.make_cache(), ids, 512, proposer)))
    hidden, logits = proposer.path_outputs(staged, 8)
    sampler = Sampler(SamplingParams(temperature=0.8, seed=4))
    found = proposer.selector.walk(hidden, logits, staged, proposer.output_head, sampler)
    draws = found.tokens.tolist()
    _, rows = plain_path(weights, np.array(hidden, dtype=np.float64),
                         np.array(logits, dtype=np.float64), staged, 8, 0.8, draws)
    for slot, row in enumerate(rows):
        ours = dict(zip(found.candidates[slot].tolist(), found.q[slot].tolist(), strict=True))
        assert set(ours) == set(row) and draws[slot] in ours
        assert max(abs(ours[t] - row[t]) for t in row) < 1e-5


# -- decoding -------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cut", [None, 0.05])
def test_greedy_decoding_is_mlx_lm_greedy(tiny_dflash2, family, cut, monkeypatch):
    """Every cycle proposes the selector's path (whole blocks, or cut where the draft's own
    probability of a path token falls below `cut`); the reply is mlx-lm's greedy reply."""
    from engine.dflash2 import CandidateSelector

    walks = []
    walk = CandidateSelector.walk
    monkeypatch.setattr(CandidateSelector, "walk",
                        lambda self, *a, **k: walks.append(1) or walk(self, *a, **k))
    rt = runtime(tiny_dflash2(family), lookup_min_match=None, min_draft_confidence=cut)
    ids = rt.encode(PROMPT)
    result = rt.generate(ids, 48, no_eos=True)
    assert list(result.tokens) == plain_greedy(rt.model, ids, 48)
    # each cycle walked the selector (but one with room for a single token: nothing drafted)
    assert result.speculative and result.cycles - 1 <= len(walks) <= result.cycles


def test_sampled_replies_repeat_with_a_seed(tiny_dflash2):
    rt = runtime(tiny_dflash2("qwen3_5"))
    ids = rt.encode(PROMPT)
    first = rt.generate(ids, 30, no_eos=True, temperature=0.8, seed=7)
    assert first.speculative and len(first.tokens) == 30
    assert rt.generate(ids, 30, no_eos=True, temperature=0.8, seed=7).tokens == first.tokens
    assert rt.generate(ids, 30, no_eos=True, temperature=0.8, seed=8).tokens != first.tokens
    greedy = rt.generate(ids, 30, no_eos=True, temperature=0.0, top_k=3, seed=5)
    assert list(greedy.tokens) == plain_greedy(rt.model, ids, 30)
