"""`dflash train-draft` on tiny fixtures: mask, forward equivalence, learning, round trip."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from script_modules import load_script
from tiny_pairs import check_walk_is_the_decode, make_tiny_pair

import engine.train.loop as train_loop
from engine.cycle import DraftProposer
from engine.draft import DFlashDraft
from engine.errors import ConfigError
from engine.loading import load_draft_folder, load_target
from engine.runtime import DFlashRuntime
from engine.targets import adapter_for
from engine.train.dataset import (
    Dataset,
    data_weight,
    length_grouped_order,
    parse_data_weights,
    token_ranking,
    weighted_indices,
    write_token_ranking,
)
from engine.train.loop import (
    TrainConfig,
    build_parser,
    draft_optimizer,
    steps_that_fit,
    train,
    train_draft_main,
    validate,
)
from engine.train.objective import (
    Batch,
    LossVocabulary,
    block_loss,
    context_mask,
    forward_parts,
    make_batch,
    repeated_positions,
    slot_logits,
    slot_loss,
    slot_weights,
    target_taps,
    tokens_per_cycle,
    train_forward,
    walk_cycles,
)
from engine.train.prompts import build_prompts


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, draft_dir = make_tiny_pair(tmp_path_factory.mktemp("train"))
    model, tokenizer, _ = load_target(str(target_dir), "float32")
    return target_dir, draft_dir, model, tokenizer


def recipe_mask(anchors: mx.array, ctx_len: int, block_size: int) -> mx.array:
    """The recipe's whole mask [N, 1, A*B, ctx_len + A*B]: context before the anchor, then
    every block's own slots (bidirectional) and no other block's."""
    N, A = anchors.shape
    owner = mx.repeat(mx.arange(A), block_size)
    own = mx.broadcast_to((owner[:, None] == owner[None, :])[None, None],
                          (N, 1, A * block_size, A * block_size))
    return mx.concatenate([context_mask(anchors, ctx_len, block_size), own], axis=-1)


def test_context_mask_matches_recipe():
    # two blocks of B=4 at anchors 3 and 6, context of 8 tokens
    m = context_mask(mx.array([[3, 6]]), ctx_len=8, block_size=4)[0, 0]
    assert m.shape == (8, 8)
    m = np.array(m)
    # block 0 (queries 0..3): context 0,1,2 only (strictly before anchor 3)
    assert m[0, :3].all() and not m[0, 3:].any()
    # block 1 (queries 4..7): context 0..5 only, the same for every query of the block
    assert m[5, :6].all() and not m[5, 6:].any()
    assert (m[4] == m[7]).all()


def test_blockwise_training_attention_equals_the_recipes_masked_attention(pair):
    """Each block's own slots scored per block == the dense attention under the recipe's
    whole mask, values and gradients (grouped heads, several blocks per row)."""
    from engine.train.objective import _train_attention

    _, draft_dir, _, _ = pair
    attn = load_draft_folder(draft_dir).layers[0].self_attn
    assert attn.n_heads > attn.n_kv_heads  # grouped query heads are covered
    B, T = 4, 24
    anchors = mx.array([[3, 9, 20], [1, 2, 15]])
    mx.random.seed(1)
    x = mx.random.normal((2, 3 * B, attn.q_proj.weight.shape[1]))
    ctx = mx.random.normal((2, T, attn.k_proj.weight.shape[1]))

    def dense(x, ctx):
        from engine.train.objective import _rope_blocks

        q = _rope_blocks(attn.rope, attn.q_norm(attn._heads(attn.q_proj(x), attn.n_heads)),
                         anchors, B)
        k = _rope_blocks(attn.rope, attn.k_norm(attn._heads(attn.k_proj(x), attn.n_kv_heads)),
                         anchors, B)
        ctx_k, ctx_v = attn.context_kv(ctx, 0)
        keys = mx.concatenate([ctx_k, k], axis=2)
        values = mx.concatenate([ctx_v, attn._heads(attn.v_proj(x), attn.n_kv_heads)], axis=2)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=attn.scale,
                                                   mask=recipe_mask(anchors, T, B))
        return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(2, 3 * B, -1))

    def blockwise(x, ctx):
        return _train_attention(attn, x, ctx, anchors, B, context_mask(anchors, T, B))

    assert mx.allclose(blockwise(x, ctx), dense(x, ctx), atol=1e-5).item()
    def grads(f):
        return mx.grad(lambda x, c: (f(x, c) ** 2).sum(), argnums=(0, 1))(x, ctx)

    grads = [grads(blockwise), grads(dense)]
    for got, want in zip(*grads):
        assert mx.allclose(got, want, atol=1e-4).item()


def test_slot_weights_decay():
    w = np.array(slot_weights(16, 7.0))
    assert w.shape == (15,) and w[0] == 1.0
    assert np.isclose(w[7], np.exp(-1.0))


def test_training_forward_equals_inference(pair):
    """One block through the masked training forward == DFlashDraft.__call__ after
    append_context (same RoPE positions, same context, bidirectional block)."""
    target, draft = target_and_draft(pair)
    B, taps_ids = draft.args.block_size, draft.args.target_layer_ids
    seq = mx.array([[5, 17, 40, 2, 99, 123, 7, 61, 88, 9, 33, 14]])
    anchor = 7
    taps = target_taps(target, seq, taps_ids)
    block = mx.array([[int(seq[0, anchor])] + [draft.args.mask_token_id] * (B - 1)])
    emb = target.embed(block)

    cache = draft.make_cache()
    draft.append_context(taps[:, :anchor], cache)
    want = draft(emb, cache)

    # the training forward sees the whole sequence's taps; the mask hides t >= anchor
    anchors = mx.array([[anchor]])
    got = train_forward(draft, taps, emb, anchors, context_mask(anchors, seq.shape[1], B))
    assert mx.allclose(got, want, atol=1e-5).item()

    # and two blocks in one forward do not see each other
    anchors2 = mx.array([[3, anchor]])
    block2 = mx.concatenate([mx.array([[int(seq[0, 3])] + [draft.args.mask_token_id] *
                                       (B - 1)]), block], axis=1)
    got2 = train_forward(draft, taps, target.embed(block2), anchors2,
                         context_mask(anchors2, seq.shape[1], B))
    assert mx.allclose(got2[:, B:], want, atol=1e-5).item()


def test_make_batch_labels_and_anchors():
    data = Dataset([[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 9, 8, 7]], [3, 2])
    rng = np.random.default_rng(0)
    b = make_batch(data, [0, 1], n_anchors=3, block_size=4, mask_id=0, rng=rng)
    anchors, labels, valid = np.array(b.anchors), np.array(b.labels), np.array(b.valid)
    tokens = np.array(b.tokens)
    for n, (seq, p) in enumerate(zip(data.sequences, data.prompt_lens)):
        for a in range(3):
            pos = anchors[n, a]
            assert p <= pos <= len(seq) - 2  # inside the response, with a label after it
            for k in range(1, 4):
                if valid[n, a, k - 1]:
                    assert labels[n, a, k - 1] == seq[pos + k]
                else:
                    assert pos + k >= len(seq) or a >= len(seq) - 1 - p
        assert list(tokens[n, : len(seq)]) == seq
    assert np.array(b.block).reshape(2, 3, 4)[0, 0, 0] == data.sequences[0][anchors[0, 0]]
    # short responses get fewer anchor slots (the longest one's count, rounded up to 8), with
    # the same anchors drawn as with room for many more
    many = make_batch(data, [0, 1], n_anchors=96, block_size=4, mask_id=0,
                      rng=np.random.default_rng(0))
    few = make_batch(data, [0, 1], n_anchors=5, block_size=4, mask_id=0,
                     rng=np.random.default_rng(0))
    assert many.anchors.shape == (2, 8) and few.anchors.shape == (2, 5)
    assert np.array_equal(np.array(many.anchors)[:, :4], np.array(few.anchors)[:, :4])


def test_tokens_per_cycle_counts_the_correct_run():
    labels = mx.array([[[5, 6, 7], [1, 2, 3]]])
    valid = mx.ones((1, 2, 3))
    batch = Batch(mx.zeros((1, 1)), mx.zeros((1, 1)), mx.zeros((1, 2)), labels, valid)
    logits = mx.zeros((1, 2, 3, 10))
    logits = logits + mx.eye(10)[mx.array([[[5, 6, 0], [9, 2, 3]]])]  # run 2, run 0
    total, blocks = tokens_per_cycle(logits, batch)
    assert blocks == 2 and total == (1 + 2) + (1 + 0)


def test_walk_cycles_anchors_where_the_last_cycle_stopped():
    # reply of 10 tokens: token 0 from prefill, cycles commit tokens 1..9
    runs = [2, 0, 9, 4, 0, 0, 1, 0, 0]
    assert walk_cycles(runs, 10) == [3, 5, 1]  # anchored at tokens 0, 3 and 8
    assert walk_cycles(runs, 6) == [3, 2]  # the second cycle cut at the reply's end
    assert walk_cycles([0] * 4, 5) == [1, 1, 1, 1]
    assert walk_cycles([], 1) == []


def test_simulated_walk_is_the_real_whole_block_decode(pair):
    _, draft_dir, model, tokenizer = pair
    check_walk_is_the_decode(model, tokenizer, load_draft_folder(draft_dir))


def test_few_steps_lower_the_loss(pair):
    import mlx.nn as nn
    import mlx.optimizers as optim

    _, draft_dir, model, tokenizer = pair
    target = adapter_for(model)
    draft = DFlashDraft(load_draft_folder(draft_dir).args)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(4, 300, size=40).tolist() for _ in range(4)]
    data = Dataset(seqs, [8] * 4)
    batch = make_batch(data, range(4), 8, draft.args.block_size, draft.args.mask_token_id, rng)
    taps = target_taps(target, batch.tokens, draft.args.target_layer_ids)
    w = slot_weights(draft.args.block_size, 7.0)
    step = nn.value_and_grad(draft, lambda: block_loss(draft, target, batch, taps, w))
    opt = optim.AdamW(learning_rate=3e-3)
    first = None
    for _ in range(12):
        loss, grads = step()
        opt.update(draft, optim.clip_grad_norm(grads, 1.0)[0])
        mx.eval(loss, draft.parameters(), opt.state)
        first = float(loss) if first is None else first
    assert float(loss) < first * 0.8
    assert slot_logits(draft, target, batch, taps).shape[-2] == draft.args.block_size - 1


def tiny_run(target_dir, tmp_path, sequences=None):
    """run(out, *flags) -> train()'s result: a 1-layer draft, 4 steps on 12 tiny sequences
    (or on `sequences`, each with a 2-token prompt)."""
    data = tmp_path / "data.npz"
    sequences = sequences or [[1, 10 + i % 5, 3, 4, 5, 6, 7, 8] for i in range(12)]
    Dataset(sequences, [2] * len(sequences)).save(data)

    def run(out: str, *extra: str) -> dict:
        argv = ["--model", str(target_dir), "--out", str(tmp_path / out), "--depth", "1",
                "--taps", "1", "--steps", "4", "--batch", "2", "--anchors", "2",
                "--data", str(data), "--val-size", "2", "--val-every", "100", "--no-progress",
                *extra]
        return train(TrainConfig(**vars(build_parser().parse_args(argv))), say=lambda m: None)

    return run


def target_and_draft(pair):
    """The tiny pair's target adapter and draft."""
    _, draft_dir, model, _ = pair
    return adapter_for(model), load_draft_folder(draft_dir)


def random_blocks(pair, seed: int, sequences: int, length: int, prompt_len: int):
    """The tiny pair's target and draft, a batch of 8 anchors per random sequence, its taps
    and the slot weights."""
    target, draft = target_and_draft(pair)
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(4, 300, size=length).tolist() for _ in range(sequences)]
    data = Dataset(seqs, [prompt_len] * sequences)
    batch = make_batch(data, range(sequences), 8, draft.args.block_size,
                       draft.args.mask_token_id, rng)
    taps = target_taps(target, batch.tokens, draft.args.target_layer_ids)
    return target, draft, batch, taps, slot_weights(draft.args.block_size, 7.0)


def test_repeated_positions_mark_where_a_4gram_recurs():
    tokens = np.array([[5, 6, 7, 8, 9, 5, 6, 7, 8, 5, 0, 0],
                       [1, 2, 1, 2, 1, 2, 1, 0, 0, 0, 0, 0]])
    repeated = repeated_positions(tokens, np.array([10, 7]))
    assert repeated[0].nonzero()[0].tolist() == [8]  # 5 6 7 8 again; 6 7 8 5 is new
    assert repeated[1].nonzero()[0].tolist() == [5, 6]  # a loop, the padding not counted


def test_a_batchs_repeats_mark_the_slots_whose_label_recurs():
    seq = [3, 9, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 8, 2, 4]
    data = Dataset([seq], [2])
    batch = make_batch(data, [0], 6, 4, 1, np.random.default_rng(0), mark_repeats=True)
    repeated = repeated_positions(np.array([seq]), np.array([len(seq)]))[0]
    checked = 0
    for a, anchor in enumerate(np.array(batch.anchors[0]).tolist()):
        for k in range(3):  # slot k + 1 holds the token at anchor + k + 1
            if anchor + k + 1 < len(seq):
                assert batch.repeats[0, a, k].item() == repeated[anchor + k + 1]
                checked += 1
    assert checked and 0 < batch.repeats.sum().item() < checked
    assert make_batch(data, [0], 6, 4, 1, np.random.default_rng(0)).repeats is None


def test_validation_counts_the_novel_blocks_apart(pair):
    target, draft = target_and_draft(pair)
    rng = np.random.default_rng(6)
    fresh = [rng.integers(4, 300, size=24).tolist() for _ in range(3)]
    cfg = TrainConfig(model="m", out="o", batch=2, anchors=8, block_size=draft.args.block_size)
    w = slot_weights(draft.args.block_size, 7.0)
    once = validate(draft, target, Dataset(fresh, [4] * 3), cfg, w)
    assert once["novel_blocks"] == once["blocks"] > 0
    assert once["novel_tokens_per_cycle"] == once["tokens_per_cycle"]
    twice = validate(draft, target, Dataset([f + f for f in fresh], [4] * 3), cfg, w)
    assert 0 < twice["novel_blocks"] < twice["blocks"]


def test_the_profiled_forward_parts_end_in_the_training_loss(pair):
    target, draft, batch, taps, w = random_blocks(pair, 1, sequences=2, length=50,
                                                  prompt_len=6)
    parts = dict(forward_parts(draft, target, batch, taps, w, target.lm_head))
    assert list(parts) == ["forward_draft_layers", "forward_head", "forward_loss"]
    N, A, K = batch.labels.shape
    assert parts["forward_head"].shape == (N, A, K, target.vocab_size)
    assert mx.array_equal(parts["forward_loss"], block_loss(draft, target, batch, taps, w))


def test_the_loss_over_bfloat16_logits_has_the_float32_gradient():
    """A bf16 head's logits go into the loss without a float32 copy: the gradient is the one
    through the copy to within two bf16 roundings, and the loss differs only by the per-row
    rounding of the logsumexp."""
    rng = np.random.default_rng(0)
    N, A, K, V = 2, 3, 4, 4096
    logits = rng.normal(0, 3, (N, A, K, V)).astype(np.float32)
    labels = rng.integers(0, V, (N, A, K)).astype(np.int32)
    np.put_along_axis(logits, labels[..., None], 12.0, axis=-1)  # peaked, as trained drafts are
    valid = (rng.random((N, A, K)) < 0.8).astype(np.float32)
    batch = Batch(mx.zeros((N, 1), mx.int32), mx.zeros((N, 1), mx.int32),
                  mx.zeros((N, A), mx.int32), mx.array(labels), mx.array(valid))
    weights = mx.array(np.linspace(1.0, 0.5, K), mx.float32)
    x = mx.array(logits).astype(mx.bfloat16)

    def through_float32(z: mx.array) -> mx.array:
        z = z.astype(mx.float32)
        ce = mx.logsumexp(z, axis=-1) - mx.take_along_axis(z, batch.labels[..., None], -1)[..., 0]
        w = batch.valid * weights
        return (ce * w).sum() / w.sum()

    want_loss, want_grad = mx.value_and_grad(through_float32)(x)
    loss, grad = mx.value_and_grad(lambda z: slot_loss(z, batch, weights))(x)
    assert grad.dtype == mx.bfloat16
    # the same softmax; it and the cotangent's scaling each round once in bf16
    assert mx.allclose(grad, want_grad, rtol=2 ** -6, atol=1e-12)
    assert abs(loss.item() - want_loss.item()) < 0.02
    exact = mx.array(logits)  # float32 logits (CPU training): the same loss to the last bit
    assert mx.array_equal(slot_loss(exact, batch, weights), through_float32(exact))


def test_a_tap_count_the_target_cannot_hold_is_refused_naming_a_fix(pair, tmp_path):
    """Spread over a 4-layer target, 3 taps fall on one layer ([1, 1, 1]): refused in one
    line with a list that fits, not trained as a draft reading the same layer three times."""
    target_dir = pair[0]
    data = tmp_path / "data.npz"
    Dataset([[1, 2, 3, 4, 5, 6]] * 6, [2] * 6).save(data)
    argv = ["--model", str(target_dir), "--out", str(tmp_path / "d"), "--taps", "3",
            "--data", str(data), "--steps", "1", "--no-progress"]
    with pytest.raises(ConfigError, match=r"--taps 3: layers \[1, 1, 1\].*--taps 1$"):
        train(TrainConfig(**vars(build_parser().parse_args(argv))), say=lambda m: None)


def test_answering_loads_the_target_once_at_the_generation_dtype(pair, tmp_path, monkeypatch):
    """--gen-dtype: a --collect-only run loads the target once, at that dtype (not first at
    --dtype as well: on a lent GPU that is a second load of every weight before any answer);
    a run that answers and then trains loads it at --gen-dtype, then at --dtype."""
    import engine.loading

    target_dir = pair[0]
    real, loads = engine.loading.load_target, []

    def counting(model_id, dtype=None, *args, **kwargs):
        loads.append(dtype)
        return real(model_id, dtype, *args, **kwargs)

    monkeypatch.setattr(engine.loading, "load_target", counting)
    base = ["--model", str(target_dir), "--depth", "1", "--taps", "1,2", "--max-len", "12",
            "--num-prompts", "8", "--gen-batch", "8", "--no-progress", "--gen-dtype", "bfloat16"]
    log = train(TrainConfig(**vars(build_parser().parse_args(
        base + ["--out", str(tmp_path / "a"), "--collect-only"]))), say=lambda m: None)
    assert log["sequences"] > 0 and loads == ["bfloat16"]
    loads.clear()
    train(TrainConfig(**vars(build_parser().parse_args(
        base + ["--out", str(tmp_path / "b"), "--steps", "1", "--batch", "2", "--anchors", "2",
                "--val-size", "2", "--val-every", "1"]))), say=lambda m: None)
    assert loads == ["bfloat16", "float32"]


def test_train_end_to_end_round_trips(pair, tmp_path):
    """The CLI path: generate data, train, checkpoint in the published layout, resume, and the
    checkpoint loads unchanged and drives DFlashRuntime losslessly."""
    target_dir, _, model, tokenizer = pair
    out = tmp_path / "draft"
    argv = ["--model", str(target_dir), "--out", str(out), "--depth", "1", "--taps", "1,2",
            "--steps", "6", "--batch", "4", "--anchors", "4", "--max-len", "12",
            "--num-prompts", "24", "--gen-batch", "8", "--val-every", "3",
            "--checkpoint-every", "3", "--val-size", "4", "--no-progress"]
    log = train(TrainConfig(**vars(build_parser().parse_args(argv))), say=lambda m: None)
    assert log["steps"] == 6 and log["val"] and log["final_val"]["tokens_per_cycle"] >= 1.0
    assert log["final_val"]["walk_tokens_per_cycle"] >= 1.0  # the decode-like figure beside it
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 2]
    weights = mx.load(str(out / "model.safetensors"))
    assert not any("embed" in k or "lm_head" in k for k in weights)
    assert "fc.weight" in weights and "layers.0.self_attn.q_proj.weight" in weights

    data = Dataset.load(out / "resume" / "data.npz")
    assert len(data) > 0 and all(p < len(s) for s, p in zip(data.sequences, data.prompt_lens))
    # the ranking of the training answers (validation held out), read back with the draft
    ranking = json.loads((out / "token_ranking.json").read_text())
    assert ranking["version"] == 1 and "train-draft" in ranking["source"]
    assert ranking["token_ids"] == token_ranking([data.split(4)[0]])
    assert len(ranking["token_ids"]) > 5
    loaded = DFlashRuntime.from_pretrained(model=str(target_dir), draft=str(out))
    assert loaded.token_ranking == ranking["token_ids"]

    argv2 = [a if a != "6" else "8" for a in argv] + ["--resume"]
    log2 = train(TrainConfig(**vars(build_parser().parse_args(argv2))), say=lambda m: None)
    assert log2["steps"] == 6  # resumed: the saved schedule (6 steps) was already done

    draft = load_draft_folder(out)
    rt = DFlashRuntime(model, tokenizer, draft)
    prompt = [{"role": "user", "content": "What is 12 times 7?"}]
    spec = rt.generate(prompt, max_tokens=20, no_eos=True)
    plain = rt.generate(prompt, max_tokens=20, no_eos=True, speculative=False)
    assert spec.tokens == plain.tokens and spec.speculative
    assert DraftProposer(rt.target, draft).draft_proposal(5, 4).shape == (1, 4)


def test_length_grouped_batches_cover_every_sequence_with_little_padding():
    """Every index once per epoch, batches of similar lengths (padding a batch to its longest
    sequence then wastes little), and a different order for another seed."""
    lengths = np.random.default_rng(0).integers(20, 2000, 1000)
    order = length_grouped_order(lengths, 8, np.random.default_rng(1), group=16)
    assert sorted(order) == list(range(1000))
    shuffled = np.random.default_rng(1).permutation(1000)

    def padded(o: np.ndarray) -> int:
        return sum(lengths[o[i:i + 8]].max() for i in range(0, 1000, 8))

    assert padded(order) < 0.75 * padded(shuffled)
    firsts = [lengths[order[i]] for i in range(0, 1000, 8)]
    assert not np.all(np.diff(firsts) >= 0)  # batches come in a random order, not sorted
    assert not np.array_equal(order, length_grouped_order(lengths, 8, np.random.default_rng(2),
                                                          group=16))


def test_a_paused_run_resumes_to_the_same_weights(pair, tmp_path):
    """--pause-after ends a run early with its state saved; --resume continues the same
    schedule and data order, so two paused calls and a resumed one end exactly where one
    uninterrupted run does. --profile-steps times the phases of a step."""
    target_dir, *_ = pair
    run = tiny_run(target_dir, tmp_path)

    whole = run("whole", "--profile-steps", "2", "--steps", "8")
    assert set(whole["step_profile"]) == {"batch", "target", "forward_draft_layers",
                                          "forward_head", "forward_loss",
                                          "draft_forward_backward", "update"}
    assert not whole["paused"]
    first = run("parts", "--pause-after", "0", "--steps", "8")
    assert first["steps"] == 1 and first["paused"]
    # a paused call leaves the final validation (and its device time) to the last call
    assert "final_val" not in first and "final_val" in whole
    assert run("parts", "--pause-after", "0", "--steps", "8", "--resume")["steps"] == 2
    last = run("parts", "--steps", "8", "--resume")
    assert last["steps"] == 8 and not last["paused"]
    assert [h["step"] for h in last["history"]] == [1, 2, 8]  # every call's steps, in order
    a = mx.load(str(tmp_path / "whole" / "resume" / "draft-fp32.safetensors"))
    b = mx.load(str(tmp_path / "parts" / "resume" / "draft-fp32.safetensors"))
    assert all(mx.array_equal(a[k], b[k]).item() for k in a)


def test_a_resumed_run_keeps_its_mask_token(pair, tmp_path, monkeypatch):
    """--resume builds the draft with the mask token the paused run trained with, even where
    this machine's tokenizer would pick another one."""
    target_dir, *_ = pair
    run = tiny_run(target_dir, tmp_path)
    run("parts", "--pause-after", "0", "--steps", "8", "--mask-token-id", "7")
    monkeypatch.setattr(train_loop, "pick_mask_token", lambda *a: 9)
    run("parts", "--steps", "8", "--resume")
    config = json.loads((tmp_path / "parts" / "config.json").read_text())
    assert config["dflash_config"]["mask_token_id"] == 7


def test_the_schedule_fits_the_time_left_at_the_pace_so_far():
    assert steps_that_fit(100, 0.2, 100.0, 100_000) == 600
    assert steps_that_fit(100, 0.2, 100.0, 400) == 400  # never past --steps
    assert steps_that_fit(100, 0.2, -5.0, 400) == 101  # out of time: one more step ends it
    # a pace that slows shortens the schedule again, so the decay still ends on time
    assert steps_that_fit(600, 0.3, 60.0, 100_000) < steps_that_fit(600, 0.2, 60.0, 100_000)


def test_train_seconds_set_the_schedules_length(pair, tmp_path, monkeypatch):
    """--train-seconds: the cosine schedule is sized from the pace of steps 5..20 and sized
    again every REPLAN_EVERY steps, and the run ends at the schedule's end, not at --steps."""
    target_dir, *_ = pair

    class Clock:  # every reading 10 ms on: the pace, whatever else runs on this machine
        now = 0.0

        def perf_counter(self) -> float:
            self.now += 0.01
            return self.now

    monkeypatch.setattr(train_loop, "time", Clock())
    said: list[str] = []
    data = tmp_path / "data.npz"
    Dataset([[1, 10 + i % 5, 3, 4, 5, 6, 7, 8] for i in range(12)], [2] * 12).save(data)
    argv = ["--model", str(target_dir), "--out", str(tmp_path / "d"), "--depth", "1",
            "--taps", "1", "--steps", "100000", "--batch", "2", "--anchors", "2",
            "--data", str(data), "--val-size", "2", "--val-every", "1000", "--no-progress",
            "--train-seconds", "4"]
    log = train(TrainConfig(**vars(build_parser().parse_args(argv))), say=said.append)
    assert any("schedule set to" in m for m in said)
    assert 20 < log["total_steps"] < 100_000 and log["steps"] <= log["total_steps"]


def test_extra_data_keeps_its_own_validation_split(pair, tmp_path):
    target_dir, *_ = pair
    extra = Dataset([[1, 10 + i, 3, 4, 5, 6] for i in range(7)], [2] * 7)
    extra.save(tmp_path / "extra.npz")
    argv = ["--model", str(target_dir), "--out", str(tmp_path / "d"), "--depth", "1",
            "--taps", "1", "--steps", "2", "--batch", "2", "--anchors", "2", "--max-len", "6",
            "--num-prompts", "10", "--gen-batch", "10", "--val-size", "2", "--no-progress",
            "--extra-data", str(tmp_path / "extra.npz")]
    log = train(TrainConfig(**vars(build_parser().parse_args(argv))), say=lambda m: None)
    # every data file holds back its own validation sequences (7 // 5 = 1 of the extra)
    assert log["data"]["train_sequences"] == log["data"]["sequences"] - 2 + 6
    assert log["data"]["val_sets"] == {"data.npz": 2, "extra.npz": 1}
    assert set(log["final_val_sets"]) == {"data.npz", "extra.npz"}
    ranking = json.loads((tmp_path / "d" / "token_ranking.json").read_text())
    assert {3, 4, 5, 6} <= set(ranking["token_ids"][:8])  # 7 answers each: counted
    assert "extra.npz" in ranking["source"]
    bad = train_draft_main(argv[:-1] + [str(tmp_path / "missing.npz")])
    assert bad == 2


def test_data_weights_set_each_files_share_of_an_epoch():
    rules = parse_data_weights("gen-19-*.npz=2, *-cpu.npz=0, *=0.25")
    assert [data_weight(n, rules) for n in ("gen-19-0.npz", "gen-16-cpu.npz", "data.npz")] \
        == [2.0, 0.0, 0.25]
    assert data_weight("x.npz", parse_data_weights("gen-*=3")) == 1.0  # unmatched: whole
    assert data_weight("/root/gen-19-1/data.npz", parse_data_weights("*/gen-19-1/*=2")) == 2.0
    for bad in ("", "gen=x", "=2", "gen=-1", "gen"):
        with pytest.raises(ValueError, match="weight|rule"):
            parse_data_weights(bad)
    rng = np.random.default_rng(0)
    picked = weighted_indices([40, 10, 20], [0.25, 2.0, 0.0], rng)
    counts = np.bincount(picked, minlength=70)
    assert len(picked) == 10 + 20 and set(counts[40:50]) == {2} and not counts[50:].any()
    assert counts[:40].sum() == 10 and counts[:40].max() == 1  # a quarter, none twice
    again = weighted_indices([40, 10, 20], [0.25, 2.0, 0.0], rng)
    assert set(again[again < 40]) != set(picked[picked < 40])  # drawn anew each epoch


def test_training_draws_its_epochs_by_the_data_weights(pair, tmp_path):
    """--data-weights: each file's weight is logged and said (weighted_indices draws the
    epochs by them, above), and a bad rule or an empty epoch is a one-line error."""
    target_dir, *_ = pair
    for name, start in (("old.npz", 10), ("fresh.npz", 40)):
        Dataset([[1, start + i, 3, 4, 5, 6, 7, 8] for i in range(12)], [2] * 12).save(
            tmp_path / name)
    argv = ["--model", str(target_dir), "--out", str(tmp_path / "d"), "--depth", "1",
            "--taps", "1", "--data", str(tmp_path / "old.npz"), "--extra-data",
            str(tmp_path / "fresh.npz"), "--steps", "3", "--batch", "2", "--anchors", "2",
            "--max-len", "8", "--val-size", "2", "--no-progress"]
    said: list[str] = []
    log = train(TrainConfig(**vars(build_parser().parse_args(
        argv + ["--data-weights", "old.npz=0,fresh*=1.5"]))), say=said.append)
    assert log["data"]["weights"] == {"old.npz": 0.0, "fresh.npz": 1.5}
    assert any("an epoch takes 0 x old.npz, 1.5 x fresh.npz" in m for m in said)
    assert train_draft_main(argv + ["--data-weights", "*=0"]) == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv + ["--data-weights", "old.npz"])


def test_init_with_a_tap_list_grows_the_drafts_taps(pair, tmp_path):
    """--init DRAFT --taps LIST adds target layers to the draft's taps (grow_taps) and saves
    the grown draft; a list that drops one of its taps is a one-line error."""
    target_dir, draft_dir, *_ = pair
    old = json.loads((draft_dir / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    layers = json.loads((draft_dir / "config.json").read_text())["num_target_layers"]
    taps = sorted(set(old) | {next(i for i in range(layers) if i not in old)})
    data = Dataset([[1, 10 + i, 3, 4, 5, 6, 7, 8] for i in range(12)], [2] * 12)
    data.save(tmp_path / "data.npz")
    argv = ["--model", str(target_dir), "--out", str(tmp_path / "d"), "--init", str(draft_dir),
            "--taps", ",".join(map(str, taps)), "--data", str(tmp_path / "data.npz"),
            "--steps", "2", "--batch", "2", "--anchors", "2", "--max-len", "8",
            "--val-size", "2", "--no-progress"]
    said: list[str] = []
    train(TrainConfig(**vars(build_parser().parse_args(argv))), say=said.append)
    assert any("taps grown" in m for m in said)
    saved = json.loads((tmp_path / "d" / "config.json").read_text())
    assert saved["dflash_config"]["target_layer_ids"] == taps
    dropped = ",".join(str(t) for t in taps if t != old[0])
    assert train_draft_main(argv[:7] + [dropped] + argv[8:]) == 2


def test_data_files_of_the_same_name_keep_apart_in_logs():
    from pathlib import Path

    from engine.train.loop import data_names

    paths = [Path("a/data.npz"), Path("b/data.npz"), Path("c/extra.npz")]
    assert data_names(paths) == ["a/data.npz", "b/data.npz", "extra.npz"]


def test_validation_split_spans_the_whole_dataset():
    # generation runs in equal-prompt-length groups: a tail split would be one group
    data = Dataset([[i, i + 1, i + 2] for i in range(100)], [1] * 100)
    train_set, val_set = data.split(10)
    firsts = [s[0] for s in val_set.sequences]
    assert len(val_set) == 10 and len(train_set) == 90
    assert firsts[0] == 0 and firsts[-1] == 99 and max(firsts[1:5]) < 50
    assert not {tuple(s) for s in val_set.sequences} & {tuple(s) for s in train_set.sequences}


def test_prompt_set_is_the_same_in_every_process():
    """Stdlib signatures must not carry object addresses (they change per process)."""
    import subprocess
    import sys

    code = ("import hashlib; from engine.train.prompts import build_prompts; "
            "print(hashlib.sha256(repr(build_prompts(3000, seed=1)).encode()).hexdigest())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout for _ in range(2)}
    assert len(runs) == 1


def test_prompt_set_is_diverse_and_seeded():
    a, b = build_prompts(2000, seed=3), build_prompts(2000, seed=3)
    assert a == b and len({repr(m) for _, m in a}) == 2000
    assert {c for c, _ in a} >= {"chat", "code", "maths", "writing", "explain", "multi_turn",
                                 "stdlib_code", "reasoning", "extraction", "howto",
                                 "word_problem", "science"}


def test_continue_batch_equals_single_greedy(pair):
    from engine.runtime import plain_decode
    from engine.train.generate import continue_batch

    _, _, model, tokenizer = pair
    target = adapter_for(model)
    prompts = [[5, 17, 40, 2, 99], [7, 61, 88, 9, 33], [1, 2, 3, 4, 5]]
    got = continue_batch(model, prompts, 10, eos={10_000})
    for p, g in zip(prompts, got):
        want = [t for c in plain_decode(target, p, 10, 64) for t in c.tokens]
        assert g == want


def test_continue_batch_left_pads_mixed_lengths(pair):
    from engine.runtime import plain_decode
    from engine.train.generate import continue_batch

    _, _, model, _ = pair
    target = adapter_for(model)
    prompts = [[5, 17, 40, 2, 99, 3, 8], [7, 61], [1, 2, 3, 4]]
    got = continue_batch(model, prompts, 10, eos={10_000})
    for p, g in zip(prompts, got):
        want = [t for c in plain_decode(target, p, 10, 64) for t in c.tokens]
        assert g == want


def test_running_batch_equals_single_greedy_through_refills(pair):
    """Rows that end leave the batch and queued prompts take their place (continuous
    batching): every answer still equals the prompt's own greedy decoding, cut at its first
    EOS or at the token limit."""
    from engine.runtime import plain_decode
    from engine.train.generate import answer_running

    _, _, model, _ = pair
    target = adapter_for(model)
    prompts = [[5, 17, 40, 2, 99, 3, 8], [7, 61], [1, 2, 3, 4], [9, 9, 8], [30, 31, 32, 33, 34],
               [2], [44, 45, 46, 47, 48, 49, 50, 51], [60, 6]]
    alone = [[t for c in plain_decode(target, p, 14, 64) for t in c.tokens] for p in prompts]
    eos = {alone[0][4], alone[3][2]}  # some rows end early, others run to the limit
    want = [a[:next((j + 1 for j, t in enumerate(a) if t in eos), len(a))] for a in alone]
    assert len({len(w) for w in want}) > 1
    for attention, in_place in (("mlx", True), ("mlx", False), ("grouped", True),
                                ("grouped", False), ("auto", True)):
        stats: dict = {}
        got = answer_running(model, prompts, 14, eos, width=3, refill_every=3,
                             prefill_tokens=8, attention=attention, stats=stats,
                             in_place=in_place)
        assert got == dict(enumerate(want))
        assert stats["counts"]["fills"] >= 2 and stats["counts"]["drops"] >= 2


def test_follow_ups_join_the_running_batch_and_are_answered_like_the_rest(pair, monkeypatch):
    """A conversation's next turn: `follow_up` appends a prompt built from an answer that
    ended, and the same run answers it before the prompts still queued, as greedy decoding
    of that prompt alone would; the non-paddable path answers them in a later round."""
    from engine.runtime import plain_decode
    from engine.train import generate
    from engine.train.generate import answer_prompts, answer_running

    _, _, model, tokenizer = pair
    target = adapter_for(model)
    prompts = [[5, 17, 40, 2, 99, 3, 8], [7, 61], [1, 2, 3, 4], [9, 9, 8], [30, 31, 32]]
    first = len(prompts)
    parent: dict[int, int] = {}
    ended: list[set[int]] = []  # the prompts whose answers ended at each check

    def follow_up(done: dict[int, list[int]]) -> list[int]:
        ended.append(set(done))
        added = []
        for j, answer in done.items():
            if j < first:  # one more turn for each opener, none for the turns themselves
                prompts.append(prompts[j] + answer + [11, 12])
                parent[len(prompts) - 1] = j
                added.append(len(prompts) - 1)
        return added

    eos = set(tokenizer.eos_token_ids)

    def alone(prompt: list[int]) -> list[int]:  # greedy decoding of the prompt alone
        a = [t for c in plain_decode(target, prompt, 9, 64) for t in c.tokens]
        return a[:next((i + 1 for i, t in enumerate(a) if t in eos), len(a))]

    got = answer_running(model, prompts, 9, eos, width=2, refill_every=3, follow_up=follow_up)
    assert sorted(got) == list(range(2 * first)) and sorted(parent.values()) == list(range(first))
    # every answer runs to the token limit: two rows end together, their next turns go next
    assert len(ended[0]) == 2 and ended[1] == {k for k in parent if parent[k] in ended[0]}
    for k, answer in got.items():
        assert answer == alone(prompts[k])
        if k in parent:
            assert prompts[k][:len(prompts[parent[k]])] == prompts[parent[k]]
    running = {tuple(prompts[k]): a for k, a in got.items()}
    del prompts[first:]
    parent.clear()
    monkeypatch.setattr(generate, "paddable", lambda model: False)  # batches of equal lengths
    rounds = answer_prompts(model, tokenizer, prompts, 9, batch=2, follow_up=follow_up)
    assert {tuple(prompts[k]): a for k, a in rounds.items()} == running


def test_auto_attention_times_both_ways_then_keeps_the_faster(pair):
    """A running batch with attention "auto" decodes its first step runs alternately with
    each way, AUTO_TRIALS each, and settles on the one with the lower best time."""
    from engine.train.generate import AUTO_TRIALS, RunningBatch, answer_running

    _, _, model, _ = pair
    stats: dict = {}
    answer_running(model, [[5, 17, 40], [7, 61], [1, 2, 3, 4]], 40, set(), width=3,
                   refill_every=4, attention="auto", stats=stats)
    assert sorted(stats["attention_trials"]) == ["grouped", "mlx"]
    assert all(len(ms) == AUTO_TRIALS for ms in stats["attention_trials"].values())
    fastest = min(stats["attention_trials"], key=lambda w: min(stats["attention_trials"][w]))
    assert stats["attention"] == fastest
    batch = RunningBatch(model, 8, set(), 2, attention="auto")
    for way, ms in zip(["mlx", "grouped"] * AUTO_TRIALS, [5.0, 1.0, 0.5, 2.0]):
        assert batch.attention == "auto"
        batch._timed(way, ms)
    assert batch.attention == "mlx"  # its best run (0.5) beats grouped's (1.0)
    with pytest.raises(ValueError, match="attention 'fused'"):
        RunningBatch(model, 8, set(), 2, attention="fused")


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_grouped_attention_step_equals_the_models_own(tmp_path, family):
    """decode_logits "grouped" (the H / Hkv queries of a KV head as rows of one product)
    gives the model's own logits over a left-padded cache, step after step."""
    from engine.train.generate import decode_logits, last_logits, left_padded, left_padded_cache

    target_dir, _ = make_tiny_pair(tmp_path, family)
    model, _, _ = load_target(str(target_dir), "float32")
    tokens, pads = left_padded([[5, 17, 40, 2, 99, 3, 8], [7, 61], [1, 2, 3, 4]])
    logits = {}
    for attention in ("mlx", "grouped"):
        cache = left_padded_cache(model, pads)
        tok = mx.argmax(last_logits(model, tokens, cache), axis=-1)
        logits[attention] = []
        for _ in range(6):
            logits[attention].append(decode_logits(model, tok, cache, attention))
            tok = mx.argmax(logits[attention][-1], axis=-1)
    for a, b in zip(logits["mlx"], logits["grouped"]):
        assert mx.allclose(a, b, atol=1e-5).item()
    with pytest.raises(ValueError):
        decode_logits(model, tok, cache, "fused")


def test_length_batches_bound_width_and_tokens():
    from engine.train.generate import length_batches

    lengths = [10, 50, 11, 12, 10, 300, 49]
    runs = length_batches(lengths, batch=3, max_new=20, token_budget=150, paddable=True)
    assert sorted(i for r in runs for i in r) == list(range(len(lengths)))
    for r in runs:
        assert len(r) <= 3 and len(r) * (max(lengths[i] for i in r) + 20) <= max(150, 320)
    assert [5] in runs  # alone: 300 + 20 tokens exceed the budget by itself
    exact = length_batches(lengths, batch=8, max_new=20, token_budget=10_000, paddable=False)
    assert all(len({lengths[i] for i in r}) == 1 for r in exact)
    assert sorted(map(sorted, exact)) == [[0, 4], [1], [2], [3], [5], [6]]


def test_token_ranking_counts_responses_only(tmp_path):
    a = Dataset([[9, 9, 9, 9, 1, 2, 2, 3], [9, 9, 3, 3]], [4, 2])
    b = Dataset([[9, 5, 1, 5]], [1])
    # responses: 1 2 2 3 | 3 3 | 5 1 5 -> 3 x3, then 1, 2, 5 x2 each (ties by id); 9 only in
    # prompts
    assert token_ranking([a, b]) == [3, 1, 2, 5]
    path = write_token_ranking(token_ranking([a, b]), tmp_path, "unit test")
    assert json.loads(path.read_text()) == {"version": 1, "source": "unit test",
                                            "token_ids": [3, 1, 2, 5]}
    assert token_ranking([Dataset([], [])]) == []


def test_token_ranking_script_writes_a_loadable_ranking(pair, tmp_path):
    import shutil

    from engine.loading import read_token_ranking

    _, draft_dir, *_ = pair
    script = load_script("token_ranking")
    draft = tmp_path / "draft"
    shutil.copytree(draft_dir, draft)
    Dataset([[1, 2, 3, 3]], [2]).save(tmp_path / "a.npz")
    Dataset([[1, 7, 7, 7, 2]], [1]).save(tmp_path / "b.npz")
    assert script.main([str(draft), str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]) == 0
    assert read_token_ranking(draft, 320) == [7, 3, 2]
    assert "a.npz + b.npz" in json.loads((draft / "token_ranking.json").read_text())["source"]
    with pytest.raises(SystemExit):
        script.main([str(tmp_path), str(tmp_path / "a.npz")])  # not a draft folder


def test_data_parallel_training_keeps_ranks_in_step(pair, tmp_path):
    """Two local processes (ring backend, as on two GPUs with NCCL) train one draft: each
    reads its own share of every batch, gradients are averaged, and rank 0 saves a draft
    whose weights every rank holds too."""
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("mlx.launch") is None:
        pytest.skip("mlx.launch not on PATH")
    target_dir, *_ = pair
    Dataset([[1 + (i * 7 + j) % 50 for j in range(14)] for i in range(24)], [4] * 24).save(
        tmp_path / "data.npz")
    out = tmp_path / "dp"
    argv = ["--model", str(target_dir), "--out", str(out), "--depth", "1", "--taps", "1,2",
            "--steps", "5", "--batch", "2", "--anchors", "3", "--val-every", "5",
            "--checkpoint-every", "5", "--val-size", "4", "--no-progress",
            "--data", str(tmp_path / "data.npz"), "--distributed", "ring"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    run = subprocess.run(["mlx.launch", "-n", "2", "--backend", "ring", "--python",
                          sys.executable, "-m", "engine.train", *argv], env=env, cwd=os.getcwd(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    log = json.loads((out / "train-log.json").read_text())
    assert log["steps"] == 5 and log["ranks"] == {"count": 2, "weights_agree": True}
    assert (out / "model.safetensors").is_file()


def test_gen_profile_times_every_section_and_attributes_a_running_batch(pair):
    target_dir, *_ = pair
    module = load_script("gen_profile")
    report = module.profile(str(target_dir), "float32", [2, 3], [8], steps=2, sdpa_reps=2,
                            running_width=4, running_prompts=10, max_new=6,
                            running_seconds=None, prompts_file=None, prompt_median=6)
    assert {"machine", "versions", "wheels", "shape"} <= set(report)
    assert set(report["summary"]["running_tokens_per_s"]) == {
        "grouped_in_place", "grouped", "grouped_8_rows", "mlx"}
    assert report["summary"]["step_shape"] == [3, 8]
    assert [(r["width"], r["context"]) for r in report["model_step"]] == [(2, 8), (3, 8)]
    for row in report["model_step"]:
        for way in ("plain", "masked", "half_padded", "half_padded_grouped", "plain_synced",
                    "half_padded_synced", "half_padded_grouped_synced"):
            assert row[f"{way}_ms"] > 0 and row[f"{way}_tokens_per_s"] > 0
    for row in report["sdpa"]:
        for way in ("fused_nomask", "fused_boolmask", "grouped_mask", "unfused_values",
                    "grouped_values"):
            assert row[f"{way}_ms"] > 0
    assert [r["width"] for r in report["cache"]] == [3]  # the widest batch only
    assert report["cache"][0]["update_read_synced_ms_per_step"] > 0
    assert [(r["attention"], r["in_place"], r["width"]) for r in report["running"]] == [
        ("grouped", True, 4), ("grouped", False, 4), ("grouped", False, 8), ("mlx", False, 4)]
    for row in report["running"]:
        assert row["answers"] == 10 and row["tokens"] > 0  # every prompt answered
        assert set(row["seconds"]) == {"decode", "sync", "check", "loops", "drop", "fill"}
        counts = row["counts"]
        assert counts["steps"] > 0 and counts["fills"] >= 2 and counts["drops"] >= 2
        assert counts["row_steps"] >= counts["steps"] and counts["prefill_tokens"] >= 10


def test_heldout_by_source_reports_each_source_with_its_decode_walk(pair, tmp_path):
    target_dir, draft_dir, *_ = pair
    script = load_script("heldout_by_source")
    rng = np.random.default_rng(0)
    seqs = [rng.integers(4, 300, size=30).tolist() for _ in range(3)]
    Dataset(seqs, [6, 8, 5], {"ids": ["sharegpt-1", "evals-7", "sharegpt-9"]}).save(
        tmp_path / "heldout.npz")
    out = tmp_path / "report.json"
    assert script.main(["--draft", str(draft_dir), "--model", str(target_dir), "--heldout",
                        str(tmp_path / "heldout.npz"), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["drafts"][str(draft_dir)]
    assert sorted(rows) == ["all", "evals", "sharegpt"] and rows["sharegpt"]["answers"] == 2
    for row in rows.values():
        assert 1.0 <= row["walk_tokens_per_cycle"] <= 16 and row["tokens_per_cycle"] >= 1.0


def test_training_reports_the_held_out_set_by_source(pair, tmp_path):
    """The final validation splits the held-out answers by their prompts' source (record
    ids SOURCE-N): where the draft is weak, in every training log, at no extra pass."""
    target_dir = pair[0]
    rng = np.random.default_rng(1)
    seqs = [rng.integers(4, 300, size=30).tolist() for _ in range(4)]
    Dataset(seqs, [6, 8, 5, 7], {"ids": ["sharegpt-1", "evals-7", "sharegpt-9",
                                        "gsm8k_train-3"]}).save(tmp_path / "heldout.npz")
    log = tiny_run(target_dir, tmp_path)("d", "--heldout", str(tmp_path / "heldout.npz"))
    rows = log["final_val_by_source"]
    assert list(rows) == ["evals", "gsm8k_train", "sharegpt"]
    assert [rows[s]["answers"] for s in rows] == [1, 1, 2]
    for row in rows.values():
        assert 1.0 <= row["walk_tokens_per_cycle"] <= 16 and row["tokens_per_cycle"] >= 1.0
    walks = sum(r["walk_tokens_per_cycle"] * r["answers"] for r in rows.values()) / 4
    assert walks == pytest.approx(log["final_val"]["walk_tokens_per_cycle"])
    assert log["final_val_sets"]["heldout"] == {k: v for k, v in log["final_val"].items()
                                                if k != "set"}
    plain = tmp_path / "plain"  # no held-out set: the first file's split, no ids, no rows
    plain.mkdir()
    assert tiny_run(target_dir, plain)("e")["final_val_by_source"] == {}


def test_bfloat16_compute_keeps_float32_weights_and_their_gradients(pair):
    """Mixed precision: the draft's matmuls in bfloat16, its weights and their gradients in
    float32, the gradients close to float32 training's."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from engine.train.objective import computing_in

    target, draft, batch, taps, w = random_blocks(pair, 1, sequences=2, length=50,
                                                  prompt_len=6)

    def grads_in(dtype):
        def loss():
            with computing_in(draft, dtype):
                assert all(v.dtype == dtype for _, v in tree_flatten(draft.parameters()))
                return block_loss(draft, target, batch, taps, w)

        return dict(tree_flatten(nn.value_and_grad(draft, loss)()[1]))

    full, mixed = grads_in(mx.float32), grads_in(mx.bfloat16)
    assert all(v.dtype == mx.float32 for _, v in tree_flatten(draft.parameters()))
    assert set(full) == set(mixed) and all(g.dtype == mx.float32 for g in mixed.values())
    a = mx.concatenate([full[k].reshape(-1) for k in sorted(full)])
    b = mx.concatenate([mixed[k].reshape(-1) for k in sorted(full)])
    cosine = (a * b).sum() / mx.sqrt((a * a).sum() * (b * b).sum())
    assert cosine.item() > 0.99 and not mx.array_equal(a, b).item()


def test_training_with_bfloat16_compute_lowers_the_loss(pair, tmp_path):
    target_dir = pair[0]
    log = tiny_run(target_dir, tmp_path)("bf16", "--draft-compute-dtype", "bfloat16",
                                         "--steps", "30", "--lr", "3e-3")
    assert log["config"]["draft_compute_dtype"] == "bfloat16"
    losses = [h["loss"] for h in log["history"]]  # means over steps 1-10, 11-20, 21-30
    assert len(losses) == 3 and losses[-1] < losses[0]
    saved = mx.load(str(tmp_path / "bf16" / "model.safetensors"))
    assert saved and all(mx.isfinite(v).all().item() for v in saved.values())


def test_the_loss_vocabulary_is_the_batchs_tokens_then_the_ranking(pair):
    target, draft, batch, taps, w = random_blocks(pair, 3, sequences=2, length=40, prompt_len=8)
    vocab = target.vocab_size
    ranked = [299, 5, 298, 7]  # the response ranking; the other ids follow by id
    size = len(set(np.asarray(batch.tokens).ravel().tolist())) + 3
    restricted, head = LossVocabulary.build(target, mx.float32, ranked, size).restrict(batch)
    logits = slot_logits(draft, target, batch, taps)
    kept = np.zeros(vocab, bool)
    kept[np.asarray(batch.tokens).ravel()] = True
    extra = [t for t in ranked + list(range(vocab)) if not kept[t]][:3]
    kept[extra] = True
    assert kept.sum() == size
    ids = np.flatnonzero(kept)
    # the labels point at their own tokens inside the subset
    assert (ids[np.asarray(restricted.labels)] == np.asarray(batch.labels)).all()
    sub = slot_logits(draft, target, restricted, taps, head)
    assert sub.shape[-1] == size
    assert mx.allclose(sub, logits[..., mx.array(ids)], atol=1e-5).item()
    # the loss is the whole vocabulary's with every other token's logit at -inf
    masked = mx.where(mx.array(kept), logits, -mx.inf)
    assert mx.allclose(block_loss(draft, target, restricted, taps, w, head),
                       slot_loss(masked, batch, w), atol=1e-5).item()
    # a subset of the whole vocabulary is the whole vocabulary's loss
    whole, head = LossVocabulary.build(target, mx.float32, ranked, vocab).restrict(batch)
    assert mx.allclose(block_loss(draft, target, whole, taps, w, head),
                       block_loss(draft, target, batch, taps, w), atol=1e-5).item()


def test_training_over_a_loss_vocabulary_lowers_the_loss(pair, tmp_path):
    log = tiny_run(pair[0], tmp_path)("subset", "--loss-vocab", "64", "--steps", "30",
                                      "--lr", "3e-3")
    assert log["config"]["loss_vocab"] == 64
    with pytest.raises(ConfigError, match="--loss-vocab -1"):
        tiny_run(pair[0], tmp_path)("negative", "--loss-vocab", "-1")
    losses = [h["loss"] for h in log["history"]]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_the_optimizers_first_updates_are_the_learning_rate_in_size():
    params = {"w": mx.zeros(4)}
    grads = {"w": mx.array([1.0, -2.0, 3.0, -4.0])}
    opt = draft_optimizer(1e-3, 0.0)
    for step in range(1, 4):  # uncorrected, the first step alone would move 3.16e-3
        before = params["w"]
        params = opt.apply_gradients(grads, params)
        moved = np.asarray(params["w"] - before)
        assert np.allclose(moved, -1e-3 * np.sign(np.asarray(grads["w"])), rtol=1e-3), step
