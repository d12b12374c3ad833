"""Fused GatedDeltaNet verify + tape replay for MLX Metal: the CUDA kernels' algorithm.

Same layout as `cuda` (one threadgroup per (batch, value head), 32 x NW threads, simdgroup
w owns value rows w, w + NW, ..., lane l owns key columns l, l + 32, ...), same launch
`Plan`. Unproven: it has never run on a Mac, so only the "native" kernels mode
(DFLASH_KERNELS=native) picks it. The state update uses explicit `fma` in both kernels so replay
reproduces the verify's states bitwise.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from .cuda import (
    REPLAY_INPUTS,
    REPLAY_OUTPUTS,
    VERIFY_INPUTS,
    VERIFY_OUTPUTS,
    run_replay,
    run_verify,
)
from .portable import Tape

# Which (batch, value head) a threadgroup owns, and lane/warp inside it.
BLOCK_INDEX = r"""
    const uint n = threadgroup_position_in_grid.z;
    const uint b = n / Hv;
    const uint hv = n % Hv;
    const uint hk = hv / (Hv / Hk);
    const uint lane = thread_position_in_threadgroup.x;
    const uint warp = thread_position_in_threadgroup.y;
"""

# The threadgroup's Dv x Dk state into registers (the layout of cuda.LOAD_STATE).
LOAD_STATE = r"""
    float s[RPW][EPL];
    for (int r = 0; r < RPW; ++r) {
      const uint row = warp + r * NW;
      for (int e = 0; e < EPL; ++e) {
        const uint col = lane + 32 * e;
        s[r][e] = col < uint(Dk) ? static_cast<float>(state_in[sbase + row * Dk + col]) : 0.0f;
      }
    }
"""

# The registers back to state_out (the layout of LOAD_STATE).
STORE_STATE = r"""
    for (int r = 0; r < RPW; ++r) {
      const uint row = warp + r * NW;
      for (int e = 0; e < EPL; ++e) {
        const uint col = lane + 32 * e;
        if (col < uint(Dk)) {
          state_out[sbase + row * Dk + col] = s[r][e];
        }
      }
    }
"""

VERIFY_SOURCE = BLOCK_INDEX + r"""
    const int NT = k_shape[1];  // steps: runtime, so one compile serves T = 1..MT
    threadgroup float sq[MT * Dk];
    threadgroup float sk[MT * Dk];
    threadgroup float sg[VEC ? MT * Dk : 1];
    for (uint i = warp * 32 + lane; i < uint(NT * Dk); i += 32 * NW) {
      const uint t = i / Dk;
      const uint d = i % Dk;
      const size_t src = (size_t(b * NT + t) * Hk + hk) * Dk + d;
      sq[i] = static_cast<float>(q[src]);
      sk[i] = static_cast<float>(k[src]);
      if (VEC) {
        sg[i] = static_cast<float>(g[(size_t(b * NT + t) * Hv + hv) * Dk + d]);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    const size_t sbase = size_t(n) * Dv * Dk;""" + LOAD_STATE + r"""
    for (int t = 0; t < NT; ++t) {
      const size_t hb = size_t(b * NT + t) * Hv + hv;
      const float gs = VEC ? 0.0f : static_cast<float>(g[hb]);
      const float bt = static_cast<float>(beta[hb]);

      float kv[RPW];
      for (int r = 0; r < RPW; ++r) {
        float acc = 0.0f;
        for (int e = 0; e < EPL; ++e) {
          const uint col = lane + 32 * e;
          if (col < uint(Dk)) {
            s[r][e] = s[r][e] * (VEC ? sg[t * Dk + col] : gs);
            acc += s[r][e] * sk[t * Dk + col];
          }
        }
        kv[r] = acc;
      }
      for (ushort off = 16; off > 0; off >>= 1) {
        for (int r = 0; r < RPW; ++r) {
          kv[r] += simd_shuffle_xor(kv[r], off);
        }
      }

      float dl[RPW];
      float out[RPW];
      for (int r = 0; r < RPW; ++r) {
        const uint row = warp + r * NW;
        dl[r] = (static_cast<float>(v[hb * Dv + row]) - kv[r]) * bt;
        float acc = 0.0f;
        for (int e = 0; e < EPL; ++e) {
          const uint col = lane + 32 * e;
          if (col < uint(Dk)) {
            s[r][e] = metal::fma(sk[t * Dk + col], dl[r], s[r][e]);
            acc += s[r][e] * sq[t * Dk + col];
          }
        }
        out[r] = acc;
      }
      for (ushort off = 16; off > 0; off >>= 1) {
        for (int r = 0; r < RPW; ++r) {
          out[r] += simd_shuffle_xor(out[r], off);
        }
      }
      if (lane == 0) {
        for (int r = 0; r < RPW; ++r) {
          const uint row = warp + r * NW;
          y[hb * Dv + row] = static_cast<YT>(out[r]);
          delta[hb * Dv + row] = dl[r];
        }
      }
    }
""" + STORE_STATE

REPLAY_SOURCE = (
    BLOCK_INDEX
    + "    const size_t sbase = size_t(n) * Dv * Dk;\n"
    + LOAD_STATE
    + r"""
    const int NT = delta_shape[1];  // the tape's first `keep` steps, sliced by the caller
    for (int t = 0; t < NT; ++t) {
      const size_t hb = size_t(b * NT + t) * Hv + hv;
      const size_t kb = (size_t(b * NT + t) * Hk + hk) * Dk;
      const float gs = VEC ? 0.0f : static_cast<float>(g[hb]);
      for (int r = 0; r < RPW; ++r) {
        const uint row = warp + r * NW;
        const float dl = delta[hb * Dv + row];
        for (int e = 0; e < EPL; ++e) {
          const uint col = lane + 32 * e;
          if (col < uint(Dk)) {
            const float gc = VEC ? static_cast<float>(g[hb * Dk + col]) : gs;
            s[r][e] = s[r][e] * gc;
            s[r][e] = metal::fma(static_cast<float>(k[kb + col]), dl, s[r][e]);
          }
        }
      }
    }
""" + STORE_STATE)


@cache
def _kernels() -> tuple[object, object]:
    verify = mx.fast.metal_kernel(
        name="dflash_gdn_verify", input_names=VERIFY_INPUTS, output_names=VERIFY_OUTPUTS,
        source=VERIFY_SOURCE,
    )
    replay = mx.fast.metal_kernel(
        name="dflash_gdn_replay", input_names=REPLAY_INPUTS, output_names=REPLAY_OUTPUTS,
        source=REPLAY_SOURCE,
    )
    return verify, replay


def gated_delta_verify(
    q: mx.array, k: mx.array, v: mx.array, g: mx.array, beta: mx.array, state: mx.array
) -> tuple[mx.array, mx.array, Tape]:
    return run_verify(_kernels()[0], q, k, v, g, beta, state)


def tape_replay(state: mx.array, tape: Tape, keep: int) -> mx.array:
    return run_replay(_kernels()[1], state, tape, keep)

