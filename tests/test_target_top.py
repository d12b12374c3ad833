"""A draft whose slot states the target's own last layers finish (DraftArgs.target_top):
they read the target's cached keys and values of the context, the training forward is the
decoding one, and every committed token stays the target's own."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pytest
from test_cycle_sync import load
from tiny_pairs import make_tiny_pair, plain_greedy

from engine.cycle import DraftProposer, speculative_decode
from engine.draft import TOP_GATE_SCALE
from engine.errors import ConfigError, PairingError
from engine.loading import load_draft_folder, load_target
from engine.targets import adapter_for
from engine.train.dataset import Dataset
from engine.train.loop import TrainConfig, add_top, build_parser, train
from engine.train.objective import context_mask, target_taps, train_forward


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_dir, draft_dir = make_tiny_pair(tmp_path_factory.mktemp("top"))
    model, _, _ = load_target(str(target_dir), "float32")
    return target_dir, draft_dir, adapter_for(model)


def topped(draft_dir, count: int = 1, gate: float = 0.6):
    draft = add_top(load_draft_folder(draft_dir), count)
    draft.top_gate = mx.full((draft.args.hidden_size,), gate / TOP_GATE_SCALE)
    return draft


def test_finishing_reads_the_cache_and_leaves_it_as_it_was(pair):
    """The last layer on states after the cache's tokens == that layer in a causal forward
    of the context and the states together."""
    _, _, target = pair
    seq = mx.array([[5, 17, 40, 2, 99, 123, 7, 61]])
    cache = target.make_cache()
    _, inputs = target.forward(seq, cache, [len(target.layers) - 2])
    offsets = [c.offset for c in cache]
    states = mx.random.normal((1, 3, inputs.shape[-1]), key=mx.random.key(0))
    got = target.finish_states(states, cache, 1)
    assert [c.offset for c in cache] == offsets
    whole = mx.concatenate([inputs, states], axis=1)
    last = target.layers[-1]
    mask = mx.tril(mx.ones((whole.shape[1], whole.shape[1]), dtype=mx.bool_))
    want = last(whole, mask, cache=None)[:, -3:]
    assert mx.allclose(got, want, atol=1e-4).item()


def test_training_forward_with_a_target_top_equals_decoding(pair):
    _, draft_dir, target = pair
    draft = topped(draft_dir)
    B = draft.args.block_size
    seq = mx.array([[5, 17, 40, 2, 99, 123, 7, 61, 88, 9, 33, 14]])
    taps = target_taps(target, seq, draft.training_tap_ids)
    own = len(draft.args.target_layer_ids) * taps.shape[-1] // len(draft.training_tap_ids)

    def decoded(anchor: int) -> mx.array:
        block = mx.array([[int(seq[0, anchor])] + [draft.args.mask_token_id] * (B - 1)])
        target_cache = target.make_cache()
        target.forward(seq[:, :anchor], target_cache, [])
        cache = draft.make_cache()
        draft.append_context(taps[:, :anchor, :own], cache)
        return draft(target.embed(block), cache, finish=lambda s: target.finish_states(
            s, target_cache, 1))

    anchors = mx.array([[3, 7]])
    blocks = mx.array([[int(seq[0, a])] + [draft.args.mask_token_id] * (B - 1) for a in (3, 7)])
    got = train_forward(draft, taps, target.embed(blocks.reshape(1, -1)), anchors,
                        context_mask(anchors, seq.shape[1], B), target=target)
    assert mx.allclose(got[:, :B], decoded(3), atol=1e-4).item()
    assert mx.allclose(got[:, B:], decoded(7), atol=1e-4).item()
    draft.top_gate = mx.zeros((1,))  # a closed gate: the draft as it was
    plain = load_draft_folder(draft_dir)
    cache = plain.make_cache()
    plain.append_context(taps[:, :7, :own], cache)
    assert mx.allclose(decoded(7), plain(target.embed(blocks[1:]), cache), atol=1e-5).item()
    with pytest.raises(ValueError, match="finish"):
        draft(target.embed(blocks[1:]), cache)


def test_decoding_with_a_target_top_is_plain_greedy(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 40)
    draft = add_top(rt.draft, 1)
    draft.top_gate = mx.full((draft.args.hidden_size,), 0.8 / TOP_GATE_SCALE)
    assert not draft.can_prefetch  # it reads the settled target caches
    proposer = DraftProposer(rt.target, draft, prefetching=True)
    assert not proposer.prefetching
    finished = []
    original = rt.target.finish_states
    rt.target.finish_states = lambda *a: (finished.append(a[0].shape), original(*a))[1]
    try:
        commits = list(speculative_decode(rt.target, proposer, ids, 40, 16, 512))
    finally:
        del rt.target.finish_states
    assert [t for c in commits for t in c.tokens] == want  # plain greedy, bit for bit
    assert finished and finished[0][1] == 15  # slots 1.. of a full block


def test_the_top_is_refused_where_the_target_cannot_finish(tiny_pairs, tmp_path):
    target, draft = tiny_pairs("qwen3_5")
    folder = tmp_path / "draft"
    shutil.copytree(draft, folder)
    config = json.loads((folder / "config.json").read_text())
    config["dflash_config"]["target_top"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    from engine import DFlashRuntime
    with pytest.raises(PairingError, match="target_top"):
        DFlashRuntime.from_pretrained(model=str(target), draft=str(folder))
    plain = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    topped_draft = add_top(plain.draft, 1)
    with pytest.raises(ConfigError, match="target of .* layers cannot run on them"):
        DFlashRuntime(plain.model, plain.tokenizer, topped_draft)


def test_train_draft_adds_a_top_that_learns_saves_and_decodes(pair, tmp_path, capsys):
    target_dir, draft_dir, _ = pair
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "m", "--out", "o", "--target-top", "0"])
    assert "from 1 to 64" in capsys.readouterr().err
    data = tmp_path / "data.npz"
    Dataset([[1, 10 + i % 5, 3, 4, 5, 6, 7, 8, 9, 11] for i in range(12)], [2] * 12).save(data)
    argv = ["--model", str(target_dir), "--out", str(tmp_path / "out"), "--init",
            str(draft_dir), "--steps", "4", "--batch", "2", "--anchors", "2", "--data",
            str(data), "--val-size", "2", "--val-every", "100", "--no-progress", "--lr", "0.05"]
    log = train(TrainConfig(**vars(build_parser().parse_args([*argv, "--target-top", "1"]))),
                say=lambda m: None)
    assert log["config"]["target_top"] == 1 and log["steps"] == 4
    saved = load_draft_folder(tmp_path / "out")
    assert saved.args.target_top == 1 and float(mx.abs(saved.top_gate).max()) > 0
    from engine import DFlashRuntime
    rt = DFlashRuntime.from_pretrained(model=str(target_dir), draft=str(tmp_path / "out"))
    assert len(rt.generate([5, 9, 14, 2, 7], max_tokens=12, no_eos=True).tokens) == 12
    with pytest.raises(ConfigError, match="cannot finish"):
        train(TrainConfig(**vars(build_parser().parse_args([*argv, "--target-top", "64"]))),
              say=lambda m: None)


def test_propose_reads_the_target_cache_as_the_cycle_does(pair):
    _, draft_dir, target = pair
    from engine.cycle import propose

    draft = topped(draft_dir)
    context = [5, 17, 40, 2, 99, 123, 7, 61, 88]
    target_cache = target.make_cache()
    _, taps = target.forward(mx.array([context]), target_cache, draft.args.target_layer_ids)
    proposer = DraftProposer(target, draft)
    proposer.target_cache = target_cache
    proposer.append_context(taps)
    want = proposer.propose(33, 16, len(context))
    got = propose(target, draft, proposer.cache, 33, 16, target_cache=target_cache)
    assert got.tolist() == want.tolist()
    with pytest.raises(ValueError, match="finish"):
        propose(target, draft, proposer.cache, 33, 16)


def test_an_added_top_starts_at_the_given_gate(pair, capsys):
    _, draft_dir, _ = pair
    for gate in (0.0, 1.0):
        draft = add_top(load_draft_folder(draft_dir), 2, gate)
        assert draft.args.target_top == 2 and draft.top_input_ids == [
            draft.args.num_target_layers - 3, draft.args.num_target_layers - 2]
        assert mx.allclose(TOP_GATE_SCALE * draft.top_gate, mx.array(gate)).item()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "m", "--out", "o", "--top-gate", "1.5"])
    assert "between 0 and 1" in capsys.readouterr().err


def test_the_match_loss_is_zero_at_the_targets_own_top_input_and_trains(pair, tmp_path):
    """Slot states equal to the target's input to its top at each slot's position score 0;
    --top-match trains, and is refused without a top."""
    from engine.train.objective import make_batch, slot_weights, top_match_loss

    target_dir, draft_dir, target = pair
    draft = topped(draft_dir, 2)
    seq = [5, 17, 40, 2, 99, 123, 7, 61, 88, 9, 33, 14, 8, 70]
    batch = make_batch(Dataset([seq], [3]), [0], 4, draft.args.block_size,
                       draft.args.mask_token_id, __import__("numpy").random.default_rng(0))
    taps = target_taps(target, batch.tokens, draft.training_tap_ids)
    H = draft.args.hidden_size
    first = len(draft.args.target_layer_ids) * H
    K = draft.args.block_size - 1
    pos = mx.minimum(batch.anchors[:, :, None] + mx.arange(K)[None, None], len(seq) - 1)
    truth = taps[0, pos[0].reshape(-1), first:first + H].reshape(1, -1, K, H)
    w = slot_weights(draft.args.block_size, 7.0)
    assert float(top_match_loss(draft, truth, taps, batch, w)) < 1e-9
    assert float(top_match_loss(draft, truth * 0.5, taps, batch, w)) > 0.2
    data = tmp_path / "data.npz"
    Dataset([seq] * 6, [3] * 6).save(data)
    argv = ["--model", str(target_dir), "--out", str(tmp_path / "out"), "--init",
            str(draft_dir), "--steps", "3", "--batch", "2", "--anchors", "2", "--data",
            str(data), "--val-size", "2", "--val-every", "100", "--no-progress"]
    log = train(TrainConfig(**vars(build_parser().parse_args(
        [*argv, "--target-top", "2", "--top-gate", "1", "--top-match", "0.5"]))),
        say=lambda m: None)
    assert log["config"]["top_match"] == 0.5 and log["steps"] == 3
    with pytest.raises(ConfigError, match="no top"):
        train(TrainConfig(**vars(build_parser().parse_args([*argv, "--top-match", "1"]))),
              say=lambda m: None)
