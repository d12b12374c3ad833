/* out = silu(gate) * up for float32, bit for bit what MLX's CPU backend computes
 * (mlx-lm's compiled swiglu: `(g * sigmoid(g)) * u`), eight lanes at a time with AVX2+FMA.
 *
 * MLX's CPU sigmoid, per element: y = 1 / (1 + exp(|g|)); s = g < 0 ? y : 1 - y, where exp
 * is MLX's simd::exp (mlx_exp_avx2.h, bit for bit). On x86 MLX runs all of it one lane at a
 * time (libm calls).
 * NaNs keep MLX's bits too: x86 returns the first operand's NaN, and MLX's build (g++ -O3)
 * multiplies s * g, then gs * u; the blends below pin that choice.
 *
 * Built with -ffp-contract=off: every mul and add below must round on its own as MLX's do;
 * only the explicit _mm256_fmadd_ps fuse (MLX calls std::fma there). engine/kernels/
 * cpu_swiglu.py builds and loads it; tests/test_cpu_swiglu.py checks it.
 */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define AVX __attribute__((target("avx2,fma")))

#include "mlx_exp_avx2.h"

AVX static inline __attribute__((always_inline)) __m256 swiglu8(__m256 g, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
  __m256 e = exp8(a); /* |g| is never below -88: only exp's NaN and > 88 cases apply */
  __m256 y = _mm256_div_ps(one, _mm256_add_ps(one, e));
  __m256 s = _mm256_blendv_ps(_mm256_sub_ps(one, y), y,
                              _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ));
  __m256 gs = _mm256_blendv_ps(_mm256_mul_ps(g, s), s, _mm256_cmp_ps(g, g, _CMP_UNORD_Q));
  return _mm256_blendv_ps(_mm256_mul_ps(gs, u), gs, _mm256_cmp_ps(gs, gs, _CMP_UNORD_Q));
}

/* out[i] = silu(gate[i]) * up[i] for i in [0, n); out may alias gate or up. The last n % 8
 * go through the same vector code, padded: one code path for every element. */
AVX void dflash_swiglu_f32(const float *gate, const float *up, float *out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    float g[8] = {0}, u[8] = {0}, o[8];
    memcpy(g, gate + i, (n - i) * sizeof(float));
    memcpy(u, up + i, (n - i) * sizeof(float));
    _mm256_storeu_ps(o, swiglu8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
    memcpy(out + i, o, (n - i) * sizeof(float));
  }
}

int dflash_swiglu_supported(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
