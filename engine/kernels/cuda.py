"""Fused GatedDeltaNet verify (recording the rollback tape) and tape replay for MLX CUDA.

Same contract as `portable`: `gated_delta_verify(q, k, v, g, beta, state) -> (y, state, Tape)`
and `tape_replay(state, tape, keep) -> state`. One thread block per (batch, value head):
32 x NW threads, warp w owns value rows w, w + NW, ... and lane l owns key columns
l, l + 32, ... of each row, so the Dv x Dk state lives in registers for all T <= 16 steps;
the step's q/k (and a vector gate) sit in shared memory. Row dot products are warp
butterflies (every lane ends with the same bits, so every lane applies the same delta).

The state update is written with explicit `__fmul_rn` / `__fmaf_rn` in both kernels, so
replaying the tape gives the verify's states bitwise (no compiler contraction can differ).
The result matches the portable path to float tolerance, not bitwise: the Dk reductions
run in another order than MLX's `sum`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import mlx.core as mx

from . import portable
from .portable import Tape

MAX_STEPS = 16
MAX_SHARED_BYTES = 48 * 1024  # static shared memory per block without opt-in

# Which (batch, value head) a block owns, and lane/warp inside it.
BLOCK_INDEX = r"""
    const int n = blockIdx.z;
    const int b = n / Hv;
    const int hv = n % Hv;
    const int hk = hv / (Hv / Hk);
    const int lane = threadIdx.x;
    const int warp = threadIdx.y;
"""

# The block's Dv x Dk state into registers (warp w: rows w, w + NW, ...; lane l: columns
# l, l + 32, ...).
LOAD_STATE = r"""
    float s[RPW][EPL];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const int row = warp + r * NW;
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        const int col = lane + 32 * e;
        s[r][e] = col < Dk ? static_cast<float>(state_in[sbase + row * Dk + col]) : 0.0f;
      }
    }
"""

# The registers back to state_out (the layout of LOAD_STATE).
STORE_STATE = r"""
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const int row = warp + r * NW;
#pragma unroll
      for (int e = 0; e < EPL; ++e) {
        const int col = lane + 32 * e;
        if (col < Dk) {
          state_out[sbase + row * Dk + col] = s[r][e];
        }
      }
    }
"""

VERIFY_SOURCE = r"""
    // One block per (batch, value head); grid z = B * Hv, block = (32, NW).""" + BLOCK_INDEX + r"""
    // q, k: [B, NT, Hk, Dk] -> shared fp32 [NT, Dk]; vector gate g: [B, NT, Hv, Dk].
    const int NT = k_shape[1];  // steps: runtime, so one compile serves T = 1..MT
    __shared__ float sq[MT * Dk];
    __shared__ float sk[MT * Dk];
    __shared__ float sg[VEC ? MT * Dk : 1];
    for (int i = warp * 32 + lane; i < NT * Dk; i += 32 * NW) {
      const int t = i / Dk;
      const int d = i % Dk;
      const size_t src = ((size_t)(b * NT + t) * Hk + hk) * Dk + d;
      sq[i] = static_cast<float>(q[src]);
      sk[i] = static_cast<float>(k[src]);
      if (VEC) {
        sg[i] = static_cast<float>(g[((size_t)(b * NT + t) * Hv + hv) * Dk + d]);
      }
    }
    __syncthreads();

    // state_in, state_out: [B, Hv, Dv, Dk]
    const size_t sbase = (size_t)n * Dv * Dk;""" + LOAD_STATE + r"""
    for (int t = 0; t < NT; ++t) {
      const float* kt = sk + t * Dk;
      const float* qt = sq + t * Dk;
      const size_t hb = (size_t)(b * NT + t) * Hv + hv;  // [B, NT, Hv] index
      const float gs = VEC ? 0.0f : static_cast<float>(g[hb]);
      const float bt = static_cast<float>(beta[hb]);

      // S' = g * S;  kv = S' k
      float kv[RPW];
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          const int col = lane + 32 * e;
          if (col < Dk) {
            s[r][e] = __fmul_rn(s[r][e], VEC ? sg[t * Dk + col] : gs);
            acc += s[r][e] * kt[col];
          }
        }
        kv[r] = acc;
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          kv[r] += __shfl_xor_sync(0xffffffffu, kv[r], off);
        }
      }

      // delta = beta (v - kv);  S = S' + delta k^T;  y = S q
      float dl[RPW];
      float out[RPW];
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        const int row = warp + r * NW;
        dl[r] = (static_cast<float>(v[hb * Dv + row]) - kv[r]) * bt;
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          const int col = lane + 32 * e;
          if (col < Dk) {
            s[r][e] = __fmaf_rn(kt[col], dl[r], s[r][e]);
            acc += s[r][e] * qt[col];
          }
        }
        out[r] = acc;
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          out[r] += __shfl_xor_sync(0xffffffffu, out[r], off);
        }
      }
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          const int row = warp + r * NW;
          y[hb * Dv + row] = static_cast<YT>(out[r]);
          delta[hb * Dv + row] = dl[r];
        }
      }
    }
""" + STORE_STATE

# The replay's steps on the registers of LOAD_STATE: the first NT steps of a tape recorded
# with TS steps per batch row; per step S = g * S; S = S + delta k^T.
REPLAY_STEPS = r"""
    for (int t = 0; t < NT; ++t) {
      const size_t hb = (size_t)(b * TS + t) * Hv + hv;
      const size_t kb = ((size_t)(b * TS + t) * Hk + hk) * Dk;
      const float gs = VEC ? 0.0f : static_cast<float>(g[hb]);
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        const int row = warp + r * NW;
        const float dl = delta[hb * Dv + row];
#pragma unroll
        for (int e = 0; e < EPL; ++e) {
          const int col = lane + 32 * e;
          if (col < Dk) {
            const float gc = VEC ? static_cast<float>(g[hb * Dk + col]) : gs;
            s[r][e] = __fmul_rn(s[r][e], gc);
            s[r][e] = __fmaf_rn(static_cast<float>(k[kb + col]), dl, s[r][e]);
          }
        }
      }
    }
"""

REPLAY_SOURCE = (
    r"""
    // Same block layout as the verify."""
    + BLOCK_INDEX
    + "    const size_t sbase = (size_t)n * Dv * Dk;\n"
    + LOAD_STATE
    + r"""
    const int NT = delta_shape[1];  // the tape's first `keep` steps, sliced by the caller
    const int TS = NT;"""
    + REPLAY_STEPS
    + STORE_STATE)

# A rollback in one launch: the replay over the whole recorded tape (TS steps), applying its
# first keep[0], then the conv state of the kept prefix, rows keep .. keep + K - 2 of
# [conv_in; qkv], copied by every thread of the grid (grid-stride loop).
ROLLBACK_SOURCE = (
    r"""
    // Replay's block layout; the tape is the verify's whole record."""
    + BLOCK_INDEX
    + "    const size_t sbase = (size_t)n * Dv * Dk;\n"
    + LOAD_STATE
    + r"""
    const int TS = delta_shape[1];
    const int NT = keep[0];"""
    + REPLAY_STEPS
    + STORE_STATE
    + r"""
    // conv_in [B, K-1, C] and qkv [B, TS, C] -> conv_out [B, K-1, C]
    const int NK = conv_in_shape[1];
    const int C = conv_in_shape[2];
    const size_t total = (size_t)conv_in_shape[0] * NK * C;
    const size_t step = (size_t)gridDim.z * blockDim.y * blockDim.x;
    for (size_t i = ((size_t)blockIdx.z * blockDim.y + warp) * blockDim.x + lane; i < total;
         i += step) {
      const int c = (int)(i % C);
      const int row = (int)((i / C) % NK);
      const size_t bb = i / ((size_t)C * NK);
      const int j = NT + row;
      conv_out[i] = j < NK ? conv_in[(bb * NK + j) * C + c]
                           : qkv[(bb * TS + (j - NK)) * C + c];
    }
""")

VERIFY_INPUTS = ["q", "k", "v", "g", "beta", "state_in"]
VERIFY_OUTPUTS = ["y", "state_out", "delta"]
REPLAY_INPUTS = ["state_in", "delta", "k", "g"]
REPLAY_OUTPUTS = ["state_out"]
ROLLBACK_INPUTS = ["state_in", "delta", "k", "g", "keep", "conv_in", "qkv"]
ROLLBACK_OUTPUTS = ["state_out", "conv_out"]


@dataclass(frozen=True)
class Plan:
    """Launch shape shared by the CUDA and Metal kernels (same layout on both)."""

    B: int
    T: int
    Hk: int
    Hv: int
    Dk: int
    Dv: int
    vec: bool
    warps: int  # NW: warps per block; each owns Dv / NW value rows

    @property
    def rows_per_warp(self) -> int:
        return self.Dv // self.warps

    @property
    def cols_per_lane(self) -> int:
        return -(-self.Dk // 32)

    @property
    def grid(self) -> tuple[int, int, int]:
        # In threads (dispatchThreads semantics on both backends): one block per (b, hv).
        return (32, self.warps, self.B * self.Hv)

    @property
    def threadgroup(self) -> tuple[int, int, int]:
        return (32, self.warps, 1)

    def shared_bytes(self) -> int:
        return (3 if self.vec else 2) * MAX_STEPS * self.Dk * 4

    def template(self, *arrays: mx.array) -> list[tuple[str, object]]:
        # Every input dtype is a template argument: MLX caches compiled kernels by name +
        # template, so two calls that differ only in an input dtype must not share one.
        # T is not: the kernels read it from an input's shape, so one compile serves 1..16.
        names = ("A0", "A1", "A2", "A3", "A4", "A5", "A6")
        dtypes = [(n, a.dtype) for n, a in zip(names, arrays)]
        return dtypes + [
            ("MT", MAX_STEPS), ("Dk", self.Dk), ("Dv", self.Dv), ("Hk", self.Hk),
            ("Hv", self.Hv), ("NW", self.warps), ("RPW", self.rows_per_warp),
            ("EPL", self.cols_per_lane), ("VEC", self.vec),
        ]


def warps_for(dv: int) -> int:
    """The most warps (<= 32, so <= 1024 threads) that split Dv rows evenly."""
    return next(w for w in (32, 16, 8, 4, 2, 1) if dv % w == 0)


def plan(k: mx.array, v: mx.array, g: mx.array) -> Plan | None:
    """The launch plan, or None where the fused kernel does not apply (portable fallback)."""
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[-2:]
    vec = g.ndim == 4
    p = Plan(B, T, Hk, Hv, Dk, Dv, vec, warps_for(Dv))
    if not 1 <= T <= MAX_STEPS or Hv % Hk or p.shared_bytes() > MAX_SHARED_BYTES:
        return None
    return p


@cache
def _kernels() -> tuple[object, object]:
    verify = mx.fast.cuda_kernel(
        name="dflash_gdn_verify", input_names=VERIFY_INPUTS, output_names=VERIFY_OUTPUTS,
        source=VERIFY_SOURCE,
    )
    replay = mx.fast.cuda_kernel(
        name="dflash_gdn_replay", input_names=REPLAY_INPUTS, output_names=REPLAY_OUTPUTS,
        source=REPLAY_SOURCE,
    )
    return verify, replay


@cache
def _rollback_kernel() -> object:
    return mx.fast.cuda_kernel(
        name="dflash_gdn_rollback", input_names=ROLLBACK_INPUTS,
        output_names=ROLLBACK_OUTPUTS, source=ROLLBACK_SOURCE,
    )


def run_verify(kernel, q, k, v, g, beta, state) -> tuple[mx.array, mx.array, Tape]:
    """Launch a verify kernel (CUDA or Metal: same inputs, outputs and layout)."""
    p = plan(k, v, g)
    if p is None:
        return portable.gated_delta_verify(q, k, v, g, beta, state)
    y, final, delta = kernel(
        inputs=[q, k, v, g, beta, state],
        template=[("YT", q.dtype), *p.template(q, k, v, g, beta, state)],
        grid=p.grid,
        threadgroup=p.threadgroup,
        output_shapes=[v.shape, (p.B, p.Hv, p.Dv, p.Dk), v.shape],
        output_dtypes=[q.dtype, mx.float32, mx.float32],
    )
    return y, final, Tape(delta, k, g)


def run_replay(kernel, state: mx.array, tape: Tape, keep: int) -> mx.array:
    if keep == 0:
        return state
    T = tape.delta.shape[1]
    if not 0 < keep <= T:
        raise ValueError(f"keep={keep} is outside the tape's 0..{T} steps")
    # The kernel applies every step it is given: hand it the first `keep` (for B = 1 a
    # prefix slice is already row-contiguous, so this copies nothing).
    delta, k, g = (x[:, :keep] for x in tape)
    p = plan(k, delta, g)
    if p is None:
        return portable.tape_replay(state, tape, keep)
    (out,) = kernel(
        inputs=[state, delta, k, g],
        template=p.template(state, delta, k, g),
        grid=p.grid,
        threadgroup=p.threadgroup,
        output_shapes=[state.shape],
        output_dtypes=[mx.float32],
    )
    return out


def gated_delta_verify(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array, Tape]:
    """q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g [B, T, Hv(, Dk)]; beta [B, T, Hv];
    state [B, Hv, Dv, Dk] -> (y [B, T, Hv, Dv], final fp32 state, tape)."""
    return run_verify(_kernels()[0], q, k, v, g, beta, state)


def tape_replay(state: mx.array, tape: Tape, keep: int) -> mx.array:
    """The state after the first `keep` verify steps, from the state before the verify."""
    return run_replay(_kernels()[1], state, tape, keep)


@cache
def _keep_array(keep: int) -> mx.array:
    """`keep` as the kernel reads it, made once per value (every layer of every cycle)."""
    return mx.array([keep], mx.int32)


def run_rollback(kernel, state: mx.array, tape: Tape, keep: int, conv_state: mx.array,
                 qkv: mx.array) -> tuple[mx.array, mx.array]:
    """Launch a fused rollback kernel on the whole tape and conv inputs."""
    T = tape.delta.shape[1]
    if not 0 <= keep <= T:
        raise ValueError(f"keep={keep} is outside the tape's 0..{T} steps")
    p = plan(tape.k, tape.delta, tape.g)
    if p is None:
        return portable.tape_replay(state, tape, keep), portable.conv_rows(conv_state, qkv, keep)
    arrays = [state, tape.delta, tape.k, tape.g, _keep_array(keep), conv_state, qkv]
    state_out, conv_out = kernel(
        inputs=arrays,
        template=p.template(*arrays),
        grid=p.grid,
        threadgroup=p.threadgroup,
        output_shapes=[state.shape, conv_state.shape],
        output_dtypes=[mx.float32, conv_state.dtype],
    )
    return state_out, conv_out


def fused_rollback(state: mx.array, tape: Tape, keep: int, conv_state: mx.array,
                   qkv: mx.array) -> tuple[mx.array, mx.array]:
    """`tape_replay` and `portable.conv_rows` in one launch (the same float ops as the replay
    kernel, so the same bits): a rollback costs one kernel per layer instead of several."""
    return run_rollback(_rollback_kernel(), state, tape, keep, conv_state, qkv)
