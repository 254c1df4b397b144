/* BF16 linear with a fused epilogue on x86 (AVX512_BF16):
 *
 *   out[m, n] = bf16(act(sum_k x[m, k] w[n, k] + bias[n]))     x, w, bias, out: bfloat16
 *
 * with the products accumulated in float32 and act = none, ReLU or GELU (erf, tanh), the result
 * rounded to bfloat16 once (nearest even), as oneDNN's BF16 matmul with a post-op does. NaN and
 * infinities propagate as in eager torch: ReLU is max(0, y), which keeps NaN (vmaxps returns its
 * second operand where one is NaN), GELU (gelu_avx512.h) is NaN for NaN and -inf, +inf for
 * +inf, and exactly 0 below y = -5.29 (torch's eager erf GELU gives NaN for +inf; Inductor's
 * +inf, as here). A pdlkit C ABI 1.2 library (pdlkit_register at the end): the kernels
 * linear / linear_relu / linear_gelu on the AVX512_BF16 path and on AMX tiles, one packed
 * weight (the prepack hook) for both; kernels/x86/linear_bf16.py builds and loads it.
 *
 * GEMM. vdpbf16ps multiplies pairs of bf16 and adds both products to one float32 lane. The
 * weight is packed once (gbf16_pack, the prepack hook) into panels of 64 columns, K in pairs:
 * panel[q][c][i] = w[n0 + c, 2q + i], zero padded, so each pair of k is four 64-byte loads.
 * The micro-kernel keeps a 6 x 64 float32 tile in 24 zmm registers, broadcasts one pair of x
 * per row and issues 24 vdpbf16ps per 10 loads; the tile then goes through the epilogue in
 * registers (bias, activation, conversion) and is stored as bf16. Panels outside, 6-row
 * blocks inside, full K per tile; built with -fopenmp, GEMMs of 2^20 multiply-adds or more
 * share their tiles over torch's OpenMP threads. Same structure as qgemm_vnni.c's int8 GEMM.
 *
 * Measured on one Zen 4 core (benchmarks/x86_qlinear.py): 200-224 GFLOP/s on the bert-mini and
 * BERT-base shapes (single-core limit about 214), 0.82-0.95x oneDNN's BF16 matmul time.
 *
 * AMX (qgemm_amx.h's tiles, qgemm_amx_gemm.h's engine, both shared with the int8 kernels of
 * qgemm_vnni.c): where the pre-pack asks for it (GB_AMX), K is a multiple of 32 and the host
 * grants the tile state, the engine runs the call as the int8 one does: tasks of 32 rows x a
 * group of panels kept in L2, K in chunks of 384 (768 bytes a row, the rows' chunk in L1), each
 * task as a stream of 32 x 32 halves of TDPBF16PS tiles reading the same packed panels (VNNI-2:
 * 64 columns x 2 bf16 per pair of k, the B tile's layout), each half's epilogue (amx_epi_rows:
 * tile_out's instructions) run between the next half's K steps; the rows past the last block
 * of 32, and every other call, run the AVX512_BF16 micro-kernel. Before (up to 88b666c) this
 * file had its own blocking with the same groups and chunks but 32 x 64 blocks and tile_out
 * after each, the tile unit idle meanwhile: 1.1-1.95x oneDNN's BF16 matmul time on a Xeon
 * (benchmarks/results/x86_amx.md) where the int8 engine with the overlap reached 0.5-0.9x
 * oneDNN's qlinear. The float32 sums are the same either way (same instructions in the same
 * K order; a chunk's round trip through memory is exact), so are the outputs.
 *
 * Portability: the compute functions carry target("avx512f,avx512bw,avx512vl,avx512bf16")
 * attributes and run only where __builtin_cpu_supports says so; elsewhere run() declines
 * (PDLKIT_UNSUPPORTED). gbf16_run_scalar is the plain C reference the tests compare with: a
 * build with -DPDLKIT_SCALAR_REFERENCE registers the same kernels running it.
 *
 * Build (what pdlkit.runtime_abi.native_build.build_library(path, "x86_64", extra=("-fopenmp",))
 * runs; without -fopenmp the same source builds single-threaded):
 *   cc -O3 -fopenmp -shared -fPIC -Wall -I runtime_abi/include kernels/x86/gemm_bf16.c -lm \
 *      -o libpdlkit_gemm_bf16.so
 */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PDLKIT_X86 1
#else
#define PDLKIT_X86 0
#endif

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

#include "x86_abi.h" /* pdlkit_abi.h and helpers */
#include "gelu_avx512.h"
#include "qgemm_amx.h" /* the AMX tile path (TDPBF16PS): permission, configuration, 32 x 64 blocks */

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU_ERF = 2, ACT_GELU_TANH = 3 };
enum { NR = 64, MR = 6 };
/* GEMMs smaller than this run on the calling thread: a parallel region costs a few us */
#define PARALLEL_MIN_MACS ((int64_t)1 << 20)

typedef struct {
    int64_t n;              /* output columns (weight rows) */
    int64_t k;              /* reduction length */
    const uint16_t *packed; /* the weight, gbf16_pack's layout */
    int32_t act;            /* ACT_* */
    int32_t flags;          /* GB_AMX: AMX tiles where the call allows (gbf16_uses_amx) */
} pdlkit_gbf16_params;

enum { GB_AMX = 1 };


/* Bytes of the packed weight: ceil(N / 64) panels of ceil(K / 2) pairs of 64 x 2 bf16. */
static int64_t gbf16_packed_size(int64_t n, int64_t k) {
    return ((n + NR - 1) / NR) * ((k + 1) / 2) * NR * 2 * 2;
}

/* out = w [n, k] (bf16, rows ldw elements apart) in panels. */
static void gbf16_pack(const uint16_t *w, int64_t ldw, int64_t n, int64_t k, uint16_t *out) {
    const int64_t k2 = (k + 1) / 2, panels = (n + NR - 1) / NR;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t q = 0; q < k2; q++)
            for (int64_t c = 0; c < NR; c++)
                for (int64_t i = 0; i < 2; i++) {
                    const int64_t row = p * NR + c, col = 2 * q + i;
                    out[((p * k2 + q) * NR + c) * 2 + i] =
                        (row < n && col < k) ? w[row * ldw + col] : 0;
                }
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round to nearest even, as torch converts; NaN stays a (quiet) NaN */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float act_scalar(float y, int act) {
    switch (act) {
    case ACT_RELU: return y < 0.0f ? 0.0f : y; /* NaN stays NaN, as torch.relu */
    case ACT_GELU_ERF: return gelu_erf_scalar(y);
    case ACT_GELU_TANH: return gelu_tanh_scalar(y);
    default: return y;
    }
}

#if PDLKIT_X86
#define BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* the bare instruction, as in qgemm_vnni.c: the accumulators stay in registers */
#define DPBF16(c, a, b) __asm__("vdpbf16ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b))

static inline int32_t pair_tail(const uint16_t *x) {
    return (int32_t)x[0]; /* k odd: the second bf16 meets the packed weight's zero padding */
}

#define ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
#define STEP(r)                                        \
    if (ROWS > r) {                                    \
        const __m512i av = _mm512_set1_epi32(PAIR(r)); \
        DPBF16(c##r##0, av, b0);                       \
        DPBF16(c##r##1, av, b1);                       \
        DPBF16(c##r##2, av, b2);                       \
        DPBF16(c##r##3, av, b3);                       \
    }
#define SAVE(r)                                    \
    if (ROWS > r) {                                \
        _mm512_store_ps(acc + r * NR, c##r##0);    \
        _mm512_store_ps(acc + r * NR + 16, c##r##1); \
        _mm512_store_ps(acc + r * NR + 32, c##r##2); \
        _mm512_store_ps(acc + r * NR + 48, c##r##3); \
    }
#define LOAD_B                                                                                   \
    const uint16_t *g = panel + q * NR;                                                          \
    const __m512i b0 = _mm512_loadu_si512(g), b1 = _mm512_loadu_si512(g + 32);                   \
    const __m512i b2 = _mm512_loadu_si512(g + 64), b3 = _mm512_loadu_si512(g + 96);
/* q counts bf16 elements of k (steps of 2); the panel holds 64 x 2 bf16 per pair */
#define KLOOP(R)                                                                               \
    BF16 __attribute__((noinline)) static void kloop##R(const uint16_t *x, int64_t ldx, int64_t k, \
                                                        const uint16_t *panel, float *acc) {    \
        enum { ROWS = R };                                                                     \
        ROWS6(DECL)                                                                            \
        int64_t q = 0;                                                                         \
        for (; q + 2 <= k; q += 2) {                                                           \
            LOAD_B                                                                             \
            ROWS6(STEP)                                                                        \
        }                                                                                      \
        if (q < k) {                                                                           \
            LOAD_B                                                                             \
            ROWS6(STEP_TAIL)                                                                   \
        }                                                                                      \
        ROWS6(SAVE)                                                                            \
    }
#define PAIR(r) (*(const int32_t *)(x + (r) * ldx + q))
#define STEP_TAIL(r)                                                     \
    if (ROWS > r) {                                                      \
        const __m512i av = _mm512_set1_epi32(pair_tail(x + (r) * ldx + q)); \
        DPBF16(c##r##0, av, b0);                                         \
        DPBF16(c##r##1, av, b1);                                         \
        DPBF16(c##r##2, av, b2);                                         \
        DPBF16(c##r##3, av, b3);                                         \
    }
KLOOP(1)
KLOOP(2)
KLOOP(3)
KLOOP(4)
KLOOP(5)
KLOOP(6)
#undef PAIR

/* mr rows x nc columns of bf16 output from the tile; act is a constant after inlining.
 * B = bias * cs per column, cs = GELU_VSCALE for GELU (the table's variable), else 1. */
BF16 static inline __attribute__((always_inline)) void tile_out(
    const float *acc, int mr, int64_t nc, const float *B, float cs, int64_t n0, uint16_t *out,
    int64_t ldo, int act) {
    const float(*tab)[16] = gelu_tab[act == ACT_GELU_TANH];
    const __m512 csv = _mm512_set1_ps(cs), hk = _mm512_set1_ps(0.5f / (float)GELU_VSCALE);
    for (int j = 0; j < NR / 16; j++) {
        const int64_t left = nc - 16 * j;
        if (left <= 0) break;
        const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        const int64_t col = n0 + 16 * j;
        const __m512 b = _mm512_maskz_loadu_ps(m, B + col);
        for (int r = 0; r < mr; r++) {
            __m512 y = _mm512_fmadd_ps(_mm512_load_ps(acc + r * NR + 16 * j), csv, b);
            /* max(0, y): vmaxps returns its second operand where one is NaN: NaN stays NaN */
            if (act == ACT_RELU) y = _mm512_max_ps(_mm512_setzero_ps(), y);
            if (act == ACT_GELU_ERF || act == ACT_GELU_TANH) y = gelu16(y, hk, tab);
            _mm256_mask_storeu_epi16(out + r * ldo + col, m, (__m256i)_mm512_cvtneps_pbh(y));
        }
    }
}

/* The micro-kernel for a block of mr = 1..6 rows. */
BF16 static inline void kloop(int mr, const uint16_t *xi, int64_t ldx, int64_t k,
                              const uint16_t *panel, float *acc) {
    switch (mr) {
    case 6: kloop6(xi, ldx, k, panel, acc); break;
    case 5: kloop5(xi, ldx, k, panel, acc); break;
    case 4: kloop4(xi, ldx, k, panel, acc); break;
    case 3: kloop3(xi, ldx, k, panel, acc); break;
    case 2: kloop2(xi, ldx, k, panel, acc); break;
    default: kloop1(xi, ldx, k, panel, acc); break;
    }
}

/* Tile t of a GEMM: (panel t / blocks, row block t % blocks), as in qgemm_vnni.c. */
BF16 static inline __attribute__((always_inline)) void gemm_tile(
    int64_t t, int64_t blocks, const uint16_t *x, int64_t m, int64_t ldx, uint16_t *out,
    int64_t ldo, const pdlkit_gbf16_params *p, const float *B, float cs, int act) {
    float acc[MR * NR] __attribute__((aligned(64)));
    const int64_t n = p->n, k = p->k, k2 = (k + 1) / 2;
    const int64_t n0 = (t / blocks) * NR, i = (t % blocks) * MR;
    const uint16_t *panel = p->packed + (n0 / NR) * k2 * NR * 2;
    const int64_t nc = n - n0 < NR ? n - n0 : NR;
    const int mr = m - i < MR ? (int)(m - i) : MR;
    kloop(mr, x + i * ldx, ldx, k, panel, acc);
    tile_out(acc, mr, nc, B, cs, n0, out + i * ldo, ldo, act);
}

/* One function per activation, each with its own parallel loop over the tiles (shared over
 * torch's OpenMP threads where built with -fopenmp): GCC outlines an OpenMP region before it
 * inlines, so only a region whose body passes act as a literal gets a specialised epilogue
 * (see qgemm_vnni.c's GEMM_VARIANT). */
#if defined(_OPENMP)
#define OMP_TILES _Pragma("omp parallel for schedule(static) if (m * p->n * p->k >= PARALLEL_MIN_MACS)")
#else
#define OMP_TILES
#endif
#define GEMM_VARIANT(ACT)                                                                        \
    BF16 static void gemm_##ACT(const uint16_t *x, int64_t m, int64_t ldx, uint16_t *out,         \
                                int64_t ldo, const pdlkit_gbf16_params *p, const float *B,        \
                                float cs) {                                                       \
        const int64_t blocks = (m + MR - 1) / MR, tiles = ((p->n + NR - 1) / NR) * blocks;        \
        OMP_TILES                                                                                 \
        for (int64_t t = 0; t < tiles; t++) gemm_tile(t, blocks, x, m, ldx, out, ldo, p, B, cs, ACT); \
    }
/* What the AMX engine (qgemm_amx_gemm.h, shared with qgemm_vnni.c's int8 kernels) asks of this
 * family: where the epilogue writes and with what (amx_dst), a pending half's rows through the
 * epilogue (amx_epi_rows), the rows past the last whole block of AMX_MR through the AVX512_BF16
 * micro-kernel (amx_tail_rows). */

/* out (bf16, rows ldo elements apart, row 0 of the call); B = bias * cs per column (tile_out's);
 * p, x, ldx (elements): the call, for the tail rows. */
typedef struct {
    const float *B;
    float cs;
    uint16_t *out;
    int64_t ldo;
    const pdlkit_gbf16_params *p;
    const uint16_t *x;
    int64_t ldx;
} amx_dst;

/* Rows r0 .. r1 - 1 of a pending 32 x 32 half of float32 sums through tile_out's epilogue, the
 * same instructions in the same order (fmadd with cs and B, ReLU or GELU, one rounding to bf16),
 * so the results are those of tile_out on the same sums; act: a constant after inlining. With
 * the engine's pipelining this runs on the vector units between the next half's K steps (before,
 * gemm_bf16.c ran tile_out after each 32 x 64 block with the tile unit idle: at K = 256 a GELU
 * epilogue of 64 vectors x ~30 instructions is about as long as the half's 8 K steps of tiles). */
BF16 static inline __attribute__((always_inline)) void amx_epi_rows(const amx_pend *pd, int r0,
                                                                   int r1, const amx_dst *d,
                                                                   int act, int kind) {
    (void)kind;
    const float *acc = (const float *)pd->acc;
    const float(*tab)[16] = gelu_tab[act == ACT_GELU_TANH];
    const __m512 csv = _mm512_set1_ps(d->cs), hk = _mm512_set1_ps(0.5f / (float)GELU_VSCALE);
    const int halves = pd->nc > 16 ? 2 : 1; /* a second vector of only masked lanes: skipped */
    __m512 b[2];
    __mmask16 mk[2];
    for (int j = 0; j < 2; j++) {
        const int64_t left = pd->nc - 16 * j;
        mk[j] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        b[j] = _mm512_maskz_loadu_ps(mk[j], d->B + pd->col + 16 * j);
    }
    for (int r = r0; r < r1; r++) {
        uint16_t *o = d->out + (pd->row + r) * d->ldo + pd->col;
        for (int j = 0; j < halves; j++) {
            __m512 y = _mm512_fmadd_ps(_mm512_load_ps(acc + r * NR + 16 * j), csv, b[j]);
            /* max(0, y): vmaxps returns its second operand where one is NaN: NaN stays NaN */
            if (act == ACT_RELU) y = _mm512_max_ps(_mm512_setzero_ps(), y);
            if (act == ACT_GELU_ERF || act == ACT_GELU_TANH) y = gelu16(y, hk, tab);
            _mm256_mask_storeu_epi16(o + 16 * j, mk[j], (__m256i)_mm512_cvtneps_pbh(y));
        }
    }
}

/* Rows i .. i + rows - 1 (fewer than AMX_MR: the last of a call) of panel column n0 through the
 * AVX512_BF16 micro-kernel, MR at a time, and tile_out (acc: MR x NR floats of scratch). */
BF16 static inline __attribute__((always_inline)) void amx_tail_rows(
    void *acc, const amx_gemm_t *g, const amx_dst *d, int64_t i, int64_t rows, int64_t n0,
    int act, int kind) {
    (void)g, (void)kind;
    const pdlkit_gbf16_params *p = d->p;
    const int64_t k2 = (p->k + 1) / 2, nc = p->n - n0 < NR ? p->n - n0 : NR;
    for (int64_t r = i; r < i + rows; r += MR) {
        const int mr = i + rows - r < MR ? (int)(i + rows - r) : MR;
        kloop(mr, d->x + r * d->ldx, d->ldx, p->k, p->packed + (n0 / NR) * k2 * NR * 2, (float *)acc);
        tile_out((float *)acc, mr, nc, d->B, d->cs, n0, d->out + r * d->ldo, d->ldo, act);
    }
}

#include "qgemm_amx_gemm.h" /* the AMX engine: amx_range, AMX_PARALLEL */

/* The AMX variant per activation: the engine with TDPBF16PS over the same packed panels (K in
 * groups of 4 bytes = pairs of bf16: k4 = K / 2; the rows of x 2 ldx bytes apart). */
#define AMX_VARIANT(ACT)                                                                         \
    AMX static void amx_##ACT(const uint16_t *x, int64_t m, int64_t ldx, uint16_t *out,           \
                              int64_t ldo, const pdlkit_gbf16_params *p, const float *B,          \
                              float cs) {                                                         \
        const amx_gemm_t g = {(const char *)x, m, 2 * ldx, (const char *)p->packed, p->n,         \
                              (p->k + 1) / 2};                                                    \
        const amx_dst d = {B, cs, out, ldo, p, x, ldx};                                           \
        AMX_PARALLEL(&g, &d, m * p->n * p->k >= PARALLEL_MIN_MACS, AMX_DP_BF16, ACT, 0);          \
    }
GEMM_VARIANT(ACT_NONE)
GEMM_VARIANT(ACT_RELU)
GEMM_VARIANT(ACT_GELU_ERF)
GEMM_VARIANT(ACT_GELU_TANH)
AMX_VARIANT(ACT_NONE)
AMX_VARIANT(ACT_RELU)
AMX_VARIANT(ACT_GELU_ERF)
AMX_VARIANT(ACT_GELU_TANH)

typedef void (*gemm_fn)(const uint16_t *, int64_t, int64_t, uint16_t *, int64_t,
                        const pdlkit_gbf16_params *, const float *, float);
static const gemm_fn GEMMS[2][4] = {
    {gemm_ACT_NONE, gemm_ACT_RELU, gemm_ACT_GELU_ERF, gemm_ACT_GELU_TANH},
    {amx_ACT_NONE, amx_ACT_RELU, amx_ACT_GELU_ERF, amx_ACT_GELU_TANH}}; /* [amx][act] */

static int has_bf16(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
    }
    return cached;
}
#else
static int has_bf16(void) { return 0; }
#endif

/* ---------------------------------------------------------------- entry points */

/* Whether a call of m rows with these params runs on AMX tiles: asked for (GB_AMX), K a
 * multiple of 32, at least one block of AMX_MR rows, and this process may use the AMX-BF16
 * tiles (qgemm_amx.h's amx_ready_for). Otherwise the AVX512_BF16 path runs. */
static int gbf16_uses_amx(const pdlkit_gbf16_params *p, int64_t m) {
    return (p->flags & GB_AMX) && p->k % 32 == 0 && m >= AMX_MR && amx_ready_for(1);
}

/* Builds the GELU tables (call once before using the library from several threads);
 * returns 1 when the AVX512_BF16 path runs on this CPU, 0 otherwise. */
static int gbf16_init(void) {
#if PDLKIT_X86
    gelu_tables_init();
#endif
    return has_bf16();
}

/* out[m, n] (bf16, rows ldo elements apart) from x [m, k] (bf16, rows ldx elements apart, each
 * row contiguous); bias: bf16 [n] or NULL. Returns 0; 1 where this CPU lacks AVX512_BF16;
 * -1 when out of memory. */
__attribute__((unused)) static int gbf16_run(const uint16_t *x, int64_t m, int64_t ldx, uint16_t *out,
                                            int64_t ldo, const uint16_t *bias, const pdlkit_gbf16_params *p) {
#if PDLKIT_X86
    if (!has_bf16()) return 1;
    if (m <= 0 || p->n <= 0) return 0;
    const int gelu = p->act == ACT_GELU_ERF || p->act == ACT_GELU_TANH;
    const float cs = gelu ? (float)GELU_VSCALE : 1.0f;
    float local[4096];
    float *B = p->n <= 4096 ? local : (float *)malloc(sizeof(float) * (size_t)p->n);
    if (!B) return -1;
    for (int64_t j = 0; j < p->n; j++) B[j] = bias ? bf16_to_f32(bias[j]) * cs : 0.0f;
    if (gelu && !gelu_ready) gelu_tables_init();
    GEMMS[gbf16_uses_amx(p, m)][(uint32_t)p->act <= ACT_GELU_TANH ? p->act : 0](x, m, ldx, out,
                                                                                   ldo, p, B, cs);
    if (B != local) free(B);
    return 0;
#else
    (void)x, (void)m, (void)ldx, (void)out, (void)ldo, (void)bias, (void)p;
    return 1;
#endif
}

/* The same in plain C, from the packed weight (what the tests compare the AVX-512 path with). */
__attribute__((unused)) static int gbf16_run_scalar(const uint16_t *x, int64_t m, int64_t ldx,
                                                   uint16_t *out, int64_t ldo, const uint16_t *bias,
                                                   const pdlkit_gbf16_params *p) {
    const int64_t k2 = (p->k + 1) / 2;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < p->n; j++) {
            float s = 0.0f;
            for (int64_t t = 0; t < p->k; t++) {
                const uint16_t w = p->packed[(((j / NR) * k2 + t / 2) * NR + j % NR) * 2 + t % 2];
                s += bf16_to_f32(x[i * ldx + t]) * bf16_to_f32(w);
            }
            out[i * ldo + j] = f32_to_bf16(act_scalar(s + (bias ? bf16_to_f32(bias[j]) : 0.0f), p->act));
        }
    return 0;
}

/* ---------------------------------------------------------------- the pdlkit contract */

#define GB_MAGIC 0x36314247u /* "GB16" */
#if defined(PDLKIT_SCALAR_REFERENCE) /* tests: the same kernels on the plain C path */
#define GB_RUN gbf16_run_scalar
#else
#define GB_RUN gbf16_run
#endif

/* The weight [N, K] in gbf16_pack's panels after the 64-byte header (which notes the engine). */
static int32_t gb_prepack(pdlkit_prepack_frame *f, uint32_t flags) {
    const DLTensor *w = f->weight;
    if (!pdlkit_dtype_is(w->dtype, kDLBfloat, 16) || w->ndim != 2 || !pdlkit_is_contiguous(w))
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "weight must be a contiguous [N, K] bfloat16 tensor");
    const int64_t n = w->shape[0], k = w->shape[1];
    if (k == 0) return X86_ERR(f, PDLKIT_UNSUPPORTED, "K = 0");
    int32_t st;
    x86_pack_header *h = x86_pack_begin(f, GB_MAGIC, flags, n, k,
                                        sizeof(x86_pack_header) + (size_t)gbf16_packed_size(n, k), &st);
    if (h != NULL) gbf16_pack((const uint16_t *)x86_data(w), k, n, k, (uint16_t *)(h + 1));
    return st;
}

static int32_t gb_meta(const pdlkit_meta_frame *f) {
    if (f->num_inputs != 3) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "expects x, weight, bias");
    return x86_linear_meta(f, 1, f->inputs[0].dtype);
}

/* act: ACT_*, or -1 for GELU with the `approximate` attribute. */
static int32_t gb_run(const pdlkit_call_frame *f, int act) {
    if (f->num_inputs != 3 || f->num_outputs != 1)
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "expects x, weight, bias and one output");
    const DLTensor *x = &f->inputs[0], *b = &f->inputs[2];
    const x86_pack_header *h = x86_packed(&f->inputs[1], GB_MAGIC);
    if (h == NULL) return X86_ERR(f, PDLKIT_UNSUPPORTED, "weight was not packed by gemm_bf16.c");
    if (!pdlkit_dtype_is(x->dtype, kDLBfloat, 16) || x->ndim < 1 || x->shape[x->ndim - 1] != h->k)
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "x must be bfloat16 [..., %lld]", (long long)h->k);
    if (!pdlkit_is_none(b) && !x86_vector(b, h->n, kDLBfloat, 16))
        return X86_ERR(f, PDLKIT_UNSUPPORTED, "bias must be %lld contiguous bfloat16 values", (long long)h->n);
    if (act < 0) {
        const pdlkit_attribute *a = x86_attr(f->attrs, f->num_attrs, "approximate", PDLKIT_KIND_STRING);
        act = a != NULL ? x86_act("gelu", a) : -1;
        if (act < 0) return X86_ERR(f, PDLKIT_UNSUPPORTED, "approximate must be 'none' or 'tanh'");
    }
    int64_t m, ldx;
    void *copy = NULL; /* x compacted, where no row stride describes it (a transposed view) */
    if (x86_rows(x, &m, &ldx) != 0 && (copy = x86_compact(x, 2)) == NULL)
        return X86_ERR(f, PDLKIT_UNSUPPORTED, "no memory for a copy of x");
    const pdlkit_gbf16_params p = {h->n, h->k, (const uint16_t *)(h + 1), act, (int32_t)h->flags};
    const int rc = GB_RUN(copy ? (const uint16_t *)copy : (const uint16_t *)x86_data(x), m, ldx,
                          (uint16_t *)x86_data(&f->outputs[0]), h->n,
                          pdlkit_is_none(b) ? NULL : (const uint16_t *)x86_data(b), &p);
    free(copy);
    if (rc == 1) return X86_ERR(f, PDLKIT_UNSUPPORTED, "this CPU has no AVX512_BF16");
    if (rc != 0) return X86_ERR(f, PDLKIT_UNSUPPORTED, "no memory for the epilogue's bias vector");
    return PDLKIT_OK;
}

static int32_t gb_prepack_vnni(pdlkit_prepack_frame *f) { return gb_prepack(f, 0); }
static int32_t gb_prepack_amx(pdlkit_prepack_frame *f) { return gb_prepack(f, GB_AMX); }
static int32_t gb_run_none(const pdlkit_call_frame *f) { return gb_run(f, ACT_NONE); }
static int32_t gb_run_relu(const pdlkit_call_frame *f) { return gb_run(f, ACT_RELU); }
static int32_t gb_run_gelu(const pdlkit_call_frame *f) { return gb_run(f, -1); }

static const DLDataType kBF16[] = {{kDLBfloat, 16, 1}};
static const int32_t kRank2[] = {2};
#define GB_TENSOR(name, ranks, nranks, optional)                                                  \
    {sizeof(pdlkit_arg_desc), name, PDLKIT_KIND_TENSOR, kBF16, 1, ranks, nranks, NULL, NULL, 0, 0, 0, optional}
static const pdlkit_arg_desc kLinearArgs[] = {
    GB_TENSOR("x", NULL, 0, 0), GB_TENSOR("weight", kRank2, 1, 0), GB_TENSOR("bias", NULL, 0, 1),
    {sizeof(pdlkit_arg_desc), "approximate", PDLKIT_KIND_STRING, NULL, 0, NULL, 0, NULL, NULL, 0, 0, 0, 0},
};
static const char *const kIsa[] = {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"};

/* name, op, arguments (3, or 4 with approximate), run, engine (0 AVX512_BF16, 1 AMX), doc */
#define GB_DESC(name, op, nargs, run, amx, doc)                                                    \
    {sizeof(pdlkit_kernel_desc), name, 1, op, kDLCPU, amx ? 20 : 10, kLinearArgs, nargs, kIsa,     \
     amx ? 4 : 2, 0, PDLKIT_TRAIT_DETERMINISTIC, 1, gb_meta, run, doc, "weight",                   \
     amx ? gb_prepack_amx : gb_prepack_vnni, NULL, 0}
#define GB_DOC " in bf16 (float32 accumulation, one rounding), one fused GEMM on "
static const pdlkit_kernel_desc kDescs[] = {
    GB_DESC("linear_bf16", "linear", 3, gb_run_none, 0, "x @ weight.T + bias" GB_DOC "AVX512_BF16."),
    GB_DESC("linear_relu_bf16", "linear_relu", 3, gb_run_relu, 0, "relu(x @ weight.T + bias)" GB_DOC "AVX512_BF16."),
    GB_DESC("linear_gelu_bf16", "linear_gelu", 4, gb_run_gelu, 0,
            "gelu(x @ weight.T + bias, approximate)" GB_DOC "AVX512_BF16."),
    GB_DESC("linear_bf16_amx", "linear", 3, gb_run_none, 1,
            "x @ weight.T + bias" GB_DOC "AMX-BF16 tiles (K % 32 == 0, 32 rows or more; else AVX512_BF16)."),
    GB_DESC("linear_relu_bf16_amx", "linear_relu", 3, gb_run_relu, 1,
            "relu(x @ weight.T + bias)" GB_DOC "AMX-BF16 tiles where the call allows."),
    GB_DESC("linear_gelu_bf16_amx", "linear_gelu", 4, gb_run_gelu, 1,
            "gelu(x @ weight.T + bias, approximate)" GB_DOC "AMX-BF16 tiles where the call allows."),
};
static const pdlkit_kernel_desc *const kKernels[] = {&kDescs[0], &kDescs[1], &kDescs[2],
                                                     &kDescs[3], &kDescs[4], &kDescs[5]};

PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration *out, char *error, size_t error_size) {
    PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size);
    if (host_minor < 1) /* optional bias, prepack */
        return pdlkit_error(error, error_size, PDLKIT_UNSUPPORTED,
                            "needs a host speaking pdlkit ABI >= 1.1 (prepack), got 1.%u", (unsigned)host_minor);
    gbf16_init(); /* the GELU tables, before any call from any thread */
    out->kernels = kKernels;
    out->num_kernels = sizeof(kKernels) / sizeof(kKernels[0]);
    return PDLKIT_OK;
}
