"""Sampling at temperature > 0, and speculative sampling that keeps the target's distribution.

`SamplingParams` are the user's settings; `Sampler` turns logits into the processed
distribution (temperature, then top-k, top-p and min-p filters, renormalized) and draws from
it with its own seeded key sequence, so a seed reproduces the same tokens on one machine.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the draft's tokens x_i are
drawn from its processed distribution q_i, the target's verify gives p_i for the same
positions, and `accept` keeps x_i with probability min(1, p_i(x_i) / q_i(x_i)). At the first
rejection the token is drawn from norm(max(0, p_i - q_i)); when every draft is kept, the bonus
token is drawn from the target's next distribution. Each committed token is then distributed
exactly as the target alone would sample it, whatever q is: q only sets how often drafts are
kept. Temperature 0 never comes here: the engine keeps its exact greedy path.
"""

from __future__ import annotations

import secrets

import mlx.core as mx

# Plain Python, in config so a UI can check settings without loading MLX; re-exported here.
from .config import SamplingParams
from .kernels.cpu_softmax import distribution

__all__ = ["Sampler", "SamplingParams", "full_vocab"]


class Sampler:
    """Processed distributions and seeded draws for one generation."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.key = mx.random.key(seed)

    def next_key(self) -> mx.array:
        self.key, key = mx.random.split(self.key)
        return key

    def probs(self, logits: mx.array) -> mx.array:
        """logits [..., V] -> the processed distribution [..., V] (float32, rows sum to 1):
        the softmax at the temperature, then the filters, renormalized."""
        p = self.params
        scaled = logits.astype(mx.float32) / p.temperature
        probs = distribution(scaled)
        top_k = p.top_k if p.top_k < scaled.shape[-1] else 0  # all of them: no filter
        if not top_k and p.top_p == 1.0 and p.min_p == 0:
            return probs
        removed = mx.zeros(scaled.shape, dtype=mx.bool_)
        if top_k:
            kth = mx.sort(scaled, axis=-1)[..., -top_k][..., None]
            removed = removed | (scaled < kth)
        if p.top_p < 1.0:
            # Drop the tokens whose more likely tokens already hold top_p (the top one stays).
            ordered = mx.sort(probs, axis=-1)
            above = mx.cumsum(ordered, axis=-1, reverse=True, inclusive=False)
            dropped = (above >= p.top_p).sum(axis=-1, keepdims=True)
            threshold = mx.take_along_axis(ordered, dropped, axis=-1)
            removed = removed | (probs < threshold)
        if p.min_p > 0:
            removed = removed | (probs < mx.max(probs, axis=-1, keepdims=True) * p.min_p)
        kept = mx.where(removed, 0.0, probs)
        return kept / mx.sum(kept, axis=-1, keepdims=True)

    def draw(self, probs: mx.array) -> mx.array:
        """One token id per row of `probs` [..., V]."""
        return mx.random.categorical(mx.log(probs), axis=-1, key=self.next_key())

    def accept(self, verify_in: mx.array, p: mx.array, q: mx.array) -> tuple[mx.array, mx.array]:
        """Speculative sampling acceptance for one verify.

        verify_in [1, n + 1] (staged token, then n drafts drawn from q); p [n + 1, V] the
        target's processed distributions at those positions; q [n, V] the draft's (zero
        outside its token subset). -> (accepted count a, the token after the kept drafts)."""
        n = q.shape[0]
        drafts = verify_in[0, 1:]
        px = mx.take_along_axis(p[:n], drafts[:, None], axis=-1)[:, 0]
        qx = mx.take_along_axis(q, drafts[:, None], axis=-1)[:, 0]
        u = mx.random.uniform(shape=(n,), key=self.next_key())
        kept = (u * qx < px).astype(mx.int32)  # u < p/q, without dividing by q
        a = mx.sum(mx.cumprod(kept))
        # Row i < n: the residual after rejecting draft i; row n: the bonus distribution.
        rows = mx.concatenate([mx.maximum(p[:n] - q, 0.0), p[n:]], axis=0)
        row = rows[a]
        total = mx.sum(row)
        # A rejection only happens where p(x) < q(x), so the residual has mass; the guard
        # covers float round-off.
        row = mx.where(total > 0, row / mx.maximum(total, 1e-30), p[mx.minimum(a, n)])
        return a, self.draw(row)


def next_token(logits: mx.array, sampler: Sampler | None) -> mx.array:
    """The target's token after `logits` [..., V]: its argmax (greedy, `sampler` None), or a
    draw from `sampler`'s processed distribution."""
    return (mx.argmax(logits, axis=-1) if sampler is None
            else sampler.draw(sampler.probs(logits)))


def full_vocab(q: mx.array, ids: mx.array | None, vocab: int) -> mx.array:
    """A distribution over a token subset [n, K] (ids [K]) -> over the vocabulary [n, V]."""
    if ids is None:
        return q
    index = mx.broadcast_to(ids[None, :], q.shape)
    return mx.put_along_axis(mx.zeros((q.shape[0], vocab), dtype=q.dtype), index, q, axis=-1)
