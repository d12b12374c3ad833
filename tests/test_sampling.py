"""Sampling at temperature > 0: speculative sampling keeps the target's distribution.

The statistical test runs the engine's own speculative loop (`speculative_decode` with a
`Sampler`: draft draws, acceptance, residual and bonus draws, verify cut, token subset) on a
small-vocabulary Markov target and a deliberately different Markov draft, whose exact
distributions are known, so 20,000 replies cost only the loop's own overhead. The same test,
run with a wrong acceptance rule on a quarter of the samples, must reject it: it has power.
DFlash2 drafts propose their candidate selector's path, drawn slot after slot: the same test
runs at T = 0.8 on a real random DFlash2 draft's block outputs and selector, and rejects a q
that ignores the selector's edges."""

from __future__ import annotations

import dataclasses
import itertools
import types

import mlx.core as mx
import numpy as np
import pytest
from scipy import stats

from engine.cycle import DraftProposer, draw_proposal, speculative_decode
from engine.draft_head import DraftHead
from engine.errors import ConfigError
from engine.lookup import SuffixLookup
from engine.plan import Plan
from engine.sampling import Sampler, SamplingParams
from engine.targets.base import TargetAdapter

V = 6
TOKENS = 4  # tokens 1..4 of each reply: the prefill's draw, then the cycles'
SAMPLES = 20_000
WRONG_SAMPLES = 5_000  # fewer than SAMPLES: the wrong rule must fail even with these
PARAMS = SamplingParams(temperature=0.9, top_k=5)  # a filter on both p and q


class Length:
    """The cache of a table target: only how many tokens it holds."""

    def __init__(self) -> None:
        self.offset = 0
        self.state: list = []

    def trim(self, n: int) -> None:
        self.offset -= n


class MarkovTarget(TargetAdapter):
    """A target whose next-token logits depend on the last token only: table[token]."""

    def __init__(self, table: np.ndarray) -> None:  # no mlx-lm model behind it
        self.table = mx.array(table, dtype=mx.float32)

    @property
    def vocab_size(self) -> int:
        return V

    def make_cache(self) -> list:
        return [Length()]

    def forward(self, tokens, cache, tap_ids, last_only=False):
        cache[0].offset += tokens.shape[1]
        logits = self.table[tokens]
        return (logits[:, -1:] if last_only else logits), mx.zeros((1, tokens.shape[1], 0))

    def begin_verify(self, cache) -> None:
        pass

    def rollback(self, cache, keep, verified) -> None:
        cache[0].trim(verified - keep)


class MarkovDraft(DraftProposer):
    """Proposes a block in parallel, like DFlash: slot i's logits depend on the staged token
    and i only; over a token subset (q is zero outside it), with the verify cut on."""

    def __init__(self, table: np.ndarray, ids: list[int], min_confidence: float | None,
                 verify_lengths: tuple[int, ...] = ()):
        self.table = mx.array(table, dtype=mx.float32)  # [V, B - 1, len(ids)]
        self.ids = mx.array(ids, dtype=mx.int32)
        self.head = DraftHead(None, self.ids)  # the subset's token ids (no weights needed)
        self.plan = Plan(min_confidence=min_confidence, verify_lengths=verify_lengths)
        self.cache: list = []

    @property
    def tap_ids(self):
        return []

    def append_context(self, taps) -> None:
        pass

    def draft_logits(self, staged, size):
        return self.table[staged, : size - 1][None]

    def draft_proposal_sampled(self, staged, size, sampler):
        logits = self.draft_logits(staged, size)
        return draw_proposal(staged, logits, self.ids, V, sampler, self.plan.min_confidence,
                             self.plan.verify_lengths)


def tables(seed: int = 0):
    rng = np.random.default_rng(seed)
    target = rng.normal(0, 1.5, (V, V))
    draft = rng.normal(0, 1.5, (V, 3, V - 1))  # blocks of 4: 3 drafts, 5 of 6 tokens
    return target, draft


def exact_distribution(target: np.ndarray, first: int, params: SamplingParams = PARAMS
                       ) -> dict[tuple, float]:
    """P(tokens 1..4) when the target alone samples with `params`, after token `first`."""
    p = np.array(Sampler(params).probs(mx.array(target, dtype=mx.float32)))
    out = {}
    for seq in itertools.product(range(V), repeat=TOKENS):
        prob, last = 1.0, first
        for t in seq:
            prob *= p[last, t]
            last = t
        if prob > 0:
            out[seq] = prob
    return out


def sample_replies(target, draft, n: int, seed: int, fresh_lookup=None, block: int = 4,
                   params: SamplingParams = PARAMS
                   ) -> tuple[list[tuple], int]:
    """-> (replies, cycles the lookup proposed); `fresh_lookup()`: the draft's suffix lookup
    for each reply (None: no lookup)."""
    replies, looked_up = [], 0
    for i in range(n):
        sampler = Sampler(SamplingParams(params.temperature, params.top_p, params.top_k,
                                         params.min_p, seed=seed + i))
        if fresh_lookup is not None:
            draft.lookup = fresh_lookup()
        tokens: list[int] = []
        for commit in speculative_decode(target, draft, [2], TOKENS, block, 512,
                                         sampler=sampler):
            tokens += commit.tokens
            looked_up += commit.cycle is not None and commit.cycle.looked_up
        replies.append(tuple(tokens[:TOKENS]))
    return replies, looked_up


def chi_square_pvalue(replies: list[tuple], expected: dict[tuple, float]) -> float:
    """Goodness of fit of the replies to the exact distribution; cells with an expected count
    under 5 are pooled into one."""
    n = len(replies)
    total = sum(expected.values())  # 1 up to float32 round-off
    expected = {s: p / total for s, p in expected.items()}
    counts: dict[tuple, int] = {}
    for r in replies:
        counts[r] = counts.get(r, 0) + 1
    assert set(counts) <= set(expected), "a reply the target can never produce"
    big = [s for s, p in expected.items() if p * n >= 5]
    obs = [counts.get(s, 0) for s in big]
    exp = [expected[s] * n for s in big]
    obs.append(n - sum(obs))
    exp.append(max(n - sum(exp), 0.0))
    return float(stats.chisquare(obs, exp, sum_check=False).pvalue)


@pytest.fixture(scope="module")
def setup():
    target_table, draft_table = tables()
    return (MarkovTarget(target_table), exact_distribution(target_table, first=2),
            draft_table)


def test_speculative_sampling_keeps_the_target_distribution(setup):
    target, expected, draft_table = setup
    draft = MarkovDraft(draft_table, ids=list(range(1, V)), min_confidence=0.3)
    replies, _ = sample_replies(target, draft, SAMPLES, seed=0)
    assert chi_square_pvalue(replies, expected) > 1e-3


class PrefetchingMarkovDraft(MarkovDraft):
    """`MarkovDraft` whose next block the cycle queues before its sync (DraftProposer.prefetch,
    staged on the sampled token still on the device), whole blocks."""

    draft_logits = DraftProposer.draft_logits

    def __init__(self, table: np.ndarray, ids: list[int]) -> None:
        super().__init__(table, ids, min_confidence=None)
        self.plan = Plan(prefetch=True)
        self.draft = types.SimpleNamespace(args=types.SimpleNamespace(mask_token_id=0))
        self.queued = 0

    def block_logits(self, block, unsettled=0, kept=None):
        self.queued += unsettled > 0
        return self.table[block[0, 0]][None, : block.shape[1] - 1]


def test_prefetched_proposals_keep_the_target_distribution(setup):
    target, expected, draft_table = setup
    draft = PrefetchingMarkovDraft(draft_table, ids=list(range(1, V)))
    replies, _ = sample_replies(target, draft, SAMPLES // 2, seed=4)
    assert draft.queued > SAMPLES // 2  # most replies draft from a queued block
    assert chi_square_pvalue(replies, expected) > 1e-3


def test_padded_verifies_keep_the_target_distribution(setup):
    """A cut padded to a longer verify (engine/verify_lengths.py) samples the same."""
    target, expected, draft_table = setup
    draft = MarkovDraft(draft_table, ids=list(range(1, V)), min_confidence=0.9,
                        verify_lengths=(0, 1, 3, 3, 4))
    sizes, emitted = set(), 0
    for commit in speculative_decode(target, draft, [2], 40, 4, 512, sampler=Sampler(PARAMS)):
        if commit.cycle is not None and 40 - emitted >= 3:  # near the end: what is left
            sizes.add(commit.cycle.block_size)
        emitted += len(commit.tokens)
    assert 2 not in sizes and 3 in sizes  # a cut of 2 verifies 3
    replies, _ = sample_replies(target, draft, SAMPLES // 2, seed=0)
    assert chi_square_pvalue(replies, expected) > 1e-3


def test_looked_up_proposals_keep_the_target_distribution(setup):
    """A suffix lookup's proposal is certain (q one-hot): kept with the target's probability
    of it, else the residual draws without it. Half the cycles here are looked up."""
    target, expected, draft_table = setup
    draft = MarkovDraft(draft_table, ids=list(range(1, V)), min_confidence=0.3)
    draft.target = target  # a looked-up q spans the target's vocabulary

    def fresh_lookup():  # a context in which every token recurs: lookups on most cycles
        found = SuffixLookup(min_match=1)
        found.extend([4, 2, 1, 3, 2, 5, 5, 1, 0, 2])
        return found

    replies, looked_up = sample_replies(target, draft, SAMPLES // 2, seed=1,
                                        fresh_lookup=fresh_lookup)
    assert looked_up > SAMPLES // 4
    assert chi_square_pvalue(replies, expected) > 1e-3


def test_short_match_choices_keep_the_target_distribution(setup, monkeypatch):
    """Short matches leave the choice to the draft (`draw_or_repeat`): a cycle proposes the
    repeat (q one-hot) or the draft's draws (its q). Both happen here, and the replies keep
    the target's distribution."""
    import engine.cycle

    target, expected, draft_table = setup
    draft = MarkovDraft(draft_table, ids=list(range(1, V)), min_confidence=0.3)
    draft.target = target
    monkeypatch.setattr(engine.cycle, "REPEAT_ODDS", 0.5)

    def fresh_lookup():  # every match is short: the draft chooses each time
        found = SuffixLookup(min_match=99, short_match=1)
        found.extend([4, 2, 1, 3, 2, 5, 5, 1, 0, 2])
        return found

    choices = []
    choose = engine.cycle.draw_or_repeat

    def counted(*args, **kwargs):
        out = choose(*args, **kwargs)
        choices.append(bool(out[2]))
        return out

    monkeypatch.setattr(engine.cycle, "draw_or_repeat", counted)
    replies, _ = sample_replies(target, draft, SAMPLES // 2, seed=2, fresh_lookup=fresh_lookup)
    assert SAMPLES // 20 < sum(choices) < len(choices) - SAMPLES // 20  # both, often
    assert chi_square_pvalue(replies, expected) > 1e-3


class Alternating:
    """A pacer clock whose cycles cost 10 plain steps while speculating and 1 while paused:
    with a window, a probe and back-offs of one, a reply alternates one speculative cycle and
    one paused (target-alone) step, whatever the draws."""

    def __init__(self) -> None:
        self.now, self.pacer = 0.0, None

    def __call__(self) -> float:
        self.now += 1.0 if self.pacer.paused else 10.0
        return self.now


def paced_replies(target, draft, n: int, seed: int) -> tuple[list[tuple], int, int]:
    """`sample_replies` with a pacer that pauses mid-reply -> (replies, paused cycles,
    speculative cycles)."""
    from engine.pause import Pacer

    replies, paused, speculated = [], 0, 0
    for i in range(n):
        clock = Alternating()
        clock.pacer = pacer = Pacer(step_s=1.0, clock=clock, window=1, probe=1,
                                    first_backoff=1, max_backoff=1)
        tokens: list[int] = []
        for commit in speculative_decode(target, draft, [2], TOKENS, 4, 512,
                                         sampler=Sampler(dataclasses.replace(PARAMS,
                                                                             seed=seed + i)),
                                         pacer=pacer):
            tokens += commit.tokens
            if commit.cycle is not None:
                paused += commit.cycle.paused
                speculated += not commit.cycle.paused
        replies.append(tuple(tokens[:TOKENS]))
    return replies, paused, speculated


def test_paused_cycles_keep_the_target_distribution(setup):
    """Pausing speculation mid-reply (engine/pause.py): a paused cycle is a 1-token step of
    the target alone, and replies that mix them with speculative cycles keep the target's
    distribution."""
    target, expected, draft_table = setup
    draft = MarkovDraft(draft_table, ids=list(range(1, V)), min_confidence=0.3)
    replies, paused, speculated = paced_replies(target, draft, SAMPLES // 2, seed=3)
    assert paused > SAMPLES // 4 and speculated > SAMPLES // 4  # both, in most replies
    assert chi_square_pvalue(replies, expected) > 1e-3


def test_the_test_rejects_a_wrong_paused_step(setup, monkeypatch):
    """A paused step that took the target's argmax instead of drawing from p: the same test
    must reject it."""
    from engine.plain import PlainSteps

    target, expected, draft_table = setup
    monkeypatch.setattr(PlainSteps, "choose", lambda self, logits: mx.argmax(logits))
    draft = MarkovDraft(draft_table, ids=list(range(1, V)), min_confidence=0.3)
    replies, _, _ = paced_replies(target, draft, WRONG_SAMPLES, seed=3)
    assert chi_square_pvalue(replies, expected) < 1e-6


def test_the_test_rejects_a_wrong_acceptance_rule(setup, monkeypatch):
    """Drawing the token after a rejection from p instead of norm(max(0, p - q)): a common
    mistake that biases the output towards the draft's rejected tokens."""
    target, expected, draft_table = setup

    def wrong_accept(self, verify_in, p, q):
        n = q.shape[0]
        drafts = verify_in[0, 1:]
        px = mx.take_along_axis(p[:n], drafts[:, None], axis=-1)[:, 0]
        qx = mx.take_along_axis(q, drafts[:, None], axis=-1)[:, 0]
        u = mx.random.uniform(shape=(n,), key=self.next_key())
        a = mx.sum(mx.cumprod((u * qx < px).astype(mx.int32)))
        return a, self.draw(p[a])

    monkeypatch.setattr(Sampler, "accept", wrong_accept)
    draft = MarkovDraft(draft_table, ids=list(range(1, V)), min_confidence=0.3)
    replies, _ = sample_replies(target, draft, WRONG_SAMPLES, seed=0)
    assert chi_square_pvalue(replies, expected) < 1e-6


# -- DFlash2: the candidate selector's sequential draws ----------------------------------------
DFLASH2_PARAMS = SamplingParams(temperature=0.8, top_k=5)


class SelectorDraft(MarkovDraft):
    """A DFlash2 draft's proposer (`path_proposal`: its selector's path and the draws'
    distributions) over fixed block outputs: the hidden states [V, 3, H] and logits (the
    table) that a real random-weight DFlash2 draft gives its slots 1..3 after each staged
    token, over a token subset (5 of 6 tokens), with the verify cut on."""

    def __init__(self, target, selector, hidden, logits, ids: list[int],
                 min_confidence: float | None):
        super().__init__(np.array(logits), ids, min_confidence)
        self.target, self.selector, self.hidden = target, selector, hidden

    def path_outputs(self, staged, size):
        return self.hidden[staged, : size - 1], self.table[staged, : size - 1]


@pytest.fixture(scope="module")
def dflash2_setup():
    """A tiny 6-token llama target's adapter and a random DFlash2 draft for it (engine's own
    forward), whose outputs after a fixed context become the proposer's tables; the Markov
    target of `tables`, and its exact distribution at T = 0.8."""
    from mlx_lm.models import llama
    from tiny_pairs import SELECTOR_SCALE, TARGET_CONFIGS, _init_weights, tiny_dflash2_args

    from engine.cycle import prefill
    from engine.dflash2 import DFlash2Draft
    from engine.targets import adapter_for

    config = dict(TARGET_CONFIGS["llama"], vocab_size=V)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    _init_weights(model, 0)
    adapter = adapter_for(model)
    draft = DFlash2Draft(tiny_dflash2_args(config, V, V - 1, block_size=4, top_k=4, rank=8))
    _init_weights(draft, 1)
    for book in (draft.candidate_selector.predecessor_codebook,
                 draft.candidate_selector.successor_codebook):
        book.weight = book.weight * (SELECTOR_SCALE / 0.08)
    real = DraftProposer(adapter, draft)
    prefill(adapter, adapter.make_cache(), [1, 2, 3, 4, 0, 2, 5, 1], 8, real)
    outputs = [real.path_outputs(s, 4) for s in range(V)]
    ids = list(range(1, V))
    hidden = mx.stack([h for h, _ in outputs])
    logits = mx.stack([out for _, out in outputs])[..., mx.array(ids)]
    target_table, _ = tables()
    proposer = SelectorDraft(MarkovTarget(target_table), draft.candidate_selector, hidden,
                             logits, ids, min_confidence=0.3)
    return proposer, exact_distribution(target_table, 2, DFLASH2_PARAMS)


def marginal_q_walk(walk):
    """The selector's walk with a plausible mistake: each slot's q the processed softmax of
    its candidates' logits alone, as if the draws ignored the token drawn before them."""

    def wrong(self, hidden, logits, staged, head, sampler=None):
        path = walk(self, hidden, logits, staged, head, sampler)
        if sampler is not None:
            k = path.candidates.shape[1]
            index = mx.argpartition(logits, -k, axis=-1)[..., -k:]
            path.q = sampler.probs(mx.take_along_axis(logits, index, axis=-1))
        return path

    return wrong


def test_dflash2_paths_keep_the_target_distribution(dflash2_setup):
    """Speculative sampling against the selector's own q (each slot's draw given the one
    before it) keeps the target's distribution at T = 0.8. The same test catches a q that
    ignores the selector's edges (next test; on 3,000 replies p was 0.74 against 1e-173)."""
    proposer, expected = dflash2_setup
    replies, _ = sample_replies(proposer.target, proposer, SAMPLES // 4, seed=0,
                                params=DFLASH2_PARAMS)
    assert chi_square_pvalue(replies, expected) > 1e-3


def test_the_test_rejects_a_wrong_selector_q(dflash2_setup, monkeypatch):
    from engine.dflash2 import CandidateSelector

    monkeypatch.setattr(CandidateSelector, "walk", marginal_q_walk(CandidateSelector.walk))
    proposer, expected = dflash2_setup
    replies, _ = sample_replies(proposer.target, proposer, WRONG_SAMPLES // 2, seed=0,
                                params=DFLASH2_PARAMS)
    assert chi_square_pvalue(replies, expected) < 1e-6


def test_sampling_params_are_checked():
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-1),
                dict(top_k=2.5), dict(min_p=1.0), dict(seed="x")):
        with pytest.raises(ConfigError, match="Fix: use"):
            SamplingParams(**bad)
    assert SamplingParams().greedy and not SamplingParams(temperature=0.5).greedy


def test_filters_shape_the_distribution():
    logits = mx.array([[1.0, 2.0, 3.0, 4.0, 0.5]])
    top2 = np.array(Sampler(SamplingParams(temperature=1.0, top_k=2)).probs(logits))[0]
    assert (top2 > 0).tolist() == [False, False, True, True, False]
    assert top2.sum() == pytest.approx(1.0)
    nucleus = np.array(Sampler(SamplingParams(temperature=1.0, top_p=0.5)).probs(logits))[0]
    assert nucleus.tolist() == [0, 0, 0, 1, 0]  # the top token alone holds 64%
    minp = np.array(Sampler(SamplingParams(temperature=1.0, min_p=0.3)).probs(logits))[0]
    assert (minp > 0).tolist() == [False, False, True, True, False]  # e^-1 > 0.3 > e^-2
    hot = np.array(Sampler(SamplingParams(temperature=100.0)).probs(logits))[0]
    assert hot.max() - hot.min() < 0.01  # a high temperature flattens the distribution


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7),
                                    SamplingParams(temperature=0.7, top_p=0.9),
                                    SamplingParams(temperature=1.0, top_k=40, min_p=0.05)])
@pytest.mark.parametrize("kernels", ["auto", "off"])
def test_processed_distributions_at_vocabulary_size(params, kernels, monkeypatch):
    """At a real vocabulary's size (where a CPU's softmax runs through its vectorized kernel,
    or with the kernels off MLX's): the processed distribution against float64 numpy's, row
    by row."""
    monkeypatch.setenv("DFLASH_CPU_KERNELS", kernels)
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((4, 49152)) * 3).astype(np.float32)
    got = np.array(Sampler(params).probs(mx.array(logits)))
    x = logits.astype(np.float64) / params.temperature
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    keep = np.ones_like(p, dtype=bool)
    if params.top_k:
        keep &= x >= np.sort(x, axis=-1)[:, -params.top_k][:, None]
    if params.top_p < 1.0:
        order = np.argsort(-p, axis=-1)
        before = np.cumsum(np.take_along_axis(p, order, axis=-1), axis=-1) - \
            np.take_along_axis(p, order, axis=-1)  # mass of the more likely tokens
        np.put_along_axis(keep, order, np.take_along_axis(keep, order, axis=-1)
                          & (before < params.top_p), axis=-1)
    if params.min_p:
        keep &= p >= params.min_p * p.max(axis=-1, keepdims=True)
    want = np.where(keep, p, 0.0)
    want /= want.sum(axis=-1, keepdims=True)
    assert ((got > 0) == keep).all()
    # float32's exponentials and one rescaling: a few ulps per token (MLX's float32 row sums
    # alone were off by up to 1e-4)
    assert (np.abs(got - want) / np.where(keep, want, 1.0)).max() < 2e-5
    assert np.abs(got.astype(np.float64).sum(axis=-1) - 1.0).max() < 1e-6


# -- the runtime and the CLI on the tiny random pairs ------------------------------------------
def load_pair(tiny_pairs, family, **config):
    from engine import DFlashConfig, DFlashRuntime

    target, draft = tiny_pairs(family)
    return DFlashRuntime.from_pretrained(model=str(target), draft=str(draft),
                                         config=DFlashConfig(**config))


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_seed_repeats_a_sampled_reply_and_temperature_0_stays_greedy(tiny_pairs, family):
    rt = load_pair(tiny_pairs, family)
    ids = rt.encode("What is 12 times 7?")
    greedy = rt.generate(ids, 40, no_eos=True)
    assert rt.generate(ids, 40, no_eos=True, temperature=0.0, top_k=3, seed=5).tokens == \
        greedy.tokens  # temperature 0 ignores the filters and the seed: the greedy path
    first = rt.generate(ids, 40, no_eos=True, temperature=0.8, top_p=0.95, seed=7)
    again = rt.generate(ids, 40, no_eos=True, temperature=0.8, top_p=0.95, seed=7)
    other = rt.generate(ids, 40, no_eos=True, temperature=0.8, top_p=0.95, seed=8)
    assert first.speculative and first.cycles > 0 and len(first.tokens) == 40
    assert first.tokens == again.tokens and first.tokens != other.tokens
    plain = rt.generate(ids, 40, no_eos=True, temperature=0.8, seed=7, speculative=False)
    assert plain.tokens == rt.generate(ids, 40, no_eos=True, temperature=0.8, seed=7,
                                       speculative=False).tokens
    assert all(0 <= t < rt.target.vocab_size for t in first.tokens + plain.tokens)


def test_sampling_through_a_draft_token_subset(tiny_pairs):
    """A draft head over a token subset: q is zero outside it; replies stay valid."""
    rt = load_pair(tiny_pairs, "llama", min_draft_confidence=0.3)
    from engine.draft_head import build_draft_head

    ids = rt.encode("Hello world")
    rt.token_ranking = list(range(rt.target.vocab_size))
    rt.plan = dataclasses.replace(rt.plan, draft_vocab=256)
    assert build_draft_head(rt.target, rt.token_ranking, 256, ids).ids is not None
    result = rt.generate(ids, 30, no_eos=True, temperature=1.0, seed=1)
    assert len(result.tokens) == 30 and result.speculative


def test_cli_sampling_flags(tiny_pairs, capsys):
    from engine.cli import main

    target, draft = tiny_pairs("llama")
    base = ["generate", "--model", str(target), "--draft", str(draft), "--prompt", "Hi",
            "--max-tokens", "10", "--no-eos"]
    assert main(base + ["--temperature", "0.7", "--top-k", "20", "--seed", "3"]) == 0
    first = capsys.readouterr().out
    assert main(base + ["--temperature", "0.7", "--top-k", "20", "--seed", "3"]) == 0
    assert capsys.readouterr().out == first
    assert main(base + ["--temperature", "-1"]) == 2
    err = capsys.readouterr().err
    assert "temperature=-1.0 is invalid. Fix: use 0 (greedy) or more." in err
    assert "Traceback" not in err

