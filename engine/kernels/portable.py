"""Pure-MLX GatedDeltaNet verify and tape replay (any backend; the reference).

The per-step math is mlx-lm's `_gated_delta_step_ops`, op for op, so the verify output
and state match mlx-lm's ops path, and replay reproduces the verify's states bitwise.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx


class Tape(NamedTuple):
    """Per-step record of a verify: enough to rebuild any prefix state without inputs."""

    delta: mx.array  # [B, T, Hv, Dv] fp32 innovation beta_t * (v_t - S' k_t)
    k: mx.array  # [B, T, Hk, Dk] normalized keys, not repeated to Hv
    g: mx.array  # [B, T, Hv] scalar gate or [B, T, Hv, Dk] vector gate


def _decay(g: mx.array) -> mx.array:
    # [B, H] -> [B, H, 1, 1]; [B, H, Dk] -> [B, H, 1, Dk]
    return g[..., None, None] if g.ndim == 2 else g[..., None, :]


@mx.compile
def _verify_step(q, k, v, g, beta, state):
    state = state * _decay(g)
    kv_mem = (state * k[..., None, :]).sum(axis=-1)
    delta = (v - kv_mem) * beta[..., None]
    state = state + k[..., None, :] * delta[..., None]
    y = (state * q[..., None, :]).sum(axis=-1)
    return y.astype(q.dtype), state, delta


@mx.compile
def _replay_step(k, g, delta, state):
    # Same two ops as the verify step's state update, so the result is bitwise equal.
    state = state * _decay(g)
    return state + k[..., None, :] * delta[..., None]


def _repeat_heads(x: mx.array, hv: int) -> mx.array:
    return mx.repeat(x, hv // x.shape[-2], -2) if hv > x.shape[-2] else x


def gated_delta_verify(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array, Tape]:
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g [B, T, Hv(, Dk)]; beta [B, T, Hv];
    state [B, Hv, Dv, Dk] -> (y [B, T, Hv, Dv], final state, tape)."""
    hv = v.shape[-2]
    qr, kr = _repeat_heads(q, hv), _repeat_heads(k, hv)
    ys, deltas = [], []
    for t in range(q.shape[1]):
        y, state, delta = _verify_step(qr[:, t], kr[:, t], v[:, t], g[:, t], beta[:, t], state)
        ys.append(y)
        deltas.append(delta)
    return mx.stack(ys, axis=1), state, Tape(mx.stack(deltas, axis=1), k, g)


def tape_replay(state: mx.array, tape: Tape, keep: int) -> mx.array:
    """The state after the first `keep` verify steps, from the state before the verify.

    A sequential loop (keep <= 16 tiny elementwise steps) rather than a closed-form
    cumulative-decay sum: the closed form reorders float ops and would not be bitwise.
    """
    k = _repeat_heads(tape.k, tape.delta.shape[-2])
    for t in range(keep):
        state = _replay_step(k[:, t], tape.g[:, t], tape.delta[:, t], state)
    return state


def conv_rows(conv_state: mx.array, qkv: mx.array, keep: int) -> mx.array:
    """The causal conv's state after the first `keep` verify steps: the last rows (as many
    as `conv_state` [B, K-1, C] holds) of the rows before the verify and the kept steps'
    conv inputs `qkv` [B, T, C]."""
    rows = mx.concatenate([conv_state, qkv[:, :keep]], axis=1)
    return mx.contiguous(rows[:, -conv_state.shape[1]:, :])
