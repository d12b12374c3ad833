/* y = x @ W.T in float32 for a few rows of x: the products of a verify forward on a CPU.
 *
 * x is [M, K] (M small: a verify block), W a Linear's weight [N, K] (row-major, as MLX stores
 * it), y [M, N]. A BLAS packs W into panels on every call, which for a handful of rows costs
 * more than the products; here each W row is read once, straight from memory, and meets
 * every row of x while it is in registers: the products are bound by memory, not packing.
 * Up to four weights that read the same x (q, k, v; gate, up) go in one call.
 *
 * The sums run in another order than a BLAS's, so results differ from MLX's matmul in the
 * last bits, as a BLAS's own 1-row and 16-row products already differ from each other.
 *
 * Threads: a pool started once (dflash_linear_init); the caller's thread takes the first
 * share. Between calls the workers spin a little (yielding the core) before they sleep, since
 * a forward's products come back to back with a little other work between them. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define MAX_PARTS 4
#define MAX_THREADS 16
#define SPIN_NS 2000000 /* how long an idle worker waits for the next call before sleeping */

typedef struct {
  const float *x;
  int64_t m, k;
  int parts;
  const float *w[MAX_PARTS];
  float *y[MAX_PARTS];
  int64_t n[MAX_PARTS];
  int64_t units[MAX_PARTS + 1]; /* prefix sums of each part's tiles */
  int avx512;
} task_t;

/* -- AVX-512: tiles of 4 W rows x 4 x rows ------------------------------------------------ */
#define RW512 4
#define RX 4

/* The 16 sums of a[r][j] (each over its 16 lanes) as one vector, lane 4 j + r: a tree of
 * 15 adds, where reducing each vector alone takes 64. */
__attribute__((target("avx512f"))) static inline __m512 reduce16(__m512 a[4][4]) {
  __m512 v[8], w[4], x[2];
  for (int i = 0; i < 8; i++) { /* halves: a[i/2][2(i%2)] and its neighbour, 8 partials each */
    __m512 p = a[i >> 1][2 * (i & 1)], q = a[i >> 1][2 * (i & 1) + 1];
    v[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(p, q, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 4; i++) /* one 128-bit chunk per sum, 4 partials each */
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; i++) /* 2 partials each */
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

__attribute__((target("avx512f"))) static void tile512(const float *x, const float *w,
                                                       float *y, int64_t m, int64_t k,
                                                       int64_t ldy, int64_t rows) {
  const int64_t kv = k & ~(int64_t)15;
  const __mmask16 tail = (__mmask16)((1u << (k - kv)) - 1);
  const int64_t next = RW512 * k; /* from a row to its row in the next tile */
  const float *wr[RW512];
  for (int r = 0; r < RW512; r++) wr[r] = w + (r < rows ? r : 0) * k;
  for (int64_t i = 0; i < m; i += RX) {
    const int64_t mi = m - i < RX ? m - i : RX;
    const float *xr[RX];
    for (int j = 0; j < RX; j++) xr[j] = x + (i + (j < mi ? j : 0)) * k;
    __m512 a[RW512][RX];
    for (int r = 0; r < RW512; r++)
      for (int j = 0; j < RX; j++) a[r][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < kv; c += 16) {
      __m512 v[RW512];
      if (i == 0) /* the next tile's rows, one line each, while these compute */
        for (int r = 0; r < RW512; r++) _mm_prefetch((const char *)(wr[r] + next + c), _MM_HINT_T0);
      for (int r = 0; r < RW512; r++) v[r] = _mm512_loadu_ps(wr[r] + c);
      for (int j = 0; j < RX; j++) {
        __m512 b = _mm512_loadu_ps(xr[j] + c);
        for (int r = 0; r < RW512; r++) a[r][j] = _mm512_fmadd_ps(v[r], b, a[r][j]);
      }
    }
    if (tail) {
      __m512 v[RW512];
      for (int r = 0; r < RW512; r++) v[r] = _mm512_maskz_loadu_ps(tail, wr[r] + kv);
      for (int j = 0; j < RX; j++) {
        __m512 b = _mm512_maskz_loadu_ps(tail, xr[j] + kv);
        for (int r = 0; r < RW512; r++) a[r][j] = _mm512_fmadd_ps(v[r], b, a[r][j]);
      }
    }
    float sums[16];
    _mm512_storeu_ps(sums, reduce16(a));
    for (int j = 0; j < mi; j++)
      for (int r = 0; r < rows; r++) y[(i + j) * ldy + r] = sums[4 * j + r];
  }
}

/* -- AVX2 + FMA: tiles of 3 W rows x 4 x rows (16 registers) ------------------------------ */
#define RW256 3

__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static void tile256(const float *x, const float *w,
                                                        float *y, int64_t m, int64_t k,
                                                        int64_t ldy, int64_t rows) {
  const int64_t kv = k & ~(int64_t)7;
  const int64_t next = RW256 * k;
  const float *wr[RW256];
  for (int r = 0; r < RW256; r++) wr[r] = w + (r < rows ? r : 0) * k;
  for (int64_t i = 0; i < m; i += RX) {
    const int64_t mi = m - i < RX ? m - i : RX;
    const float *xr[RX];
    for (int j = 0; j < RX; j++) xr[j] = x + (i + (j < mi ? j : 0)) * k;
    __m256 a[RW256][RX];
    for (int r = 0; r < RW256; r++)
      for (int j = 0; j < RX; j++) a[r][j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < kv; c += 8) {
      __m256 v[RW256];
      if (i == 0 && (c & 15) == 0) /* the next tile's rows, one line each */
        for (int r = 0; r < RW256; r++) _mm_prefetch((const char *)(wr[r] + next + c), _MM_HINT_T0);
      for (int r = 0; r < RW256; r++) v[r] = _mm256_loadu_ps(wr[r] + c);
      for (int j = 0; j < RX; j++) {
        __m256 b = _mm256_loadu_ps(xr[j] + c);
        for (int r = 0; r < RW256; r++) a[r][j] = _mm256_fmadd_ps(v[r], b, a[r][j]);
      }
    }
    for (int j = 0; j < mi; j++)
      for (int r = 0; r < rows; r++) {
        float s = hsum256(a[r][j]);
        for (int64_t c = kv; c < k; c++) s += wr[r][c] * xr[j][c];
        y[(i + j) * ldy + r] = s;
      }
  }
}

/* Tiles [u0, u1) of the task's parts, in order. */
static void run_units(const task_t *t, int64_t u0, int64_t u1) {
  const int64_t rw = t->avx512 ? RW512 : RW256;
  for (int p = 0; p < t->parts && u0 < u1; p++) {
    int64_t lo = t->units[p], hi = t->units[p + 1];
    int64_t a = u0 > lo ? u0 : lo, b = u1 < hi ? u1 : hi;
    for (int64_t u = a; u < b; u++) {
      int64_t n0 = (u - lo) * rw, rows = t->n[p] - n0 < rw ? t->n[p] - n0 : rw;
      if (t->avx512)
        tile512(t->x, t->w[p] + n0 * t->k, t->y[p] + n0, t->m, t->k, t->n[p], rows);
      else
        tile256(t->x, t->w[p] + n0 * t->k, t->y[p] + n0, t->m, t->k, t->n[p], rows);
    }
  }
}

/* -- the pool ------------------------------------------------------------------------------
 * Each thread has its share of a call's tiles. A worker claims its share when it wakes; the
 * caller does its own, then claims every share no worker has claimed yet, so a worker that
 * the OS has not run (on the caller's core, say) never holds the call up. */
static task_t task;
static int nthreads = 1;
static atomic_int generation;
static atomic_int claimed[MAX_THREADS], finished[MAX_THREADS];
static pthread_mutex_t caller = PTHREAD_MUTEX_INITIALIZER; /* one call at a time */
static pthread_mutex_t sleep_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;

static void share(int t) {
  int64_t total = task.units[task.parts];
  run_units(&task, total * t / nthreads, total * (t + 1) / nthreads);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

typedef struct {
  int index, seen;
} start_t;
static start_t starts[MAX_THREADS];

static void *worker(void *arg) {
  const int t = ((start_t *)arg)->index;
  int seen = ((start_t *)arg)->seen; /* the generation when it was started: none missed */
  for (;;) {
    int64_t since = now_ns();
    int g;
    while ((g = atomic_load_explicit(&generation, memory_order_acquire)) == seen) {
      if (now_ns() - since < SPIN_NS) {
        sched_yield();
        continue;
      }
      pthread_mutex_lock(&sleep_mu);
      while (atomic_load(&generation) == seen) pthread_cond_wait(&wake, &sleep_mu);
      pthread_mutex_unlock(&sleep_mu);
    }
    seen = g;
    if (atomic_exchange_explicit(&claimed[t], 1, memory_order_acq_rel) == 0) {
      share(t);
      atomic_store_explicit(&finished[t], 1, memory_order_release);
    }
  }
  return NULL;
}

/* 1 when this CPU runs the kernel: AVX-512F, or AVX2 and FMA. */
int dflash_linear_supported(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") ||
         (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
}

/* 1 when this CPU has the AVX-512 tiles. */
int dflash_linear_avx512(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

/* Starts the pool once (threads in all, the caller's included) -> the threads it has. */
int dflash_linear_init(int threads) {
  pthread_mutex_lock(&caller);
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  while (nthreads < threads) {
    pthread_t id;
    starts[nthreads] = (start_t){nthreads, atomic_load(&generation)};
    if (pthread_create(&id, NULL, worker, &starts[nthreads]) != 0) break;
    pthread_detach(id);
    nthreads++;
  }
  pthread_mutex_unlock(&caller);
  return nthreads;
}

/* ys[p] = x @ ws[p].T for p < parts: x [m, k], ws[p] [ns[p], k], ys[p] [m, ns[p]], every
 * array row-contiguous float32. use512: 1 for the AVX-512 tiles (where supported), 0 for
 * AVX2's. */
void dflash_linear(const float *x, int64_t m, int64_t k, int parts, const float *const *ws,
                   float *const *ys, const int64_t *ns, int use512) {
  pthread_mutex_lock(&caller);
  task.x = x, task.m = m, task.k = k, task.parts = parts;
  task.avx512 = use512 && __builtin_cpu_supports("avx512f");
  const int64_t rw = task.avx512 ? RW512 : RW256;
  task.units[0] = 0;
  for (int p = 0; p < parts; p++) {
    task.w[p] = ws[p], task.y[p] = ys[p], task.n[p] = ns[p];
    task.units[p + 1] = task.units[p] + (ns[p] + rw - 1) / rw;
  }
  if (nthreads > 1) {
    for (int t = 1; t < nthreads; t++) {
      atomic_store_explicit(&finished[t], 0, memory_order_relaxed);
      atomic_store_explicit(&claimed[t], 0, memory_order_release);
    }
    pthread_mutex_lock(&sleep_mu);
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&sleep_mu);
  }
  share(0);
  for (int t = 1; t < nthreads; t++) {
    if (atomic_exchange_explicit(&claimed[t], 1, memory_order_acq_rel) == 0) {
      share(t); /* not claimed yet: the caller does it */
      continue;
    }
    for (int spins = 0; !atomic_load_explicit(&finished[t], memory_order_acquire); spins++)
      if (spins < 4096)
        _mm_pause();
      else
        sched_yield(); /* a claimed share whose worker waits for a core */
  }
  pthread_mutex_unlock(&caller);
}
