"""Streamed forwards (issue 13): a target forward queues its work every N layers while the
host builds the rest, so a GPU starts on the first layers early. The graph is the same, so
the output is too; only when the work is queued changes."""

from __future__ import annotations

import mlx.core as mx
import pytest
from test_cycle_sync import load
from tiny_pairs import plain_greedy

from engine import DFlashConfig
from engine.config import GPU_STREAM_EVERY, add_engine_args, config_from_args
from engine.errors import ConfigError
from engine.plan import make_plan


def counting_async_eval(monkeypatch) -> list[int]:
    """Count mx.async_eval calls (every one still queues its arrays)."""
    calls = [0]
    original = mx.async_eval

    def counted(*arrays):
        calls[0] += 1
        return original(*arrays)

    monkeypatch.setattr(mx, "async_eval", counted)
    return calls


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@pytest.mark.parametrize("every", [1, 3])
def test_a_streamed_forward_queues_every_n_layers_and_computes_the_same(
        tiny_pairs, monkeypatch, family, every):
    rt = load(tiny_pairs, family)
    target, taps = rt.target, rt.draft.args.target_layer_ids
    prompt, block = mx.array([rt.encode("Hello world")]), mx.array([[5, 9, 2, 7, 11, 3]])
    outputs = {}
    for launch in (0, every):
        target.launch_every = launch
        cache = target.make_cache()
        calls = counting_async_eval(monkeypatch)
        target.forward(prompt, cache, taps)
        target.begin_verify(cache)
        logits, feats = target.forward(block, cache, taps)
        target.rollback(cache, keep=2, verified=block.shape[1])
        mx.eval(logits, feats)
        # queued after layers N, 2N, ... but not after the last: the caller evaluates that
        assert calls[0] == 2 * ((target.num_layers - 1) // launch if launch else 0)
        outputs[launch] = (logits, feats, target.cache_length(cache))
        monkeypatch.undo()
    (plain_logits, plain_feats, plain_n), (logits, feats, n) = outputs.values()
    assert mx.array_equal(logits, plain_logits) and mx.array_equal(feats, plain_feats)
    assert n == plain_n


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_streamed_cycles_stay_greedy(tiny_pairs, family):
    rt = load(tiny_pairs, family, stream_verify=2)
    assert rt.describe()["stream_verify"] == 2 and rt.target.launch_every == 2
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 40)
    out = rt.generate(ids, max_tokens=40, no_eos=True)
    assert out.tokens == want and out.cycles > 1


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_the_gpu_defaults_together_stay_greedy(tiny_pairs, family):
    """What 'auto' turns on for CUDA (whole blocks, the draft prefetched, forwards streamed),
    run here on the CPU: still plain greedy decoding."""
    rt = load(tiny_pairs, family, prefetch_draft=True, stream_verify=GPU_STREAM_EVERY)
    assert rt.describe()["prefetch_draft"] and rt.target.launch_every == GPU_STREAM_EVERY
    ids = rt.encode("Once upon a time")
    out = rt.generate(ids, max_tokens=48, no_eos=True)
    assert out.tokens == plain_greedy(rt.model, ids, 48) and out.cycles > 1


def test_stream_verify_is_an_option_checked_once(tiny_pairs):
    assert DFlashConfig().stream_verify == "auto"
    assert make_plan(DFlashConfig(), "cpu").stream_every == 0  # off
    assert make_plan(DFlashConfig(), "cuda").stream_every == GPU_STREAM_EVERY
    assert make_plan(DFlashConfig(), "metal").stream_every == 0  # not measured on a Mac yet
    assert make_plan(DFlashConfig(stream_verify=None), "cuda").stream_every == 0
    assert make_plan(DFlashConfig(stream_verify=3), "cpu").stream_every == 3
    assert make_plan(DFlashConfig(stream_verify=3), "cpu", sharded=True).stream_every == 0
    assert load(tiny_pairs, "llama").describe()["stream_verify"] is None
    for bad in (0, -2, True, "4", 1.5):
        with pytest.raises(ConfigError, match="stream_verify"):
            DFlashConfig(stream_verify=bad)


def test_the_stream_verify_flag(capsys):
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert config_from_args(parser.parse_args(["--stream-verify", "6"])).stream_verify == 6
    assert config_from_args(parser.parse_args(["--stream-verify", "off"])).stream_verify is None
    assert config_from_args(parser.parse_args([])).stream_verify == "auto"
    assert config_from_args(parser.parse_args(["--stream-verify", "auto"])).stream_verify == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--stream-verify", "0"])
    assert "layer count of at least 1" in capsys.readouterr().err
