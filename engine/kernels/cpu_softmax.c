/* Float32 softmax over the last axis, in place, bit for bit what MLX's x86 CPU backend computes
 * (mlx/backend/cpu/softmax.cpp with SIMD width 1, and simd::exp from simd/math.h), but with
 * the exponentials vectorized (AVX2 + FMA) and the rows split over threads.
 *
 * MLX per row: m = running max (NaN wins); e_j = exp(x_j - m) stored; s = ((0 + e_0) + e_1)
 * + ... in column order; y_j = e_j * (1 / s); its exp is mlx_exp_avx2.h's, bit for bit. Every
 * step here is the same IEEE operation on the same operands, so the bits are the same; only
 * the order of independent work differs. The sums stay sequential per row (eight rows
 * interleaved, one accumulator each). Compiled with -ffp-contract=off: no other fusing.
 * engine/kernels/cpu_softmax.py builds and loads it; tests/test_cpu_softmax.py checks it.
 */
#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define AVX __attribute__((target("avx2,fma")))
#define GROUP 8 /* rows whose sums run interleaved */

#include "mlx_exp_avx2.h"

/* Row max; NaN when the row holds one (MLX's max keeps a NaN once seen). */
AVX static float row_max(const float *x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_loadu_ps(x + j);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, v);
  }
  float lanes[8], best = -INFINITY;
  _mm256_storeu_ps(lanes, m);
  int any_nan = _mm256_movemask_ps(nan) != 0;
  for (int k = 0; k < 8; k++) best = lanes[k] > best ? lanes[k] : best;
  for (; j < n; j++) {
    any_nan |= isnan(x[j]);
    best = x[j] > best ? x[j] : best;
  }
  return any_nan ? NAN : best;
}

/* y[j] = exp(x[j] - m): x may be y. */
AVX static void row_exp(const float *x, float *y, int64_t n, float m) {
  __m256 vm = _mm256_set1_ps(m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(y + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm)));
  if (j < n) { /* the tail through the same code, padded */
    float pad[8] = {0};
    memcpy(pad, x + j, (size_t)(n - j) * sizeof(float));
    _mm256_storeu_ps(pad, exp8(_mm256_sub_ps(_mm256_loadu_ps(pad), vm)));
    memcpy(y + j, pad, (size_t)(n - j) * sizeof(float));
  }
}

AVX static void row_scale(float *y, int64_t n, float s) {
  __m256 vs = _mm256_set1_ps(s);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(y + j), vs));
  for (; j < n; j++) y[j] = y[j] * s;
}

/* Rows [r0, r1) of x (rows of n floats) into y. With qlen > 0 the rows are causal attention
 * scores (query row r % qlen at position offset + r % qlen): first y = where(key <= query,
 * x, -FLT_MAX), MLX's fallback's mask, written as those same values, then the softmax of y. */
AVX static void rows(const float *x, float *y, int64_t r0, int64_t r1, int64_t n, int64_t qlen,
                     int64_t offset) {
  for (int64_t r = r0; r < r1; r += GROUP) {
    int g = (int)(r1 - r < GROUP ? r1 - r : GROUP);
    float sum[GROUP] = {0};
    for (int k = 0; k < g; k++) {
      const float *in = x + (r + k) * n;
      float *out = y + (r + k) * n;
      if (qlen > 0) {
        int64_t keep = offset + (r + k) % qlen + 1;
        keep = keep < 0 ? 0 : keep > n ? n : keep;
        if (in != out) memcpy(out, in, (size_t)keep * sizeof(float));
        for (int64_t j = keep; j < n; j++) out[j] = -FLT_MAX;
        in = out;
      }
      row_exp(in, out, n, row_max(in, n));
    }
    const float *e = y + r * n;
    if (g == GROUP) {
      for (int64_t j = 0; j < n; j++)
        for (int k = 0; k < GROUP; k++) sum[k] = sum[k] + e[k * n + j];
    } else {
      for (int k = 0; k < g; k++)
        for (int64_t j = 0; j < n; j++) sum[k] = sum[k] + e[k * n + j];
    }
    for (int k = 0; k < g; k++) row_scale(y + (r + k) * n, n, 1.0f / sum[k]);
  }
}

struct job {
  const float *x;
  float *y;
  int64_t r0, r1, n, qlen, offset;
};

static void *run(void *arg) {
  struct job *j = arg;
  rows(j->x, j->y, j->r0, j->r1, j->n, j->qlen, j->offset);
  return NULL;
}

/* 1 when this CPU runs the kernel (AVX2 and FMA). */
int dflash_softmax_supported(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* Softmax of `nrows` rows of `n` floats from x into y (x == y is fine), causally masked when
 * qlen > 0 (see rows), on up to `threads` threads (contiguous blocks of whole row groups).
 * -> the number of threads used. */
int dflash_softmax(const float *x, float *y, int64_t nrows, int64_t n, int64_t qlen,
                   int64_t offset, int threads) {
  enum { MAX_THREADS = 16 };
  int64_t groups = (nrows + GROUP - 1) / GROUP;
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  if (threads > groups) threads = (int)groups;
  if (threads < 1) threads = 1;
  struct job jobs[MAX_THREADS];
  pthread_t ids[MAX_THREADS];
  int started = 0;
  for (int t = 0; t < threads; t++) {
    int64_t r0 = groups * t / threads * GROUP, r1 = groups * (t + 1) / threads * GROUP;
    jobs[t] = (struct job){x, y, r0, r1 < nrows ? r1 : nrows, n, qlen, offset};
  }
  for (int t = 1; t < threads; t++)
    if (pthread_create(&ids[t], NULL, run, &jobs[t]) == 0) started = t;
    else break;
  for (int t = started + 1; t < threads; t++) run(&jobs[t]); /* no thread: do it here */
  run(&jobs[0]);
  for (int t = 1; t <= started; t++) pthread_join(ids[t], NULL);
  return started + 1;
}
