/* MLX's float32 exp on x86 (simd::exp in mlx/backend/cpu/simd/math.h, SIMD width 1), eight
 * lanes at a time with AVX2 + FMA, bit for bit: t = x * 1.442695f; n = floor(t + 0.5) in
 * double; f = t - n; a Cephes polynomial in f by six fmas; times 2^n built from bits; NaN
 * passes through, x > 88 gives inf, x < -88 gives 0. Every step is the same IEEE operation
 * on the same operands (fma is fused on both sides), so the bits are the same. Shared by
 * cpu_softmax.c and cpu_swiglu.c; compile them with -ffp-contract=off. */
#ifndef DFLASH_MLX_EXP_AVX2_H
#define DFLASH_MLX_EXP_AVX2_H
#include <immintrin.h>
#include <math.h>

#ifndef AVX
#define AVX __attribute__((target("avx2,fma")))
#endif

AVX static inline __attribute__((always_inline)) __m256 exp8(__m256 x) {
  __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.442695f));
  /* floor(t + 0.5) as MLX computes it (in double, so exactly): round to nearest even, then
   * lift the ties that went down (t - r is exact here). */
  __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 tie = _mm256_cmp_ps(_mm256_sub_ps(t, r), _mm256_set1_ps(0.5f), _CMP_EQ_OQ);
  r = _mm256_add_ps(r, _mm256_and_ps(tie, _mm256_set1_ps(1.0f)));
  __m256 f = _mm256_sub_ps(t, r);
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  __m256i n = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(r), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(_mm256_castsi256_ps(n), p);
  y = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY),
                       _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, _mm256_setzero_ps(),
                          _mm256_cmp_ps(x, _mm256_set1_ps(-88.0f), _CMP_LT_OQ));
}

#endif
