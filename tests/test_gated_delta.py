"""GatedDeltaAdapter on a tiny float32 qwen3_5: exact forward, verify and rollback."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.base import create_attention_mask, create_ssm_mask
from mlx_lm.models.cache import ArraysCache, KVCache
from mlx_lm.models.gated_delta import gated_delta_ops
from tiny_qwen35 import make_tiny_qwen3_next, make_tiny_qwen35

from engine.kernels import PORTABLE, GatedDeltaKernels, gated_delta_verify, select, tape_replay
from engine.targets.gated_delta import GatedDeltaAdapter

PROMPT_LEN, T, ATOL = 20, 16, 1e-5


@pytest.fixture(scope="module")
def model():
    return make_tiny_qwen35(seed=0, num_layers=4, full_attention_interval=2)


@pytest.fixture(scope="module")
def tokens():
    mx.random.seed(1)
    return mx.random.randint(0, 256, (1, PROMPT_LEN + T))


def clone(cache: list) -> list:
    out = []
    for c in cache:
        if isinstance(c, KVCache):
            n = KVCache()
            if c.keys is not None:
                # Fresh arrays: KVCache writes its buffers in place by slice assignment.
                n.keys, n.values = (mx.array(a) for a in c.keys_and_values())
                n.offset = c.offset
            out.append(n)
        else:
            n = ArraysCache(len(c.cache))
            n.cache = list(c.cache)
            out.append(n)
    return out


def assert_caches_close(got: list, want: list, atol: float = ATOL) -> None:
    for g, w in zip(got, want, strict=True):
        if isinstance(w, KVCache):
            assert g.offset == w.offset
            for a, b in zip(g.keys_and_values(), w.keys_and_values(), strict=True):
                assert mx.allclose(a, b, atol=atol).item()
        else:
            for a, b in zip(g.cache, w.cache, strict=True):
                assert a.shape == b.shape
                assert mx.allclose(a, b, atol=atol).item()


def prefilled(model, tokens: mx.array) -> list:
    cache = model.make_cache()
    mx.eval(model(tokens, cache=cache))
    return cache


def test_adapter_basics(model):
    adapter = GatedDeltaAdapter(model)
    assert adapter.family == "gated_delta" and "qwen3_5" in adapter.model_types
    assert adapter._first_kv_index() == 1
    assert select(mode="portable") is PORTABLE and select("cpu") is PORTABLE


def test_forward_matches_model_and_taps_are_layer_outputs(model, tokens):
    adapter = GatedDeltaAdapter(model)
    prompt = tokens[:, :PROMPT_LEN]
    tap_ids = list(range(adapter.num_layers))
    logits, taps = adapter.forward(prompt, adapter.make_cache(), tap_ids)
    assert adapter._records is None  # prefill is mlx-lm's own path, nothing recorded
    assert mx.array_equal(logits, model(prompt, cache=model.make_cache())).item()

    # Reference taps: Qwen3_5TextModel.__call__'s loop, run by hand.
    inner, cache = model.language_model.model, model.make_cache()
    h = inner.embed_tokens(prompt)
    fa_mask = create_attention_mask(h, cache[inner.fa_idx])
    ssm_mask = create_ssm_mask(h, cache[inner.ssm_idx])
    H = adapter.hidden_size
    for i, (layer, c) in enumerate(zip(inner.layers, cache, strict=True)):
        h = layer(h, mask=ssm_mask if layer.is_linear else fa_mask, cache=c)
        assert mx.array_equal(taps[..., i * H : (i + 1) * H], h).item()


@pytest.mark.parametrize("tape", [True, False])
def test_verify_logits_match_model(model, tokens, tape):
    prompt, draft = tokens[:, :PROMPT_LEN], tokens[:, PROMPT_LEN:]
    base = prefilled(model, prompt)
    want = model(draft, cache=clone(base))
    adapter = GatedDeltaAdapter(model, enable_tape_replay=tape)
    cache = clone(base)
    adapter.begin_verify(cache)
    got, _ = adapter.forward(draft, cache, [0])
    assert mx.allclose(got, want, atol=ATOL).item()
    # With keep == verified nothing is replayed: the verify's caches equal a plain forward.
    ref = clone(base)
    mx.eval(model(draft, cache=ref))
    adapter.rollback(cache, T, T)
    assert_caches_close(cache, ref)


def rolled_back(model, base: list, draft: mx.array, keep: int, tape: bool,
                kernels: GatedDeltaKernels | None = None) -> list:
    adapter = GatedDeltaAdapter(model, enable_tape_replay=tape, kernels=kernels)
    cache = clone(base)
    adapter.begin_verify(cache)
    mx.eval(adapter.forward(draft, cache, [0]))
    adapter.rollback(cache, keep, T)
    assert adapter._records is None
    return cache


def test_rollback_equals_prefill_of_kept_tokens(model, tokens):
    prompt, draft = tokens[:, :PROMPT_LEN], tokens[:, PROMPT_LEN:]
    base = prefilled(model, prompt)
    nxt = mx.array([[7]])
    for keep in range(1, T + 1):
        ref = prefilled(model, tokens[:, : PROMPT_LEN + keep])
        rolled = [rolled_back(model, base, draft, keep, tape) for tape in (True, False)]
        for cache in rolled:
            assert_caches_close(cache, ref)
        want = model(nxt, cache=ref)
        for cache in rolled:
            assert mx.allclose(model(nxt, cache=cache), want, atol=ATOL).item()


def test_tape_replay_equals_rerun_bitwise(model, tokens):
    prompt, draft = tokens[:, :PROMPT_LEN], tokens[:, PROMPT_LEN:]
    base = prefilled(model, prompt)
    for keep in range(1, T + 1):
        replayed = rolled_back(model, base, draft, keep, tape=True)
        rerun = rolled_back(model, base, draft, keep, tape=False)
        for a, b in zip(replayed, rerun, strict=True):
            if isinstance(a, ArraysCache):
                assert mx.array_equal(a[0], b[0]).item()
                assert mx.array_equal(a[1], b[1]).item()


def test_a_kernel_sets_fused_rollback_rolls_every_linear_layer_back(model, tokens):
    """A kernel set with its own rollback (CUDA's fused one) gets each linear layer's
    states, tape, keep and conv inputs, and the caches hold what it returns."""
    prompt, draft = tokens[:, :PROMPT_LEN], tokens[:, PROMPT_LEN:]
    base = prefilled(model, prompt)
    calls = []

    def fused(state, tape, keep, conv_state, qkv):
        calls.append((keep, tape.delta.shape[1], qkv.shape[1]))
        return PORTABLE.roll_back(state, tape, keep, conv_state, qkv)

    spy = GatedDeltaKernels("spy", gated_delta_verify, tape_replay, fused)
    for keep in (1, 9):
        calls.clear()
        got = rolled_back(model, base, draft, keep, tape=True, kernels=spy)
        want = rolled_back(model, base, draft, keep, tape=True)
        linear = sum(layer.is_linear for layer in GatedDeltaAdapter(model).layers)
        assert calls == [(keep, T, T)] * linear
        for a, b in zip(got, want, strict=True):
            if isinstance(a, ArraysCache):
                assert mx.array_equal(a[0], b[0]).item() and mx.array_equal(a[1], b[1]).item()


def test_qwen3_next_rollback(tokens):
    model = make_tiny_qwen3_next(seed=2)
    prompt, draft = tokens[:, :PROMPT_LEN], tokens[:, PROMPT_LEN:]
    base = prefilled(model, prompt)
    for keep in (1, 9, T):
        ref = prefilled(model, tokens[:, : PROMPT_LEN + keep])
        for tape in (True, False):
            assert_caches_close(rolled_back(model, base, draft, keep, tape), ref)


@pytest.mark.parametrize("vector_gate", [False, True])
def test_kernels_match_mlx_lm_ops(vector_gate):
    B, Hk, Hv, Dk, Dv = 1, 2, 4, 32, 16
    ks = mx.random.split(mx.random.key(3), 6)
    q, k = (mx.random.normal((B, T, Hk, Dk), key=kk) * 0.2 for kk in ks[:2])
    v = mx.random.normal((B, T, Hv, Dv), key=ks[2])
    g_shape = (B, T, Hv, Dk) if vector_gate else (B, T, Hv)
    g = mx.random.uniform(0.5, 1.0, g_shape, key=ks[3])
    beta = mx.random.uniform(0.0, 1.0, (B, T, Hv), key=ks[4])
    state = mx.random.normal((B, Hv, Dv, Dk), key=ks[5])
    y, final, tape = gated_delta_verify(q, k, v, g, beta, state)
    y_ref, final_ref = gated_delta_ops(q, k, v, g, beta, state)
    assert mx.allclose(y, y_ref, atol=1e-6).item()
    assert mx.allclose(final, final_ref, atol=1e-6).item()
    assert mx.array_equal(tape_replay(state, tape, T), final).item()
    for keep in (1, 7):
        rerun = gated_delta_verify(*(x[:, :keep] for x in (q, k, v, g, beta)), state)[1]
        assert mx.array_equal(tape_replay(state, tape, keep), rerun).item()


def test_warm_up_compiles_both_kernels_once_and_only_for_native(model):
    """Native kernels JIT-compile on first use (seconds on the H200): warm_up reaches the
    verify and the replay kernel before the first reply; the portable path skips it."""
    from engine.kernels import GatedDeltaKernels

    calls = {"verify": 0, "replay": 0}

    def verify(*args):
        calls["verify"] += 1
        return gated_delta_verify(*args)

    def replay(*args):
        calls["replay"] += 1
        return tape_replay(*args)

    GatedDeltaAdapter(model, kernels=GatedDeltaKernels("counting", verify, replay)).warm_up()
    assert calls["verify"] >= 1 and calls["replay"] >= 1

    calls.update(verify=0, replay=0)  # the portable path has nothing to compile: no forward
    GatedDeltaAdapter(model, kernels=GatedDeltaKernels("portable", verify, replay)).warm_up()
    assert calls == {"verify": 0, "replay": 0}
