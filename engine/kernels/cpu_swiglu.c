/* out = silu(gate) * up for float32, bit for bit what MLX's CPU backend computes
 * (mlx-lm's compiled swiglu: `(g * sigmoid(g)) * u`), eight lanes at a time with AVX2+FMA.
 *
 * MLX's CPU sigmoid, per element: y = 1 / (1 + exp(|g|)); s = g < 0 ? y : 1 - y, where exp
 * is its Cephes-style polynomial (mlx/backend/cpu/simd/math.h): x = a * log2(e);
 * n = floor(x + 0.5) (the + 0.5 in double: a float round-half-up of x); f = x - n; a degree-6
 * polynomial in f by six correctly rounded fmas; times 2^n built from the exponent bits; NaN
 * passes through, a > 88 gives inf. On x86 MLX runs all of it one lane at a time (libm calls).
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

static const float P[7] = {1.535336188319500e-4f, 1.339887440266574e-3f,
                           9.618437357674640e-3f, 5.550332471162809e-2f,
                           2.402264791363012e-1f, 6.931472028550421e-1f, 1.0f};

AVX static inline __attribute__((always_inline)) __m256 swiglu8(__m256 g, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
  __m256 x = _mm256_mul_ps(a, _mm256_set1_ps(1.442695f));
  /* floor(x + 0.5) with the add exact (MLX adds in double): floor(x), plus one where the
   * exact fraction x - floor(x) (no rounding below 2^23) is at least a half. */
  __m256 fl = _mm256_floor_ps(x);
  __m256 up = _mm256_cmp_ps(_mm256_sub_ps(x, fl), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  __m256 n = _mm256_add_ps(fl, _mm256_and_ps(up, one));
  __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(P[0]);
  for (int i = 1; i < 7; i++) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(P[i]));
  __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 e = _mm256_mul_ps(_mm256_castsi256_ps(bits), p);
  e = _mm256_blendv_ps(e, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY),
                       _mm256_cmp_ps(a, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
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
