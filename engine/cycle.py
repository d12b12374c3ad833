"""The speculative loop: prefill, then [propose -> verify -> accept -> commit/rollback]*.

A cycle, as the plan (engine/plan.py) sets it up: the proposer stages the last committed token
and proposes what follows it: a repeat of earlier context where the suffix lookup finds one,
else one draft forward (its top tokens, finished from the context where the copy is on), cut
after the first draft the draft doubts where the verify cut is on. One target forward
verifies the proposal; greedy acceptance keeps the drafts up to the first that differs from
the target's argmax and adds the target's own next token; one host read brings back what the
cycle commits; the caches roll back to it. Greedy (the default): every committed token is the
target's argmax, so output equals plain greedy decoding. At temperature > 0, speculative
sampling keeps the target's distribution. The runtime turns the `Commit`s into text spans.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from .dflash2 import CandidateSelector, DFlash2Draft
from .draft import DFlashDraft
from .draft_head import DraftHead
from .events import Commit, CycleStats
from .kernels.cpu_softmax import softmax
from .lookup import ContextCopy, SuffixLookup
from .pause import Pacer
from .plain import plain_stretch
from .plan import Plan
from .sampling import Sampler, full_vocab, next_token
from .targets.base import TargetAdapter, cache_arrays

# A short match's repeat is proposed where the draft expects at least this share of the run it
# expects of its own tokens (picked on held-out answers: benchmarks/stage13/choice-study-cpu.json)
REPEAT_ODDS = 0.4


class PhaseClock:
    """The one place timings are taken. With `sync`, each phase's outputs are evaluated before
    its lap, so laps are device times per phase. Without it the work is only queued
    (async_eval) and overlaps the next phase's graph building: faster, and the laps are
    host-side times; the cycle then syncs once, reading the accepted count and the committed
    tokens together (`read_commit`)."""

    def __init__(self, sync: bool = True) -> None:
        self.sync = sync
        self.last = time.perf_counter()

    def lap(self, *outputs: Any) -> float:
        if self.sync:
            mx.eval(*outputs)
        else:
            mx.async_eval(*outputs)
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return elapsed


def prefill(target: TargetAdapter, cache: list[Any], prompt: list[int], chunk: int,
            proposer: DraftProposer | None = None) -> mx.array:
    """Run the prompt through the target in chunks; feed tapped features to the proposer's
    draft context. Returns the logits of the last prompt position [V]."""
    tap_ids = proposer.tap_ids if proposer is not None else []
    logits = None
    for start in range(0, len(prompt), chunk):
        ids = mx.array([prompt[start:start + chunk]])
        logits, taps = target.forward(ids, cache, tap_ids, last_only=True)
        if proposer is not None:
            proposer.append_context(taps)
        mx.eval(logits, cache_arrays(cache, proposer.cache if proposer is not None else []))
    assert logits is not None, "empty prompt"
    return logits[0, -1]


# -- proposals ----------------------------------------------------------------------------
def drafted_proposal(staged: int, logits: mx.array, head: DraftHead,
                     min_confidence: float | None = None, lengths: Sequence[int] = ()
                     ) -> mx.array:
    """Draft logits [1, size - 1, K] over `head` -> verify input [1, <= size]: `staged`, then
    the draft's top tokens, as `verify_length` cuts them."""
    drafted = head.token_ids(mx.argmax(logits, axis=-1)).astype(mx.int32)
    proposal = mx.concatenate([mx.array([[staged]], dtype=mx.int32), drafted], axis=1)
    return proposal[:, :verify_length(logits, min_confidence, logits.shape[1] + 1, lengths)]


def top_probability(logits: mx.array) -> mx.array:
    """Draft logits [1, n, K] -> the draft's probability of its top token at each slot [n]
    (over a subset head slightly overestimated: fine for the verify cut and the choice)."""
    return mx.max(softmax(logits[0]), axis=-1)


def verify_length(logits: mx.array, min_confidence: float | None, size: int,
                  lengths: Sequence[int] = ()) -> int:
    """How much of a proposal to verify: all `size` tokens, or with `min_confidence` up to
    and including the first draft the draft gives less than that probability (that one may
    still be right; later ones rarely are), `padded` by `lengths`. A shorter verify is cheaper
    where a forward's cost grows with its length (a CPU). The cut's length is a shape, so it
    costs a host sync between draft and verify; without it the cycle's only sync is
    `read_commit`. Lossless either way: the target decides every token."""
    if min_confidence is None:
        return size
    return cut_length(top_probability(logits), min_confidence, size, lengths)


def cut_length(probs: mx.array, min_confidence: float, size: int,
               lengths: Sequence[int] = ()) -> int:
    """The verify cut for a proposal whose drafts the draft gives `probs` [size - 1]: the
    staged token and the drafts up to and including the first below `min_confidence` (a host
    sync), `padded` by `lengths`."""
    return padded(min(int(confident_run(probs, min_confidence)) + 2, size), size, lengths)


def padded(n: int, size: int, lengths: Sequence[int]) -> int:
    """The length to verify for a cut of `n` tokens: `lengths[n]` (>= n, a length the machine
    verifies faster: engine/verify_lengths.py) within the `size` proposed; `n` without one."""
    return min(lengths[n], size) if n < len(lengths) else n


def confident_run(probs: mx.array, min_confidence: float) -> mx.array:
    """How many leading proposals the draft gives at least `min_confidence` (a scalar)."""
    return mx.sum(mx.cumprod((probs >= min_confidence).astype(mx.int32)))


def expected_run(probs: mx.array) -> mx.array:
    """The run a proposal is expected to reach if its tokens' probabilities `probs` [n] were
    independent: the sum over k of the chance that the first k are all right."""
    return mx.sum(mx.cumprod(probs))


def choose_proposal(staged: int, logits: mx.array, head: DraftHead, repeat: Sequence[int],
                    min_confidence: float | None = None, lengths: Sequence[int] = ()
                    ) -> tuple[mx.array, mx.array]:
    """`propose` from the draft's logits [1, size - 1, K] over `head`, with `repeat` (a
    suffix lookup's proposal from a short match) as the alternative: the draft scores both by
    the run it expects of them (`expected_run` of its own probabilities of their tokens) and
    the verify input [1, <= size] holds the repeat where it scores at least REPEAT_ODDS times
    the draft's own top tokens. The choice stays on the device (no sync of its own); the
    verify cut, where on, applies to the draft's proposal only. -> (verify input, whether the
    repeat was taken: a bool scalar)."""
    probs = softmax(logits[0])
    drafted = head.token_ids(mx.argmax(logits[0], axis=-1)).astype(mx.int32)
    take, tokens = take_repeat(probs, head, repeat, drafted)
    proposal = mx.concatenate([mx.array([staged], dtype=mx.int32), tokens])[None]
    return proposal[:, :choice_length(take, mx.max(probs, axis=-1), len(repeat),
                                      min_confidence, logits.shape[1] + 1, lengths)], take


def take_repeat(probs: mx.array, head: DraftHead, repeat: Sequence[int], drafted: mx.array
                ) -> tuple[mx.array, mx.array]:
    """The choice of `choose_proposal`: the draft's distributions `probs` [n, K] over its
    head, its own proposal `drafted` [n] (token ids). -> (whether the repeat is taken, a
    bool scalar; the proposed tokens [n]: the repeat's or the drafts)."""
    n = min(len(repeat), probs.shape[0])
    index, known = head.index_of(list(repeat[:n]))
    repeat_probs = mx.where(known, mx.take_along_axis(probs[:n], index[:, None], axis=-1)[:, 0],
                            0.0)
    take = repeat_wins(probs, repeat_probs)
    tokens = mx.pad(mx.array(list(repeat[:n]), dtype=mx.int32), (0, probs.shape[0] - n))
    return take, mx.where(take, tokens, drafted)


def repeat_wins(probs: mx.array, repeat_probs: mx.array) -> mx.array:
    """Whether the draft, with distributions `probs` [n, K], expects the repeat whose tokens
    it gives `repeat_probs` to run at least REPEAT_ODDS times as far as its own top tokens."""
    return expected_run(repeat_probs) >= REPEAT_ODDS * expected_run(mx.max(probs, axis=-1))


def choice_length(take: mx.array, top: mx.array, repeat: int, min_confidence: float | None,
                  size: int, lengths: Sequence[int] = ()) -> int:
    """How much of a chosen proposal to verify: a taken repeat whole, the drafts as
    `verify_length` cuts them (with the cut on, one sync reads the cut and the choice)."""
    if min_confidence is None:
        return size
    cut, took = mx.stack([confident_run(top, min_confidence), take.astype(mx.int32)]).tolist()
    return min(repeat, size - 1) + 1 if took else padded(min(cut + 2, size), size, lengths)


def copied_proposal(staged: int, logits: mx.array, head: DraftHead, copy: ContextCopy,
                    odds: float, min_confidence: float | None = None,
                    lengths: Sequence[int] = (), repeat: Sequence[int] = ()
                    ) -> tuple[mx.array, bool]:
    """`drafted_proposal` built slot by slot on the host: at each slot the context's
    candidate (`ContextCopy.candidate` of the tokens chosen so far) replaces the draft's top
    token where the draft gives it at least `odds` times that token's probability. With
    `repeat` (a suffix lookup's proposal from a short match), the repeat instead where the
    draft expects it to run REPEAT_ODDS times as far (`choose_proposal`'s rule). Reads the
    draft's distributions (a host sync between draft and verify, as the verify cut's); the
    cut then reads the chosen tokens' probabilities. Lossless: the target verifies it.
    -> (verify input [1, <= size], whether the repeat was taken)."""
    # float32 on the host: numpy has no bfloat16 (a bf16 draft's logits)
    probs_d = softmax(logits[0]).astype(mx.float32)  # [n, K]
    top_d = mx.argmax(probs_d, axis=-1)
    ids_d = head.token_ids(top_d)
    mx.eval(probs_d, top_d, ids_d)  # the cycle's read before its verify
    probs, top, top_ids = np.array(probs_d), np.array(top_d), np.array(ids_d)
    row: list[int] = []
    chosen: list[float] = []
    for j in range(probs.shape[0]):
        token, p = int(top_ids[j]), float(probs[j, top[j]])
        candidate = copy.candidate(row)
        if candidate >= 0 and candidate != token:
            index = head.host_index(candidate)
            if index >= 0 and probs[j, index] >= odds * p:
                token, p = candidate, float(probs[j, index])
        row.append(token)
        chosen.append(p)
    size = len(row) + 1
    if repeat:
        n = min(len(repeat), len(row))
        indices = [head.host_index(t) for t in repeat[:n]]
        repeat_probs = [float(probs[j, i]) if i >= 0 else 0.0 for j, i in enumerate(indices)]
        if (np.cumprod(repeat_probs).sum()
                >= REPEAT_ODDS * np.cumprod(chosen).sum()):
            return mx.array([[staged, *repeat[:n]]], dtype=mx.int32), True
    n = size
    if min_confidence is not None:
        with mx.stream(mx.cpu):  # host values: no device round trip for the count
            n = cut_length(mx.array(chosen, dtype=mx.float32), min_confidence, size, lengths)
    return mx.array([[staged, *row][:n]], dtype=mx.int32), False


# -- sampled proposals --------------------------------------------------------------------
def draw_proposal(staged: int, logits: mx.array, ids: mx.array | None, vocab: int,
                  sampler: Sampler, min_confidence: float | None = None,
                  lengths: Sequence[int] = ()) -> tuple[mx.array, mx.array]:
    """Draft logits [1, size - 1, K] over the token subset `ids` (None: the vocabulary)
    -> (verify input [1, n + 1]: `staged`, then drafts drawn from the processed q; q over
    the vocabulary [n, V]). The verify cut shortens both: an early stop, not a rejection."""
    if logits.shape[1] == 0:  # a one-token verify: nothing to draft
        return mx.array([[staged]], dtype=mx.int32), mx.zeros((0, vocab))
    q = sampler.probs(logits[0])
    drafted = sampler.draw(q).astype(mx.int32)
    if ids is not None:
        drafted = ids[drafted]
    proposal = mx.concatenate([mx.array([staged], dtype=mx.int32), drafted])[None]
    n = verify_length(logits, min_confidence, logits.shape[1] + 1, lengths)
    return proposal[:, :n], full_vocab(q, ids, vocab)[: n - 1]


def draw_or_repeat(staged: int, logits: mx.array, head: DraftHead, vocab: int,
                   sampler: Sampler, repeat: Sequence[int], min_confidence: float | None = None,
                   lengths: Sequence[int] = ()) -> tuple[mx.array, mx.array, mx.array]:
    """`draw_proposal` with `repeat` as the alternative, chosen as `choose_proposal` does but
    on the draft's processed distribution q. The choice reads the draft alone, so either
    proposal keeps speculative sampling exact with its own q: the draws' q, or the repeat's
    (one-hot). -> (verify input, q over the vocabulary [n, V], whether the repeat was taken)."""
    q = sampler.probs(logits[0])
    drawn = head.token_ids(sampler.draw(q)).astype(mx.int32)
    take, tokens = take_repeat(q, head, repeat, drawn)
    q = mx.where(take, one_hot(tokens, vocab), full_vocab(q, head.ids, vocab))
    proposal = mx.concatenate([mx.array([staged], dtype=mx.int32), tokens])[None]
    length = choice_length(take, top_probability(logits), len(repeat), min_confidence,
                           logits.shape[1] + 1, lengths)
    return proposal[:, :length], q[: length - 1], take


def one_hot(tokens: mx.array, vocab: int) -> mx.array:
    """A certain proposal's q: [n] token ids -> [n, vocab] float32."""
    return (mx.arange(vocab)[None] == tokens[:, None]).astype(mx.float32)


# -- acceptance ---------------------------------------------------------------------------
def accept(verify_in: mx.array, verify_logits: mx.array) -> tuple[mx.array, mx.array]:
    """Greedy acceptance: the longest prefix of drafts that equal the target's argmax.
    -> (accepted count a, target argmax [size]); the bonus token is argmax[a]."""
    choice = mx.argmax(verify_logits[0], axis=-1).astype(verify_in.dtype)
    agree = (verify_in[0, 1:] == choice[:-1]).astype(mx.int32)
    return mx.sum(mx.cumprod(agree)), choice


def commit_values(verify_in: mx.array, accepted: mx.array, following: mx.array,
                  flag: bool | mx.array = False) -> mx.array:
    """What the cycle's one host sync reads (`read_commit`), still on the device: `flag` (a
    bool, or a bool scalar still on the device: the proposer's choice), the accepted count
    a, the drafts, and the target's token after the kept ones."""
    return mx.concatenate([mx.array(flag).reshape(1).astype(mx.int32),
                           accepted.reshape(1).astype(mx.int32),
                           verify_in[0, 1:].astype(mx.int32),
                           following.reshape(1).astype(mx.int32)])


def read_commit(values: mx.array) -> tuple[int, list[int], bool]:
    """The cycle's one host sync: the accepted count a, the committed tokens (the a kept
    drafts, then the target's token after them) and the flag come back in one read of
    `commit_values`."""
    row = values.tolist()
    a = row[1]
    return a, row[2:2 + a] + [row[-1]], bool(row[0])


@dataclass
class DraftProposer:
    """The DFlash draft as the cycle's proposer, doing what its `plan` says: its context cache,
    output head, verify cut, and the suffix lookup and context copy seeded with `context`
    (the prompt's tokens).

    `propose(staged, size, position)` returns the verify input [1, <= size] (staged token
    first); tests and the benchmarks subclass it to propose other tokens while the draft's
    context still follows every commit. A cycle whose latest tokens repeat earlier ones
    proposes what followed them, without a draft forward; where they repeat fewer (a short
    match), the draft runs and chooses between its proposal and the repeat
    (`choose_proposal`). `took_repeat` says whether the last proposal was the lookup's: a
    bool, or where the device chose, a bool scalar that the cycle's one read (`read_commit`)
    brings back."""

    target: TargetAdapter
    draft: DFlashDraft
    head: DraftHead | None = None  # None: the target's full lm_head
    plan: Plan = Plan()  # the default: whole blocks, no lookup (the published recipe)
    cache: list[Any] = field(default_factory=list)  # the draft's context; empty: made here
    context: Sequence[int] = ()  # the prompt's tokens
    lookup: SuffixLookup | None = field(default=None, init=False)
    copy: ContextCopy | None = field(default=None, init=False)
    took_repeat: bool | mx.array = field(default=False, init=False)
    # A DFlash2 draft's candidate selector (engine/dflash2.py): every draft proposal is its
    # path (`path_proposal`); None: the draft's top tokens
    selector: CandidateSelector | None = field(default=None, init=False, repr=False)
    # the next cycle's draft logits [1, B - 1, K]; context entries past the kept ones
    _prefetched: mx.array | None = field(default=None, init=False, repr=False)
    _unsettled: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.cache:
            self.cache = self.draft.make_cache()
        if isinstance(self.draft, DFlash2Draft):
            self.selector = self.draft.candidate_selector
        if self.plan.lookup_min_match is not None:
            self.lookup = SuffixLookup(self.plan.lookup_min_match)
        if self.plan.copy_odds is not None:
            self.copy = ContextCopy()
        self.observe(self.context)

    def observe(self, tokens: Sequence[int]) -> None:
        """Committed tokens, in order (the lookup's and the copy's context grow with them)."""
        if self.lookup is not None:
            self.lookup.extend(tokens)
        if self.copy is not None:
            self.copy.extend(tokens)

    @property
    def tap_ids(self) -> Sequence[int]:
        """The target layers whose outputs feed the draft's context."""
        return self.draft.args.target_layer_ids

    @property
    def output_head(self) -> DraftHead:
        """The head the draft proposes through (the target's full lm_head when unset)."""
        return self.head or DraftHead(self.target)

    @property
    def lookup_min_match(self) -> int:
        """The match length from which the lookup proposes without a draft forward."""
        return self.lookup.min_match if self.lookup is not None else 0

    def append_context(self, taps: mx.array) -> None:
        """Add committed tokens' tapped target features to the draft's context (a forward
        prefetched on the context before them is stale: a pause's plain steps came between)."""
        self._prefetched = None
        self.draft.append_context(taps, self.cache)

    def paused_size(self, size: int) -> int:
        """A paused cycle's verify length: `size` where the suffix lookup has a long match
        (its repeat, no draft forward), else 1 (a plain step: the target alone)."""
        length, found = self._looked_up(size)
        return size if found and length >= self.lookup_min_match else 1

    def propose(self, staged: int, size: int, position: int) -> mx.array:
        """The verify input [1, <= size]: a long match's repeat, or the draft's proposal
        (copied from the context, or chosen against a short match's repeat, where on)."""
        length, found = self._looked_up(size)
        if found and length >= self.lookup_min_match:
            # verified whole: a repeat tends to run on, and the draft cannot cut it
            return mx.array([[staged] + found])
        if self.selector is not None:  # a DFlash2 draft: its selector's path, nothing else
            self.took_repeat = False
            return self.path_proposal(staged, size)[0]
        plan = self.plan
        if self.copy is not None and size > 1:
            verify_in, self.took_repeat = copied_proposal(
                staged, self.draft_logits(staged, size), self.output_head, self.copy,
                plan.copy_odds or 0.0, plan.min_confidence, plan.verify_lengths, found)
            return verify_in
        if found:
            verify_in, self.took_repeat = choose_proposal(
                staged, self.draft_logits(staged, size), self.output_head, found,
                plan.min_confidence, plan.verify_lengths)
            return verify_in
        return self.draft_proposal(staged, size)

    def draft_proposal(self, staged: int, size: int) -> mx.array:
        """The draft forward's proposal (`propose`), or the prefetched forward's."""
        if size == 1:
            self._prefetched = None
            return mx.array([[staged]], dtype=mx.int32)
        return drafted_proposal(staged, self.draft_logits(staged, size), self.output_head,
                                self.plan.min_confidence, self.plan.verify_lengths)

    def propose_sampled(self, staged: int, size: int, position: int, sampler: Sampler
                        ) -> tuple[mx.array, mx.array]:
        """-> (verify input, the proposal's distribution q at each drafted position [n, V]).
        A looked-up proposal is certain (q one-hot), which speculative sampling keeps exact:
        a token is kept with the target's probability of it, else redrawn without it."""
        length, found = self._looked_up(size)
        if found and length >= self.lookup_min_match:
            q = one_hot(mx.array(found), self.target.vocab_size)
            return mx.array([[staged] + found], dtype=mx.int32), q
        if self.selector is not None:
            self.took_repeat = False
            return self.path_proposal(staged, size, sampler)  # type: ignore[return-value]
        if found:
            verify_in, q, self.took_repeat = draw_or_repeat(
                staged, self.draft_logits(staged, size), self.output_head,
                self.target.vocab_size, sampler, found, self.plan.min_confidence,
                self.plan.verify_lengths)
            return verify_in, q
        return self.draft_proposal_sampled(staged, size, sampler)

    def draft_proposal_sampled(self, staged: int, size: int, sampler: Sampler
                               ) -> tuple[mx.array, mx.array]:
        """The draft forward's sampled proposal and q (`propose_sampled`)."""
        if size == 1:
            self._prefetched = None
            return mx.array([[staged]], dtype=mx.int32), mx.zeros((0, self.target.vocab_size))
        return draw_proposal(staged, self.draft_logits(staged, size), self.output_head.ids,
                             self.target.vocab_size, sampler, self.plan.min_confidence,
                             self.plan.verify_lengths)

    def path_proposal(self, staged: int, size: int, sampler: Sampler | None = None
                      ) -> tuple[mx.array, mx.array | None]:
        """A DFlash2 draft's proposal: its selector's path (`CandidateSelector.walk`) through
        the block's `path_outputs`. -> (verify input [1, <= size]: `staged`, then the path;
        with a `sampler`, the draws' distributions over the vocabulary [<= size - 1, V], each
        conditioned on the draws before it as speculative sampling needs). The verify cut
        reads the draft's own probabilities of the path's tokens."""
        assert self.selector is not None
        vocab, cut = self.target.vocab_size, self.plan.min_confidence
        if size == 1:
            return mx.array([[staged]], dtype=mx.int32), mx.zeros((0, vocab))
        hidden, logits = self.path_outputs(staged, size)
        path = self.selector.walk(hidden, logits, staged, self.output_head, sampler)
        proposal = mx.concatenate([mx.array([staged], dtype=mx.int32), path.tokens])[None]
        n = size if cut is None else cut_length(path.confidence, cut, size,
                                                self.plan.verify_lengths)
        if path.q is None:
            return proposal[:, :n], None
        q = mx.put_along_axis(mx.zeros((size - 1, vocab), dtype=path.q.dtype), path.candidates,
                              path.q, axis=-1)
        return proposal[:, :n], q[: n - 1]

    def path_outputs(self, staged: int, size: int) -> tuple[mx.array, mx.array]:
        """A DFlash2 draft forward on [staged, mask x (size - 1)] -> the normed hidden states
        [size - 1, H] and logits [size - 1, K] of its slots 1.. (`block_outputs`)."""
        draft: DFlash2Draft = self.draft  # type: ignore[assignment]
        block = mx.array([[staged] + [draft.args.mask_token_id] * (size - 1)])
        return draft.block_outputs(self.target.embed(block), self.cache, self.output_head)

    def _looked_up(self, size: int) -> tuple[int, list[int]]:
        """The lookup's proposal (size - 1 tokens) and its match's length ((0, []) when there
        is none)."""
        found = (0, [])
        if self.lookup is not None and size > 1:
            found = self.lookup.propose(size - 1)
        self.took_repeat = bool(found[1])
        return found

    def draft_logits(self, staged: int, size: int) -> mx.array:
        """One draft forward on [staged, mask x (size-1)] -> logits over its head
        [1, size - 1, K] (size > 1); the prefetched forward's where there is one."""
        logits, self._prefetched = self._prefetched, None
        if logits is not None:
            return logits[:, :size - 1]
        return self.block_logits(mx.array([[staged] + [self.draft.args.mask_token_id]
                                           * (size - 1)]))

    def block_logits(self, block: mx.array, unsettled: int = 0,
                     kept: mx.array | None = None) -> mx.array:
        """The draft's logits [1, size - 1, K] over its head for a block [1, size]
        (`DFlashDraft.__call__`'s `unsettled` and `kept`)."""
        hidden = self.draft(self.target.embed(block), self.cache, unsettled, kept)
        # the head runs on the whole block, the staged token's row dropped after: a CPU BLAS
        # multiplies 16 rows faster than 15
        return self.output_head(hidden)[:, 1:]

    def prefetch(self, taps: mx.array, accepted: mx.array, following: mx.array,
                 block_size: int) -> None:
        """Before a cycle's sync: add all of its verified positions' features to the context,
        and queue the next cycle's draft forward on them, staged on the target's token after
        the kept drafts (`following`, still on the device: its argmax, or sampled, its draw)
        and seeing only the kept positions (`accepted` + 1). The device runs it while the host
        reads the commit and builds the next verify; `settle` then trims the rejected
        positions. Its proposals are those of the draft run after the sync, up to rounding:
        lossless either way (sampled, the draws and their q come from whichever logits)."""
        self.append_context(taps)
        self._unsettled = taps.shape[1]
        block = mx.concatenate([following.reshape(1, 1).astype(mx.int32),
                                mx.full((1, block_size - 1), self.draft.args.mask_token_id,
                                        mx.int32)], axis=1)
        self._prefetched = self.block_logits(block, self._unsettled, accepted + 1)
        mx.async_eval(self._prefetched)

    def settle(self, keep: int) -> None:
        """After the sync: keep only the first `keep` of the prefetch's verified positions."""
        drop, self._unsettled = self._unsettled - keep, 0
        if drop > 0:
            for c in self.cache:
                c.trim(drop)


# -- the loop -----------------------------------------------------------------------------
def speculative_decode(target: TargetAdapter, proposer: DraftProposer, prompt: list[int],
                       max_tokens: int, block_size: int, prefill_chunk: int,
                       cache: list[Any] | None = None, sync_phases: bool = False,
                       sampler: Sampler | None = None, stop_ids: Collection[int] = (),
                       pacer: Pacer | None = None) -> Iterator[Commit]:
    """Yields the prefill's token, then one Commit per cycle. `cache` may be passed in
    (empty) to inspect it afterwards; `sync_phases` evaluates each phase on its own so the
    cycle stats hold device times per phase (see PhaseClock). Without a `sampler` every token
    is the target's argmax (greedy, exact); with one, speculative sampling (sampling.py)
    commits tokens distributed as the target's own samples. A commit holding one of
    `stop_ids` is the last, and the caches then end just before that token: a recurrent
    state cannot be cut back later, and the next chat turn renders its own end-of-turn.
    A `pacer` (engine/pause.py) pauses speculation where it does not pay: a paused cycle is
    a 1-token step of the target alone (or a long suffix-lookup repeat), the same tokens;
    its taps wait in `pacer.deferred` for the draft's next forward."""
    cache = target.make_cache() if cache is None else cache
    pacer = pacer or Pacer(enabled=False)
    tap_ids = proposer.tap_ids
    position = len(prompt)
    last = prefill(target, cache, prompt, prefill_chunk, proposer)
    staged = int(target.agree(next_token(last, sampler))[0])
    proposer.observe([staged])
    yield Commit([staged], 0)
    emitted, index = 1, 0
    while emitted < max_tokens:
        # Never verify more than can be emitted: a cycle commits at most `size` new tokens.
        size = min(block_size, max_tokens - emitted)
        paused = pacer.paused
        if paused:
            size = proposer.paused_size(size)
            if size == 1:  # the target alone, each step queued before the last is read
                run = yield from plain_stretch(target, proposer, pacer, cache, staged,
                                               max_tokens - emitted, block_size, sampler,
                                               stop_ids, index)
                if run.stopped:
                    return
                staged, emitted, position = run.last, emitted + run.tokens, position + run.tokens
                index += run.tokens
                continue
        elif pacer.deferred:  # the paused steps' features, in one projection
            proposer.append_context(mx.concatenate(pacer.take_deferred(), axis=1))
        clock = PhaseClock(sync_phases)
        pacer.begin()
        if sampler is None:
            verify_in = proposer.propose(staged, size, position)
        else:
            verify_in, q = proposer.propose_sampled(staged, size, position, sampler)
        (verify_in,) = target.agree(verify_in)  # sharded: rank 0's drafts for every rank
        size = verify_in.shape[1]
        draft_s = clock.lap(verify_in)

        target.begin_verify(cache)
        logits, taps = target.forward(verify_in, cache, tap_ids)
        if sampler is None:
            accepted, choice = accept(verify_in, logits)
            following = choice[accepted]  # the target's argmax after the kept drafts
        else:
            accepted, following = sampler.accept(verify_in, sampler.probs(logits[0]), q)
        accepted, following = target.agree(accepted, following)  # sharded: rank 0's
        values = commit_values(verify_in, accepted, following, proposer.took_repeat)
        verify_s = clock.lap(values)
        prefetching = proposer.plan.prefetch and not paused
        if prefetching:  # queued after the values: the sync below does not wait for it
            proposer.prefetch(taps, accepted, following, block_size)

        a, tokens, looked_up = read_commit(values)
        stop = next((i for i, t in enumerate(tokens) if t in stop_ids), None)
        keep = a + 1 if stop is None else min(a, stop) + 1  # a stop as the bonus: not fed
        target.rollback(cache, keep=keep, verified=size)
        if prefetching:
            proposer.settle(keep)
        elif paused:
            pacer.deferred.append(taps[:, :keep])
        else:
            proposer.append_context(taps[:, :keep])
        rollback_s = clock.lap(cache_arrays(cache, proposer.cache))
        # paused here: a lookup repeat, not a plain step (plain_stretch runs those)
        pacer.end(len(tokens), False, size, verify_s + rollback_s)

        staged = tokens[-1]
        emitted += len(tokens)
        position += a + 1
        proposer.observe(tokens)
        yield Commit(tokens, a, CycleStats(index, size, a, draft_s, verify_s, rollback_s,
                                           looked_up, paused))
        if stop is not None:
            return
        index += 1
