"""Pausing speculation (engine/pause.py): the pacer's decisions on a fake clock, and the decode
loop paused and resumed on the tiny pairs with the same tokens as plain decoding.

No test here times anything: the pacer's clock is a counter that the tests advance by a cost
model (a target forward costs 1, a draft forward DRAFT_COST), so every decision is the same
on every machine."""

from __future__ import annotations

import functools

import mlx.core as mx
import pytest
from tiny_pairs import TruthOracle, cache_states, plain_greedy

import engine.runtime
from engine import DFlashConfig, DFlashRuntime
from engine.cycle import DraftProposer, prefill, speculative_decode
from engine.pause import (
    CALIBRATE,
    FIRST_BACKOFF,
    MAX_BACKOFF,
    PAUSE_BELOW,
    PROBE,
    REASON,
    RESUME_FROM,
    WINDOW,
    Pacer,
)
from engine.plain import plain_stretch

DRAFT_COST = 0.5  # a draft forward, in target forwards (a GPU-like cost model)


class Clock:
    """A pacer's clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def charging(self, fn, cost: float):
        """`fn`, advancing the clock by `cost` on each call."""

        def charged(*args, **kwargs):
            self.now += cost
            return fn(*args, **kwargs)

        return charged


def run(pacer: Pacer, clock: Clock, cycles) -> list[bool]:
    """Feed (cost, tokens) per cycle; a paused cycle is a plain step (cost 1, 1 token) whatever
    is given. -> whether each cycle ran paused."""
    paused = []
    for cost, tokens in cycles:
        paused.append(pacer.paused)
        pacer.begin()
        clock.now += 1.0 if pacer.paused else cost
        pacer.end(1 if pacer.paused else tokens, plain=pacer.paused)
    return paused


def test_a_draft_that_never_pays_pauses_with_a_doubling_back_off():
    clock = Clock()
    pacer = Pacer(step_s=1.0, clock=clock)
    paused = run(pacer, clock, [(1.5, 1)] * 2000)  # 1 token a cycle at 1.5 steps: 0.67x
    runs, n = [], 0  # lengths of the paused stretches
    for was, now in zip([False] + paused, paused + [False]):
        n = n + 1 if now else n
        if was and not now:
            runs.append(n)
            n = 0
    assert paused[:WINDOW] == [False] * WINDOW and paused[WINDOW]  # a full window, then pause
    # the first verdict had only the load-time prior: CALIBRATE steps timed, then a probe
    want = [CALIBRATE] + [min(FIRST_BACKOFF * 2 ** i, MAX_BACKOFF) for i in range(len(runs))]
    assert runs[:-1] == want[:len(runs) - 1] and len(runs) > 6  # 4, 16, 32, ... 128, 128
    assert paused[WINDOW + CALIBRATE: WINDOW + CALIBRATE + PROBE] == [False] * PROBE
    assert pacer.pauses == len(runs) and pacer.paused_tokens == sum(paused)
    assert pacer.reason.startswith(REASON) and "1.00 tokens/cycle at 1.50 plain steps" in \
        pacer.reason


def test_a_probe_that_pays_resumes_and_the_back_off_starts_over():
    clock = Clock()
    pacer = Pacer(step_s=1.0, clock=clock)
    bad, good = [(1.5, 1)], [(1.5, 4)]
    # time steps (4), fail a probe, pause (16), fail a probe (32), then the draft agrees
    paused = run(pacer, clock, bad * (WINDOW + CALIBRATE + PROBE + FIRST_BACKOFF + PROBE)
                 + good * 80)
    assert not any(paused[-40:]) and pacer.pauses == 3 and pacer.probes == 3
    assert pacer.backoff == FIRST_BACKOFF  # reset by the paying probe
    paused = run(pacer, clock, bad * WINDOW)  # bad again: a short pause, not a long one
    # 7 of 8 cycles bad is 1.375 tokens at 1.5 steps, 0.92x: not yet below PAUSE_BELOW;
    # the 8th pauses, on steps timed over STALE cycles ago: CALIBRATE steps first
    assert paused == [False] * WINDOW and pacer.paused and pacer.left == CALIBRATE
    run(pacer, clock, bad * (CALIBRATE + PROBE))  # timed, a failed probe: a first back-off
    assert pacer.paused and pacer.left == FIRST_BACKOFF


def test_near_break_even_it_neither_pauses_nor_resumes():
    """Between PAUSE_BELOW and RESUME_FROM either choice is about as fast: a speculating
    reply keeps speculating, a paused one stays paused."""
    assert PAUSE_BELOW < 0.95 < RESUME_FROM
    clock = Clock()
    pacer = Pacer(step_s=1.0, clock=clock)
    assert not any(run(pacer, clock, [(2.0, 1.9)] * 100))  # 0.95x
    pacer = Pacer(step_s=1.0, clock=clock)
    paused = run(pacer, clock, [(2.0, 1)] * WINDOW + [(2.0, 1.9)] * 400)  # 0.5x, then 0.95x
    assert pacer.pauses > 3 and pacer.backoff == MAX_BACKOFF and sum(paused) > 300


def test_a_paying_draft_never_pauses_and_one_stall_does_not_pause_it():
    clock = Clock()
    pacer = Pacer(step_s=1.0, clock=clock)
    cycles = [(1.2, 3)] * 7 + [(40.0, 3)] + [(1.2, 3)] * 100  # one cycle stalls 33x
    assert not any(run(pacer, clock, cycles))
    assert pacer.pauses == 0 and pacer.reason is None
    assert pacer.speedup() == pytest.approx(3 / 1.2)


def test_without_a_plain_step_cost_or_when_off_it_never_pauses():
    for pacer in (Pacer(step_s=None, clock=Clock()), Pacer(step_s=1.0, enabled=False,
                                                          clock=Clock())):
        assert not any(run(pacer, pacer.clock, [(9.0, 1)] * 200))


def test_timed_plain_steps_replace_the_prior():
    """A prior that undervalues a plain step pauses a draft that pays; the first probe,
    judged with the steps timed while paused, resumes it for good."""
    clock = Clock()
    pacer = Pacer(step_s=0.5, clock=clock)  # the truth: a step costs 1 (run's plain steps)
    paused = run(pacer, clock, [(1.2, 1.5)] * 200)  # 1.25x in truth, 0.62x by the prior
    assert paused[WINDOW] and pacer.pauses == 1 and not any(paused[WINDOW + CALIBRATE:])
    assert pacer.step_s() == 1.0


# -- the decode loop on the tiny pairs ---------------------------------------------------------
class Switching(TruthOracle):
    """Proposes the target's continuation wrong at its first slot until `position` reaches
    `right_from`, then right; a draft forward costs DRAFT_COST on `clock`. Uses the runtime's
    draft cache, so the runtime keeps its state after the reply."""

    def __init__(self, rt, truth, right_from, clock, cache):
        DraftProposer.__init__(self, rt.target, rt.draft, None, rt.plan, cache)
        self.truth, self.right_from, self.clock = truth, right_from, clock

    def propose(self, staged, size, position):
        if size > 1:
            self.clock.now += DRAFT_COST
        self.error_at = None if position >= self.right_from else 0
        return super().propose(staged, size, position)


@pytest.fixture
def paced(tiny_pairs, monkeypatch):
    """-> (runtime on the tiny llama pair with whole blocks and no lookup, whose pacer runs on
    a Clock that target forwards advance by 1, the clock, a proposer factory
    `use(truth, right_from)`, the proposers made)."""
    target, draft = tiny_pairs("llama")
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft), config=DFlashConfig(
        min_draft_confidence=None, lookup_min_match=None))
    clock = Clock()
    rt.step_s = 1.0  # the prior: a plain step costs one target forward
    rt.target.forward = clock.charging(rt.target.forward, 1.0)
    monkeypatch.setattr(engine.runtime, "Pacer", functools.partial(Pacer, clock=clock))
    made = []

    def use(truth, right_from):
        def make(head, cache, context):
            made.append(Switching(rt, truth, right_from, clock, cache))
            return made[-1]

        rt.make_proposer = make

    return rt, clock, use, made


@pytest.mark.parametrize("agrees_after", [60, None])
def test_a_draft_that_never_agrees_pauses_with_plain_output_and_resumes_when_it_does(
        paced, agrees_after):
    rt, clock, use, made = paced
    ids = rt.encode("The quick brown fox jumps over the lazy dog.")
    n = 150 if agrees_after is not None else 120  # the latter ends in the third pause
    want = plain_greedy(rt.model, ids, n)
    truth = ids + want
    use(truth, len(ids) + agrees_after if agrees_after is not None else 10 ** 9)
    spans = list(rt.stream_generate(ids, max_tokens=n, no_eos=True))
    result = spans[-1].result
    assert result.tokens == want  # paused or not, plain greedy's tokens
    cycles = [s.cycle for s in spans[:-1] if s.cycle is not None]
    assert not any(c.paused for c in cycles[:WINDOW]) and cycles[WINDOW].paused
    assert all(c.block_size == 1 for c in cycles if c.paused)  # the target alone
    assert result.pauses >= 3 and result.paused_tokens >= CALIBRATE + FIRST_BACKOFF * 3
    assert result.pause_reason.startswith(REASON)
    assert any(s.stats.paused for s in spans[:-1])
    if agrees_after is not None:  # the third probe finds the draft right: resumed for good
        assert result.pauses == 3
        tail = [c for c in cycles if c.index > cycles[-1].index - 5]
        assert not any(c.paused for c in tail) and min(c.committed for c in tail[:-1]) > 1
    else:
        assert cycles[-1].paused  # it ended paused: the deferred context was flushed
    # The draft's context holds every fed token's features, as a plain prefill leaves it
    fed = ids + result.tokens[:-1]
    ref = DraftProposer(rt.target, rt.draft)
    prefill(rt.target, rt.target.make_cache(), fed, 512, ref)
    for got, want_c in zip(made[-1].cache, ref.cache, strict=True):
        assert got.offset == want_c.offset == len(fed)
        for a, b in zip(got.keys_and_values(), want_c.keys_and_values(), strict=True):
            assert mx.allclose(a, b, atol=1e-4, rtol=1e-4).item()


def test_paused_sampling_repeats_a_seed_when_the_pauses_repeat(paced, monkeypatch):
    """Sampled at a low temperature, the tiny pair's random draft rarely agrees: the reply
    pauses, and with the same timings (the fake clock) the same seed gives the same tokens."""
    rt, clock, _, _ = paced
    monkeypatch.setattr(DraftProposer, "block_logits",
                        clock.charging(DraftProposer.block_logits, DRAFT_COST))
    ids = rt.encode("What is 12 times 7?")
    first = rt.generate(ids, 60, no_eos=True, temperature=0.1, seed=3)
    again = rt.generate(ids, 60, no_eos=True, temperature=0.1, seed=3)
    assert first.pauses >= 1 and first.paused_tokens > 0
    assert first.tokens == again.tokens and len(first.tokens) == 60


def test_the_config_and_the_flag_turn_pausing_off(tiny_pairs, monkeypatch, capsys):
    import argparse

    from engine.config import add_engine_args, config_from_args
    from engine.errors import ConfigError

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert config_from_args(p.parse_args([])).pause_speculation is True
    assert config_from_args(p.parse_args(["--pause", "off"])).pause_speculation is False
    with pytest.raises(ConfigError, match="pause_speculation"):
        DFlashConfig(pause_speculation="yes")
    monkeypatch.setattr(engine.runtime, "plain_step_s", lambda *a, **k: 1.0)
    target, draft = tiny_pairs("llama")
    on = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft))
    off = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                        config=DFlashConfig(pause_speculation=False))
    assert on.step_s == 1.0 and off.step_s is None  # None: the pacer is off


def test_metrics_count_pauses_and_paused_tokens():
    from types import SimpleNamespace

    from engine.server_metrics import Metrics

    metrics = Metrics()
    stats = SimpleNamespace(total_tokens=100, prompt_tokens=10, cached_tokens=0, cycles=60,
                            speculative=True, acceptance_rate=0.4, tokens_per_cycle=1.65,
                            ttft_s=0.1, tokens_per_second=20.0, pauses=2, paused_tokens=48)
    metrics.request("chat", 200, stats)
    metrics.request("chat", 200, stats)
    text = metrics.render()
    assert "dflash_pauses_total 4.0" in text and "dflash_paused_tokens_total 96.0" in text


def test_verify_timings_keep_the_plain_step_current():
    """With the machine's verify costs by length (the CPU's, engine/verify_lengths.py), each
    cycle's verify time gives the plain step's cost at that moment: a prior from a quieter
    moment (here 10x too low) neither pauses a paying draft nor needs steps timed first."""
    clock = Clock()
    costs = [1.0, 1.2, 1.3, 1.5]  # a 1..4-token verify, relative
    pacer = Pacer(step_s=0.1, clock=clock, verify_costs=costs)

    def cycle(tokens):  # a 4-token verify costing 1.5 steps of 1.0, the cycle 2.0
        pacer.begin()
        clock.now += 1.0 if pacer.paused else 2.0
        pacer.end(1 if pacer.paused else tokens, pacer.paused, 1 if pacer.paused else 4,
                  1.0 if pacer.paused else 1.5)

    for _ in range(50):
        cycle(3)  # 1.5x
    assert pacer.pauses == 0 and pacer.step_s() == pytest.approx(1.0)
    while not pacer.paused:
        cycle(1)  # 0.5x: a full back-off at once, the step's cost being current
    assert pacer.left == FIRST_BACKOFF and pacer.pauses == 1


def drain(stretch):
    """-> (the Commits a plain_stretch yields, its Stretch)."""
    commits = []
    while True:
        try:
            commits.append(next(stretch))
        except StopIteration as end:
            return commits, end.value


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_paused_stretch_is_plain_decoding_and_discards_the_step_queued_past_a_stop(
        tiny_pairs, family):
    """The target alone with each step queued before the last is read: plain greedy's tokens;
    at a stop token the step already queued on it is rolled back, so the caches end just
    before the stop, as a prefill of what was fed leaves them."""
    target, draft = tiny_pairs(family)
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft), config=DFlashConfig(
        lookup_min_match=None))
    ids = rt.encode("The quick brown fox jumps over the lazy dog.")
    want = plain_greedy(rt.model, ids, 14)
    stop_at = next(i for i in range(2, 13) if want[i] not in want[1:i])
    for stop_ids, count in (((), 12), ({want[stop_at]}, 12)):
        cache = rt.target.make_cache()
        proposer = DraftProposer(rt.target, rt.draft)
        prefill(rt.target, cache, ids, 512, proposer)
        pacer = Pacer(step_s=1.0)
        pacer.left = count  # paused for `count` tokens
        commits, run = drain(plain_stretch(rt.target, proposer, pacer, cache, want[0], 100,
                                           16, None, stop_ids, 7))
        tokens = [c.tokens[0] for c in commits]
        n = stop_at if stop_ids else count
        assert tokens == want[1:n + 1] and run.tokens == n and run.last == tokens[-1]
        assert run.stopped == bool(stop_ids) and pacer.paused_tokens == n
        assert [c.cycle.index for c in commits] == list(range(7, 7 + n))
        assert all(c.cycle.paused and c.cycle.block_size == 1 for c in commits)
        assert len(pacer.deferred) == n  # each fed token's features, for the draft
        ref = rt.target.make_cache()
        prefill(rt.target, ref, ids + want[:n], 512)
        for got, expect in zip(cache_states(cache), cache_states(ref), strict=True):
            assert got.shape == expect.shape and mx.allclose(got, expect, atol=1e-4).item()


def test_a_long_lookup_match_ends_a_paused_stretch_and_the_reply_stays_plain(tiny_pairs):
    """A target whose replies repeat, a draft that never agrees: the reply pauses, and paused
    stretches end where the suffix lookup finds a long match (the loop verifies its repeat),
    the step queued ahead rolled back: plain greedy's tokens, and the caches as a prefill of
    what was fed leaves them."""
    from tiny_pairs import REPEATING

    target, draft = tiny_pairs("llama", REPEATING)
    rt = DFlashRuntime.from_pretrained(model=str(target), draft=str(draft), config=DFlashConfig(
        min_draft_confidence=None, lookup_min_match=3))
    clock = Clock()
    rt.target.forward = clock.charging(rt.target.forward, 1.0)
    ids = rt.encode("The quick brown fox jumps over the lazy dog.")
    n = 200
    want = plain_greedy(rt.model, ids, n)
    proposer = Switching(rt, ids + want, 10 ** 9, clock, [])
    cache = rt.target.make_cache()
    commits = list(speculative_decode(rt.target, proposer, ids, n, 16, 512, cache=cache,
                                      pacer=Pacer(1.0, clock=clock)))
    assert [t for c in commits for t in c.tokens] == want
    cycles = [c.cycle for c in commits if c.cycle is not None]
    after_plain = [b for a, b in zip(cycles, cycles[1:], strict=False)
                   if a.paused and a.block_size == 1 and b.paused and b.block_size > 1]
    assert after_plain and all(c.looked_up for c in after_plain)
    ref = rt.target.make_cache()
    prefill(rt.target, ref, ids + want[:-1], 512)
    for got, expect in zip(cache_states(cache), cache_states(ref), strict=True):
        assert got.shape == expect.shape and mx.allclose(got, expect, atol=1e-4).item()
