"""Weight VALUES for a synthetic target whose greedy continuation survives rounding.

Plain random weights give near-flat logits, so a 16-token verify and 1-token decoding round
to different argmaxes in bf16 and an oracle built on the greedy continuation matches nothing
(issues #13, #19). `peak` rewrites values only (shapes, dtypes and kernels stay, so timings
do not change) so that the next token is a large-margin function of the current one:

- the embedding of token t is a rotary code of its place k(t) on one seeded cycle through the
  whole vocabulary: a constant channel, then cos/sin of 2*pi*f_p*k/V for P seeded frequencies;
- every residual-branch output (attention o_proj, GatedDeltaNet out_proj, MLP down_proj) is
  scaled by RESIDUAL_SCALE, so the random layers still run but the stream stays the embedding;
- the last layer's MLP advances the code one step (gate constant through the constant channel,
  up the identity, down the rotation minus the identity), so the stream ends as code(k + 1);
- the head is the embedding (tied, or a copy when untied), so logits are code(k') . code(k+1):
  P + 1 at the next token on the cycle, at most a few sqrt(P) anywhere else.

The next token is `successor(t)`; the cycle has every token on it, so an answer does not repeat.
The edit runs on the lazy float model before any cast and before mlx-lm's shard(), so each
rank of a sharded model builds the same values from the same seed and keeps its slices.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

RESIDUAL_SCALE = 0.01  # branch outputs ~0.01x their random size: the embedding dominates
RESIDUAL_OUTPUTS = ("o_proj", "out_proj", "down_proj")
CONSTANT = 1.0  # the constant channel (0) of every embedding: the last MLP's gate reads it
DIGIT = 8  # k * f mod V in int32 a byte of k at a time (V < 2**22)


def cycle_order(vocab: int, seed: int) -> np.ndarray:
    """The tokens in their order on the cycle: order[k + 1] follows order[k]."""
    return np.random.default_rng(seed).permutation(vocab)


def frequencies(vocab: int, planes: int, seed: int) -> np.ndarray:
    choices = np.arange(1, max(vocab // 2, 2))  # below V/2: no plane repeats another
    rng = np.random.default_rng(seed + 1)
    return np.sort(rng.choice(choices, planes, replace=planes > len(choices)))


def successor(vocab: int, seed: int) -> np.ndarray:
    """next[t]: the token the peaked model predicts after t."""
    order = cycle_order(vocab, seed)
    nxt = np.empty(vocab, dtype=np.int64)
    nxt[order] = np.roll(order, -1)
    return nxt


def token_code(vocab: int, dims: int, seed: int) -> tuple[mx.array, np.ndarray]:
    """(V, dims) float32 embeddings (lazy) and the P plane frequencies."""
    if vocab >= 2 ** (3 * DIGIT - 2):
        raise ValueError(f"vocab {vocab} too large for the int32 phase arithmetic")
    planes = (dims - 1) // 2
    freqs = frequencies(vocab, planes, seed)
    place = np.empty(vocab, dtype=np.int32)
    place[cycle_order(vocab, seed)] = np.arange(vocab, dtype=np.int32)
    k, f = mx.array(place)[:, None], mx.array(freqs.astype(np.int32))[None, :]
    phase = mx.zeros((vocab, planes), dtype=mx.int32)
    for shift in (2 * DIGIT, DIGIT, 0):  # Horner: exact k * f mod V, below 2**31 throughout
        phase = (phase * (1 << DIGIT) + ((k >> shift) & ((1 << DIGIT) - 1)) * f) % vocab
    angle = phase.astype(mx.float32) * (2 * math.pi / vocab)
    waves = mx.stack([mx.cos(angle), mx.sin(angle)], axis=-1).reshape(vocab, 2 * planes)
    code = mx.concatenate([mx.full((vocab, 1), CONSTANT), waves,
                           mx.zeros((vocab, dims - 1 - 2 * planes))], axis=1)
    return code, freqs


def step_matrix(dims: int, vocab: int, freqs: np.ndarray) -> np.ndarray:
    """R: code(k) -> code(k + 1), a rotation by 2*pi*f_p/V in each plane, 1 elsewhere."""
    r = np.eye(dims)
    for p, f in enumerate(freqs):
        c, s = math.cos(2 * math.pi * f / vocab), math.sin(2 * math.pi * f / vocab)
        i = 1 + 2 * p
        r[i:i + 2, i:i + 2] = [[c, -s], [s, c]]
    return r


def _plain_linear(m: object, what: str) -> nn.Linear:
    if not isinstance(m, nn.Linear) or isinstance(m, nn.QuantizedLinear):
        raise ValueError(f"peaked synthetic weights need a float nn.Linear {what}, got "
                         f"{type(m).__name__}")
    return m


def peak(model: nn.Module, seed: int = 0) -> None:
    """Rewrite `model`'s (lazy, float, unsharded) weight values in place: see the module
    docstring. Raises ValueError for a module layout it does not know."""
    lm = getattr(model, "language_model", model)
    text, layers = lm.model, lm.model.layers
    embed = text.embed_tokens
    if type(embed) is not nn.Embedding:
        raise ValueError(f"peaked synthetic weights need a float embedding, got "
                         f"{type(embed).__name__}")
    vocab, dims = embed.weight.shape
    code, freqs = token_code(vocab, dims, seed)
    embed.weight = code
    head = getattr(lm, "lm_head", None)
    if head is not None:  # untied: the same values in its own buffer
        _plain_linear(head, "lm_head").weight = code

    outputs = [m for name, m in model.named_modules()
               if name.rsplit(".", 1)[-1] in RESIDUAL_OUTPUTS]
    if len(outputs) != 2 * len(layers):
        raise ValueError(f"found {len(outputs)} residual outputs "
                         f"({'/'.join(RESIDUAL_OUTPUTS)}) for {len(layers)} layers, want 2 a "
                         "layer")
    for m in outputs:
        _plain_linear(m, "residual output")
        m.weight = m.weight * RESIDUAL_SCALE
        if "bias" in m:
            m.bias = m.bias * RESIDUAL_SCALE

    last = layers[-1]
    mlp = last.mlp
    gate, up, down = (_plain_linear(getattr(mlp, n, None), f"last-layer mlp.{n}")
                      for n in ("gate_proj", "up_proj", "down_proj"))
    hidden = up.weight.shape[0]
    if hidden < dims:
        raise ValueError(f"the last MLP ({hidden} wide) cannot carry {dims} channels")
    # The MLP sees n = post_attention_layernorm(code): its channel 0 is the same for every
    # token (all codes have one norm), so gate = n0 / n0 = 1 and silu(1) scales every unit.
    # n0 from the code at place 0 (cos 1, sin 0), which has that same norm.
    first = np.zeros(dims, dtype=np.float32)
    first[0], first[1:1 + 2 * len(freqs):2] = CONSTANT, 1.0
    n0 = last.post_attention_layernorm(mx.array(first))[0]
    unit = 1 / (1 + math.exp(-1.0))  # silu(1)
    gate.weight = mx.concatenate([mx.broadcast_to(1 / n0, (hidden, 1)),
                                  mx.zeros((hidden, dims - 1))], axis=1)
    up.weight = mx.eye(hidden, dims)
    step = mx.array((step_matrix(dims, vocab, freqs) - np.eye(dims)).astype(np.float32))
    down.weight = mx.concatenate([step * (CONSTANT / (n0 * unit)),
                                  mx.zeros((dims, hidden - dims))], axis=1)
    for m in (gate, up, down):
        if "bias" in m:
            m.bias = mx.zeros_like(m.bias)


WEIGHTS = (f"random layers with residual outputs scaled by {RESIDUAL_SCALE}, token embeddings "
           "a seeded rotary code of one cycle through the vocabulary, the last MLP advancing "
           "the code one step and the head reading it back (a permutation head), so the greedy "
           "continuation is robust to rounding; timings do not depend on weight values")


def greedy_margins(model: nn.Module, ids: list[int], n: int, prefill_step: int) -> list[float]:
    """Top-1 minus top-2 logit at each of n tokens of plain greedy decoding (mlx-lm's
    generate_step, untimed): how far each choice is from a rounding flip."""
    from mlx_lm.generate import generate_step

    out = []
    for _, logprobs in generate_step(mx.array(ids), model, max_tokens=n,
                                     prefill_step_size=prefill_step):
        a, b = mx.topk(logprobs.astype(mx.float32), 2).tolist()  # the top two, any order
        out.append(abs(a - b))
    return out
