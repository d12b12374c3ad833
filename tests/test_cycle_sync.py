"""A speculative cycle reads the device once: the accepted count and the committed tokens
come back together (issue 13). The probe counts every way an MLX array reaches the host."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import pytest
from tiny_pairs import plain_greedy

from engine import DFlashConfig, DFlashRuntime
from engine.cycle import DraftProposer, speculative_decode
from engine.events import Span
from engine.plan import Plan, make_plan

# Every host read of an array: an explicit eval, or a conversion that evaluates first.
READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__", "__array__")


@contextmanager
def host_reads() -> Iterator[list[int]]:
    """Counts host reads while active (counter[0])."""
    counter = [0]
    saved = [(mx.array, n, getattr(mx.array, n)) for n in READS if hasattr(mx.array, n)]
    saved.append((mx, "eval", mx.eval))

    def counted(original):
        def wrapper(*args, **kwargs):
            counter[0] += 1
            return original(*args, **kwargs)
        return wrapper

    for owner, name, original in saved:
        setattr(owner, name, counted(original))
    try:
        yield counter
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def test_the_probe_counts_reads():
    x = mx.array([1, 2, 3])
    with host_reads() as reads:
        x.tolist()
        int(x[0])
        mx.eval(x + 1)
        mx.async_eval(x + 2)  # queued, not waited on: not a read
    assert reads[0] == 3
    assert mx.array.tolist is not None and x.tolist() == [1, 2, 3]  # restored


def load(tiny_pairs, family, **config):
    config.setdefault("min_draft_confidence", None)
    target, draft = tiny_pairs(family)
    return DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                         config=DFlashConfig(**config))


def reads_per_cycle(commits) -> tuple[list[int], list[int]]:
    """-> (host reads during each cycle, all committed tokens); the prefill is not a cycle."""
    tokens = list(next(commits).tokens)
    per_cycle = []
    with host_reads() as reads:
        while True:
            before = reads[0]
            commit = next(commits, None)
            if commit is None:
                break
            per_cycle.append(reads[0] - before)
            tokens += commit.tokens
    return per_cycle, tokens


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_whole_block_cycle_reads_the_device_once(tiny_pairs, family):
    rt = load(tiny_pairs, family)
    ids = rt.encode("Hello world")
    want = plain_greedy(rt.model, ids, 60)
    proposer = DraftProposer(rt.target, rt.draft)
    per_cycle, tokens = reads_per_cycle(speculative_decode(rt.target, proposer, ids, 60, 16,
                                                           512))
    assert len(per_cycle) > 3 and set(per_cycle) == {1}
    assert tokens == want  # still plain greedy decoding, bit for bit


@pytest.mark.parametrize("odds", [0.0, 1e9])
def test_a_short_match_choice_stays_on_the_device(tiny_pairs, odds, monkeypatch):
    """The draft's choice between its drafts and a repeat (every short match here) comes back
    with the commit: still one read per cycle, whichever it takes."""
    import engine.cycle
    from engine.lookup import SuffixLookup

    monkeypatch.setattr(engine.cycle, "REPEAT_ODDS", odds)
    rt = load(tiny_pairs, "llama")
    ids = rt.encode("one two one two one two")
    lookup = SuffixLookup(min_match=99)
    lookup.extend(ids)
    proposer = DraftProposer(rt.target, rt.draft)
    proposer.lookup = lookup
    commits = list(speculative_decode(rt.target, proposer, ids, 60, 16, 512))
    looked_up = [c.cycle.looked_up for c in commits if c.cycle is not None]
    assert any(looked_up) == (odds == 0.0)
    lookup = SuffixLookup(min_match=99)
    lookup.extend(ids)
    proposer = DraftProposer(rt.target, rt.draft)
    proposer.lookup = lookup
    per_cycle, _ = reads_per_cycle(speculative_decode(rt.target, proposer, ids, 60, 16, 512))
    assert len(per_cycle) > 3 and set(per_cycle) == {1}


def test_the_verify_cut_adds_one_read_between_draft_and_verify(tiny_pairs):
    rt = load(tiny_pairs, "llama")
    ids = rt.encode("Hello world")
    proposer = DraftProposer(rt.target, rt.draft, plan=Plan(min_confidence=0.5))
    per_cycle, _ = reads_per_cycle(speculative_decode(rt.target, proposer, ids, 40, 16, 512))
    # The last cycle may have room for one token only: nothing to draft, nothing to cut.
    assert len(per_cycle) > 3 and set(per_cycle[:-1]) == {2} and per_cycle[-1] in (1, 2)


def test_the_runtime_stream_reads_once_per_cycle(tiny_pairs):
    rt = load(tiny_pairs, "qwen3")
    stream = rt.stream_generate("Hello", max_tokens=40, no_eos=True)
    first = next(stream)
    assert isinstance(first, Span) and first.cycle is None  # the prefill's token
    counts = []
    with host_reads() as reads:
        before = reads[0]
        for event in stream:
            if isinstance(event, Span) and event.cycle is not None:
                counts.append(reads[0] - before)
            before = reads[0]
    assert counts and set(counts) == {1}


def test_auto_cut_is_cpu_only():
    assert make_plan(DFlashConfig(), "cpu").min_confidence == 0.4
    assert make_plan(DFlashConfig(), "cuda").min_confidence is None
    assert make_plan(DFlashConfig(), "metal").min_confidence is None
    assert make_plan(DFlashConfig(min_draft_confidence=0.7), "cuda").min_confidence == 0.7


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_compiled_layer_halves_are_exact(tiny_pairs, family):
    """On a GPU a verify forward runs each layer's residual + MLP half compiled (fewer host
    calls per cycle): its logits and taps equal the model's own layers bit for bit, here even
    with the CPU's norm fallback fused into it."""
    rt = load(tiny_pairs, family)
    target, taps_ids = rt.target, rt.draft.args.target_layer_ids
    assert target._halves is None  # on a CPU: bound by arithmetic, not by the host
    assert target.compile_halves(True)
    prompt, ids = mx.array([list(range(3, 40))]), mx.array([[5, 9, 2, 7, 11, 4, 8, 6]])
    outs = []
    for halves in (target._halves, None):
        target._halves = halves
        cache = target.make_cache()
        target.forward(prompt, cache, [], last_only=True)
        target.begin_verify(cache)
        outs.append(target.forward(ids, cache, taps_ids))
        mx.eval(outs[-1])
        target.rollback(cache, keep=8, verified=8)
    (logits, taps), (ref_logits, ref_taps) = outs
    assert mx.array_equal(logits, ref_logits).item() and mx.array_equal(taps, ref_taps).item()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_compiled_halves_trace_once_for_every_verify_length(tiny_pairs, family, monkeypatch):
    """warm_up traces the compiled halves with a full block; a shorter verify at the end of a
    reply replays that trace (no new trace, no new GPU kernels mid-reply) and stays exact."""
    rt = load(tiny_pairs, family)
    target, taps_ids = rt.target, rt.draft.args.target_layer_ids
    traces = []
    compile_ = mx.compile

    def counting_compile(fun, **kwargs):  # the wrapped function runs only while tracing
        return compile_(lambda *a: (traces.append(a[0].shape), fun(*a))[1], **kwargs)

    monkeypatch.setattr(mx, "compile", counting_compile)
    assert target.compile_halves(True)
    monkeypatch.undo()
    target.warm_up(16)
    assert [t[1] for t in traces] == [16] * len(target.layers)  # once per layer, at load
    prompt = mx.array([list(range(3, 40))])
    for size in (16, 5, 1):
        ids = mx.array([[5, 9, 2, 7, 11, 4, 8, 6, 3, 12, 13, 14, 15, 16, 17, 18][:size]])
        outs = []
        for halves in (target._halves, None):
            compiled, target._halves = target._halves, halves
            cache = target.make_cache()
            target.forward(prompt, cache, [], last_only=True)
            target.begin_verify(cache)
            outs.append(target.forward(ids, cache, taps_ids))
            mx.eval(outs[-1])
            target.rollback(cache, keep=size, verified=size)
            target._halves = compiled if halves is None else halves
        (logits, taps), (ref_logits, ref_taps) = outs
        assert mx.array_equal(logits, ref_logits).item()
        assert mx.array_equal(taps, ref_taps).item()
    assert len(traces) == len(target.layers)  # lengths 5 and 1 replayed the trace
