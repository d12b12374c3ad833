"""The DFlash training objective: anchored blocks, the context mask, the draft's training
forward and the decay-weighted cross-entropy over slots 1..B-1 against the data's tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map

from ..bench.metrics import repeated_ngrams
from ..draft import DFlashDraft
from ..errors import ConfigError
from ..targets.base import TargetAdapter
from .dataset import Dataset


# -- batches of blocks --------------------------------------------------------------------
@dataclass
class Batch:
    tokens: mx.array  # [N, T] right-padded sequences (target input)
    block: mx.array  # [N, A*B] block token ids: [anchor token, mask x (B-1)] per anchor
    anchors: mx.array  # [N, A] absolute position of each block's first slot
    labels: mx.array  # [N, A, B-1] true tokens at anchor+1 .. anchor+B-1
    valid: mx.array  # [N, A, B-1] 1 where the label exists (inside the sequence, real anchor)
    repeats: mx.array | None = None  # [N, A, B-1] 1 where the label ends a repeated 4-gram


def make_batch(data: Dataset, idx: Sequence[int], n_anchors: int, block_size: int,
               mask_id: int, rng: np.random.Generator, pad_to: int = 32,
               mark_repeats: bool = False) -> Batch:
    """Sample up to `n_anchors` distinct anchors per sequence inside its response. A batch of
    short responses gets fewer anchor slots (the longest one's count, rounded up to 8), and
    a response shorter than that repeats its first anchor with no loss. `mark_repeats`
    fills `Batch.repeats` (`repeated_positions`)."""
    N = len(idx)
    most = max(len(data.sequences[i]) - 1 - data.prompt_lens[i] for i in idx)
    A = max(1, min(n_anchors, -(-most // 8) * 8))
    longest = max(len(data.sequences[i]) for i in idx)
    T = -(-longest // pad_to) * pad_to
    tokens = np.zeros((N, T), np.int32)
    anchors = np.zeros((N, A), np.int32)
    real = np.zeros((N, A), bool)
    for n, i in enumerate(idx):
        seq, p = data.sequences[i], data.prompt_lens[i]
        tokens[n, : len(seq)] = seq
        cands = np.arange(p, len(seq) - 1)  # anchor + 1 must be a real token
        pick = np.sort(rng.choice(cands, min(A, len(cands)), replace=False))
        anchors[n, : len(pick)], anchors[n, len(pick):] = pick, pick[0]
        real[n, : len(pick)] = True
    lengths = np.array([len(data.sequences[i]) for i in idx])
    return anchored_batch(tokens, anchors, lengths, real, block_size, mask_id, mark_repeats)


def anchored_batch(tokens: np.ndarray, anchors: np.ndarray, lengths: np.ndarray,
                   real: np.ndarray, block_size: int, mask_id: int,
                   mark_repeats: bool = False) -> Batch:
    """The blocks at given anchors: tokens [N, T] (right-padded), anchors [N, A], each
    sequence's length [N], `real` [N, A] marking anchors that count (the rest repeat one)."""
    (N, T), A, B = tokens.shape, anchors.shape[1], block_size
    pos = anchors[:, :, None] + np.arange(1, B)[None, None, :]
    valid = (pos < lengths[:, None, None]) & real[:, :, None]
    flat = np.minimum(pos, T - 1).reshape(N, -1)
    labels = np.take_along_axis(tokens, flat, 1).reshape(pos.shape)
    block = np.full((N, A, B), mask_id, np.int32)
    block[:, :, 0] = np.take_along_axis(tokens, anchors, 1)
    repeats = None
    if mark_repeats:
        repeated = repeated_positions(tokens, lengths)
        repeats = mx.array(np.take_along_axis(repeated, flat, 1).reshape(pos.shape)
                           .astype(np.float32))
    return Batch(mx.array(tokens), mx.array(block.reshape(N, A * B)), mx.array(anchors),
                 mx.array(labels), mx.array(valid.astype(np.float32)), repeats)


def repeated_positions(tokens: np.ndarray, lengths: np.ndarray, n: int = 4) -> np.ndarray:
    """bool [N, T]: where a token ends an n-gram that already ended earlier in its sequence
    (prompt included). The metric's repeated 4-grams (`repeated_ngram_share`): stretches a
    decode's suffix lookup (engine/lookup.py) mostly proposes instead of the draft."""
    out = np.zeros(tokens.shape, bool)
    for row, length in enumerate(lengths):
        flags = repeated_ngrams(tokens[row, :length].tolist(), n)
        out[row, n - 1:n - 1 + len(flags)] = flags
    return out


def context_mask(anchors: mx.array, ctx_len: int, block_size: int) -> mx.array:
    """The recipe's mask over the context, bool [N, 1, A*B, ctx_len]: block a's queries see
    context positions t < anchor_a. Each block also sees all B of its own slots
    (bidirectional) and no other block: `_train_attention` computes that part per block
    instead of masking an [A*B, A*B] square that is almost all hidden."""
    starts = mx.repeat(anchors, block_size, axis=1)  # [N, A*B]: each query's anchor
    return (mx.arange(ctx_len)[None, None, :] < starts[:, :, None])[:, None]


def slot_weights(block_size: int, gamma: float) -> mx.array:
    """exp(-(k-1)/gamma) for slots k = 1..B-1 (slot 0 carries the known token: no loss)."""
    return mx.exp(-mx.arange(block_size - 1, dtype=mx.float32) / gamma)


# -- the training forward: the draft's own modules under an explicit mask ------------------
def _rope_blocks(rope: nn.Module, x: mx.array, anchors: mx.array, B: int) -> mx.array:
    """RoPE at absolute positions anchor..anchor+B-1 for every block: fold the blocks into
    the batch axis and give each its own offset."""
    N, h, L, hd = x.shape
    A = L // B
    x = x.reshape(N, h, A, B, hd).transpose(0, 2, 1, 3, 4).reshape(N * A, h, B, hd)
    x = rope(x, offset=anchors.reshape(-1))
    return x.reshape(N, A, h, B, hd).transpose(0, 2, 1, 3, 4).reshape(N, h, L, hd)


def _train_attention(attn: nn.Module, x: mx.array, ctx: mx.array, anchors: mx.array, B: int,
                     mask: mx.array) -> mx.array:
    """Every block's attention over its visible context (`mask`) and its own B slots, one
    softmax across both: the masked attention of the recipe without scoring each query
    against every other block's slots."""
    N, L, _ = x.shape
    hq, hkv = attn.n_heads, attn.n_kv_heads
    q = _rope_blocks(attn.rope, attn.q_norm(attn._heads(attn.q_proj(x), hq)), anchors, B)
    k = _rope_blocks(attn.rope, attn.k_norm(attn._heads(attn.k_proj(x), hkv)), anchors, B)
    v = attn._heads(attn.v_proj(x), hkv)
    ctx_k, ctx_v = attn.context_kv(ctx, 0)  # context token p at position p
    out = _blockwise_attention(q * attn.scale, k, v, ctx_k, ctx_v, mask, B)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(N, L, -1))


def _blockwise_attention(q: mx.array, k: mx.array, v: mx.array, ctx_k: mx.array,
                         ctx_v: mx.array, mask: mx.array, B: int) -> mx.array:
    """The attention of every block's B queries (q [N, hq, A*B, hd], scaled; k, v
    [N, hkv, A*B, hd]) over the context they see (`mask`, ctx_k / ctx_v [N, hkv, T, hd]) and
    all of their own block's slots, one softmax across both, without scoring a query against
    any other block. -> [N, hq, A*B, hd]."""
    N, hq, L, hd = q.shape
    hkv, T = k.shape[1], ctx_k.shape[2]
    A, g = L // B, hq // hkv  # g: query heads per KV head
    q = q.reshape(N, hkv, g * L, hd)
    on_ctx = (q @ ctx_k.swapaxes(-1, -2)).reshape(N, hkv, g, L, T)
    on_ctx = mx.where(mask[:, :, None], on_ctx, -mx.inf)
    on_own = q.reshape(N, hkv, g, A, B, hd) @ k.reshape(N, hkv, 1, A, B, hd).swapaxes(-1, -2)
    scores = [on_ctx, on_own.reshape(N, hkv, g, L, B)]
    p = mx.softmax(mx.concatenate(scores, axis=-1), axis=-1, precise=True)
    out = p[..., :T] @ ctx_v[:, :, None]
    own = p[..., T:T + B].reshape(N, hkv, g, A, B, B) @ v.reshape(N, hkv, 1, A, B, hd)
    out = out + own.reshape(N, hkv, g, L, hd)
    return out.reshape(N, hq, L, hd)


def train_forward(draft: DFlashDraft, taps: mx.array, block_emb: mx.array, anchors: mx.array,
                  mask: mx.array) -> mx.array:
    """taps [N, T, n*H], block embeddings [N, A*B, H], anchors [N, A], mask from
    `context_mask` -> normed hidden states [N, A*B, H] (same as the inference forward)."""
    if draft.args.layer_types and "sliding_attention" in draft.args.layer_types:
        raise NotImplementedError("training sliding-window draft layers is not supported")
    B = draft.args.block_size
    ctx = draft.project_context(taps)
    h = block_emb
    for layer in draft.layers:
        h = h + _train_attention(layer.self_attn, layer.input_layernorm(h), ctx, anchors, B,
                                 mask)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return draft.norm(h)


def target_taps(target: TargetAdapter, tokens: mx.array, tap_ids: Sequence[int]) -> mx.array:
    """Frozen target features of whole sequences (one forward, no gradient)."""
    _, feats = target.forward(tokens, target.make_cache(), list(tap_ids), last_only=True)
    return mx.stop_gradient(feats)


@contextmanager
def computing_in(module: nn.Module, dtype: mx.Dtype) -> Iterator[None]:
    """`module` runs with its floating parameters cast to `dtype` (bfloat16: a GPU's fast
    matmuls) while its float32 ones stay its weights: under nn.value_and_grad the gradients
    reach those through the cast, in float32, for the optimizer (mixed precision)."""
    weights = module.parameters()
    floats = [w for _, w in tree_flatten(weights) if mx.issubdtype(w.dtype, mx.floating)]
    if all(w.dtype == dtype for w in floats):  # float32 training: no cast on every step
        yield
        return
    cast = tree_map(lambda w: w.astype(dtype) if mx.issubdtype(w.dtype, mx.floating) else w,
                    weights)
    module.update(cast)
    try:
        yield
    finally:
        module.update(weights)


Head = Callable[[mx.array], mx.array]


def head_weight(target: TargetAdapter, dtype: mx.Dtype) -> mx.array | None:
    """The target's lm_head weight [V, H] in `dtype`; None when the head is quantized."""
    outer = getattr(target.model, "language_model", target.model)
    tied = getattr(target.args, "tie_word_embeddings", False) or not hasattr(outer, "lm_head")
    w = (target.inner.embed_tokens if tied else outer.lm_head).weight
    if w.dtype not in (mx.float32, mx.float16, mx.bfloat16):
        return None
    w = w.astype(dtype)
    mx.eval(w)
    return w


def low_precision_head(target: TargetAdapter, dtype: mx.Dtype) -> Head:
    """The target's lm_head computed in `dtype` (bf16 on GPU: the vocab projection dominates
    a training step). Validation keeps the exact head."""
    w = None if dtype == mx.float32 else head_weight(target, dtype)
    if w is None:
        return target.lm_head
    return lambda h: h.astype(dtype) @ w.T


@dataclass
class LossVocabulary:
    """The training loss's softmax over `size` tokens instead of the whole vocabulary: every
    token of the batch (its prompts and labels) plus the highest-ranked response tokens. A
    decode proposes from such a subset (draft_head.py: the ranking's top plus the prompt's
    tokens), so this trains the choice a decode makes, and the vocabulary projection with its
    softmax, most of a training step's draft work, shrinks by the vocabulary over `size`."""

    weight: mx.array  # [V, H]: the target's head, in training's dtype
    ranking: np.ndarray  # every token id, the most frequent response tokens first
    size: int

    @classmethod
    def build(cls, target: TargetAdapter, dtype: mx.Dtype, ranked: Sequence[int],
              size: int) -> LossVocabulary:
        weight = head_weight(target, dtype)
        if weight is None:
            raise ConfigError("--loss-vocab: this target's lm_head is quantized; train "
                              "without --loss-vocab (the whole vocabulary)")
        vocab = weight.shape[0]
        seen = np.zeros(vocab, bool)
        first = np.asarray([t for t in ranked if 0 <= t < vocab], np.int64)
        seen[first] = True  # then the tokens no response wrote, by id
        return cls(weight, np.concatenate([first, np.flatnonzero(~seen)]), size)

    def restrict(self, batch: Batch) -> tuple[Batch, Head]:
        """-> (the batch with labels as indices into the subset, the subset's head)."""
        vocab = self.weight.shape[0]
        labels = np.asarray(batch.labels)
        keep = np.zeros(vocab, bool)
        keep[np.asarray(batch.tokens).ravel()] = True
        keep[labels.ravel()] = True
        missing = self.size - int(keep.sum())
        if missing > 0:
            keep[self.ranking[~keep[self.ranking]][:missing]] = True
        ids = np.flatnonzero(keep)
        index = np.zeros(vocab, np.int32)
        index[ids] = np.arange(ids.size, dtype=np.int32)
        w = mx.take(self.weight, mx.array(ids.astype(np.int32)), axis=0)
        restricted = replace(batch, labels=mx.array(index[labels]))
        return restricted, lambda h: h.astype(w.dtype) @ w.T


def slot_hidden(draft: DFlashDraft, target: TargetAdapter, batch: Batch,
                taps: mx.array) -> mx.array:
    """-> the draft's hidden states [N, A, B-1, H] at slots 1..B-1 of every block."""
    B = draft.args.block_size
    N, A = batch.anchors.shape
    mask = context_mask(batch.anchors, taps.shape[1], B)
    hidden = train_forward(draft, taps, target.embed(batch.block), batch.anchors, mask)
    return hidden.reshape(N, A, B, -1)[:, :, 1:]


def slot_logits(draft: DFlashDraft, target: TargetAdapter, batch: Batch, taps: mx.array,
                head: Head | None = None) -> mx.array:
    """-> logits [N, A, B-1, V] of slots 1..B-1 of every block, as a decode proposes from
    them."""
    return (head or target.lm_head)(slot_hidden(draft, target, batch, taps))


def forward_parts(draft: DFlashDraft, target: TargetAdapter, batch: Batch, taps: mx.array,
                  weights: mx.array, head: Head) -> Iterator[tuple[str, mx.array]]:
    """`block_loss`'s forward part by part, for a profile that evaluates each in turn: the
    draft's layers, the vocabulary projection, then the weighted cross-entropy."""
    hidden = slot_hidden(draft, target, batch, taps)
    yield "forward_draft_layers", hidden
    logits = head(hidden)
    yield "forward_head", logits
    yield "forward_loss", slot_loss(logits, batch, weights)


def block_loss(draft: DFlashDraft, target: TargetAdapter, batch: Batch, taps: mx.array,
               weights: mx.array, head: Head | None = None) -> mx.array:
    """Slot-weighted cross-entropy against the labels."""
    return slot_loss(slot_logits(draft, target, batch, taps, head), batch, weights)


def slot_loss(logits: mx.array, batch: Batch, weights: mx.array) -> mx.array:
    """`block_loss` from the slots' logits [N, A, B-1, V]. The logsumexp reads the logits in
    their own dtype: it accumulates in float32 inside and its gradient (a softmax of the
    logits) is the same as through a float32 copy, which a bf16 head would write and read
    again at every step; only the per-row value rounds to that dtype before the mean."""
    label_logit = mx.take_along_axis(logits, batch.labels[..., None], axis=-1)[..., 0]
    ce = (mx.logsumexp(logits, axis=-1).astype(mx.float32) - label_logit.astype(mx.float32))
    w = batch.valid * weights
    return (ce * w).sum() / mx.maximum(w.sum(), 1e-6)


def block_runs(logits: mx.array, batch: Batch) -> mx.array:
    """[N, A]: per block the run of correct argmax predictions from slot 1, so 1 + run is
    what a greedy cycle anchored there commits (exact for greedy data)."""
    hit = (mx.argmax(logits, axis=-1) == batch.labels) * batch.valid
    return mx.cumprod(hit, axis=-1).sum(axis=-1)


def tokens_per_cycle(logits: mx.array, batch: Batch) -> tuple[float, int]:
    """Simulated greedy acceptance averaged over the batch's anchors.
    -> (sum of 1 + run over real blocks, number of blocks)."""
    real = batch.valid[:, :, 0]
    return float(((1 + block_runs(logits, batch)) * real).sum()), int(real.sum())


def every_anchor(seq: Sequence[int], prompt_len: int, block_size: int, mask_id: int,
                 chunk: int = 64) -> Iterator[Batch]:
    """Blocks anchored at every response position of one sequence, `chunk` anchors a batch
    (in order: the first batch's first anchor is position prompt_len)."""
    tokens = np.asarray(seq, np.int32)[None]
    length = np.array([tokens.shape[1]])
    for lo in range(prompt_len, length[0] - 1, chunk):
        anchors = np.arange(lo, min(lo + chunk, length[0] - 1), dtype=np.int32)[None]
        yield anchored_batch(tokens, anchors, length, np.ones(anchors.shape, bool),
                             block_size, mask_id)


def anchor_runs(draft: DFlashDraft, target: TargetAdapter, seq: Sequence[int],
                prompt_len: int, chunk: int = 64) -> np.ndarray:
    """The run (`block_runs`) of a block anchored at every response position of one sequence:
    entry a is the anchor at prompt_len + a (`anchor_hits`)."""
    hits, _ = anchor_hits(draft, target, seq, prompt_len, chunk)
    return np.cumprod(hits, axis=-1).sum(axis=-1)


def anchor_hits(draft: DFlashDraft, target: TargetAdapter, seq: Sequence[int],
                prompt_len: int, chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """A block anchored at every response position of one sequence (target features from one
    forward, as in training). -> (bool
    [n, B-1]: the draft's proposal right at slots 1..B-1, bool [n, B-1]: the slot lies inside
    the sequence), row a the anchor at prompt_len + a."""
    taps = target_taps(target, mx.array([list(seq)]), draft.args.target_layer_ids)
    K = draft.args.block_size - 1
    hits, valid = [np.zeros((0, K), bool)], [np.zeros((0, K), bool)]
    for batch in every_anchor(seq, prompt_len, draft.args.block_size,
                              draft.args.mask_token_id, chunk):
        inside = np.array(batch.valid)[0] > 0
        right = np.array(mx.argmax(slot_logits(draft, target, batch, taps), -1))[0]
        hits.append((right == np.array(batch.labels)[0]) & inside)
        valid.append(inside)
    return np.concatenate(hits), np.concatenate(valid)


def walk_cycles(runs: Sequence[int], n: int) -> list[int]:
    """Tokens per cycle of a greedy decode of a reply of n tokens (token 0 from prefill),
    given the run at every anchor: the first cycle anchors at token 0 and commits 1 + run
    tokens (cut at the reply's end); the next anchors at the last token it committed.
    Unlike the mean over all anchors, this weights the hard spots as decoding does: a long
    run is one cycle, each miss another."""
    cycles, a = [], 0
    while a < n - 1:
        step = min(1 + int(runs[a]), n - 1 - a)
        cycles.append(step)
        a += step
    return cycles


def simulate_answer(draft: DFlashDraft, target: TargetAdapter, seq: Sequence[int],
                    prompt_len: int) -> dict:
    """Greedy acceptance on one answer, two ways: `anchor_mean` (1 + run over a block at every
    position) and `walk` (tokens/cycle of the cycles in `walk_cycles`, as a decode counts);
    `anchor_runs` holds the run at every anchor."""
    runs = anchor_runs(draft, target, seq, prompt_len)
    n = len(seq) - prompt_len
    cycles = walk_cycles(runs, n)
    return {"anchor_mean": float(1 + runs.mean()) if len(runs) else None,
            "walk": (n - 1) / len(cycles) if cycles else None, "walk_cycles": cycles,
            "anchor_runs": [int(r) for r in runs]}
