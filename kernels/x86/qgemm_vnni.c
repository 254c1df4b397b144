/* int8 GEMM with a fused epilogue for PT2E qlinear on x86 (AVX-512 VNNI):
 *
 *   out[m, n] = quantize(act((x[m, :] - x_zp) . (w[n, :] - w_zp[n]) * x_scale * w_scale[n]
 *                            + bias[n]))                            (or float32, unquantized)
 *
 * with x uint8 [M, K] (rows ldx bytes apart), w int8 [N, K], per-channel w_scale / w_zp,
 * ReLU / GELU (erf, tanh) and a uint8 / int8 / float32 output. A pdlkit C ABI 1.2 library
 * (pdlkit_register at the end; kernels/x86/qlinear_vnni.py builds and loads it): the ops
 * qlinear_q / qlinear, their per-tensor-weight forms qlinear_q_pt / qlinear_pt, the add +
 * LayerNorm ops and qkv_attention_q_merged, each on the VNNI path and on AMX tiles.
 *
 * GEMM. vpdpbusd multiplies unsigned by signed bytes, which is PT2E's u8 activation x s8
 * weight as is: no shift of the activations. Per output column, the zero-point terms are
 *
 *   sum_k (x - x_zp)(w - w_zp) = acc + colcorr[n] - w_zp[n] * (rowsum_x[m] - K x_zp),
 *   acc = sum_k x w,  colcorr[n] = -x_zp sum_k w[n, k]            (exact in int32),
 *
 * the last term only when some w_zp[n] != 0 (X86InductorQuantizer's weights are symmetric).
 * All of it is int32 arithmetic that wraps modulo 2^32 (vpdpbusd does not saturate), so the
 * result is exact whenever the true sum fits in int32: every term is at most A B,
 * A = max(|x_zp|, |255 - x_zp|), B = max(w_zp + 128, 127 - w_zp), so K A B <= 2^31 - 1
 * (k_fits): K <= 65793 with symmetric weights and any x_zp, 131071 for x_zp = 128, 33025 for
 * any 8-bit zero points. Beyond it the call is declined (x = 255, w = -128 throughout would
 * wrap; K of about 65.8k and more gave wrong numbers before this check).
 * The weight is packed once (qgemm_pack, in the prepack hook) into panels of 64 columns, K in groups of
 * four bytes: panel[q][c][i] = w[n0 + c, 4q + i], zero padded, so each group of 4 k is four
 * 64-byte loads. The micro-kernel keeps a 6 x 64 int32 tile in 24 zmm registers, broadcasts
 * four activation bytes per row and issues 24 vpdpbusd per 10 loads; the tile then goes
 * through the epilogue in registers (the accumulators never reach memory as a [M, N]
 * matrix). Loop order: panels outside, 6-row blocks inside, full K per tile (a K = 1024
 * panel is 64 KB and streams from L2). Built with -fopenmp (qlinear_vnni.py tries that first),
 * the tiles of GEMMs of 2^21 multiply-adds or more are shared over torch's OpenMP threads.
 *
 * Epilogue. y = (acc + colcorr) * S[n] + B[n] with S, B folded per call
 * (S = x_scale * w_scale * c, B = bias * c; c = inv_out_scale, or the GELU table's index
 * scale), the activation (ReLU as max(0, y), which keeps a NaN as torch.relu does), then
 * q = clamp(round_half_even(y') + out_zp, qmin, qmax) as torch's quantize_per_tensor computes
 * it (inv_out_scale = (float)(1.0 / out_scale)); the clamp is applied in float before the
 * rounding (same result for integer bounds, no overflow of the float -> int32 conversion).
 * vcvtps2dq rounds to nearest even, like torch.round. A call whose S or B is not finite, or
 * where |S| 2^31 + |B| could overflow float32, is declined (returns 3): no value here is then
 * NaN or inf, and NaN / inf results, and the code torch gives a NaN (0, whatever the zero
 * point), are the reference's. The add + LayerNorm entry declines a row of linear(x) + residual
 * that is NaN, infinite or past about 1.8e19 (returns 5: torch's LayerNorm can give NaN there);
 * its codes give a NaN (from a NaN LayerNorm weight or bias) code 0, as torch does.
 *
 * GELU (both forms) is 0.5 y (1 + G(y)) with G odd: erf(y / sqrt 2), or
 * tanh(sqrt(2/pi) (y + 0.044715 y^3)). G(|y|) on [0, 4 sqrt 2) is 16 degree-4 polynomials,
 * one per interval of width 4 sqrt 2 / 15.5 ~ 0.365 (Chebyshev interpolants computed in
 * double at load time by gelu_tables_init, no magic constants), selected per lane with
 * vpermps: 5 permutes and 4 FMAs per 16 values, no division, no exp. The last one, |y| >= 5.29,
 * and beyond 4 sqrt 2 is G = 1 exactly (|1 - G| <= 1.4e-7 there): GELU of a huge y is y or 0,
 * not y times a polynomial's 1e-7 (GELU(-1e6) was -0.03 to -0.1, 2 to 8 codes of a following
 * quantize). Accuracy (float32, against double precision): |G - erf(y / sqrt 2)| and
 * |G - tanh(...)| <= 2.7e-7 over all y; the whole GELU is within 5.1e-7 absolute for
 * |y| <= 4 and 1.2e-6 (about one float32 ulp of y) up to |y| = 12. The requantized outputs
 * are within one code of PT2E's reference chain (which rounds its float GEMM differently),
 * as oneDNN's are. A GELU whose output is quantized right away uses a cheaper form instead
 * (gelu_avx512.h, qgelu16: y Phi(y) with Phi as 31 degree-3 pieces over [-4 sqrt 2, 4 sqrt 2],
 * the end ones the constants 0 and 1, and the output scale folded into the coefficients per
 * call; 4 vpermt2ps and 4 FMA / MUL, no |y| or sign handling; GELU error <= 3e-6, exactly 0
 * below y = -5.29 however large |y|): 512 x 256 x 1024 with GELU + uint8 codes
 * went from 767 to 740 us, codes unchanged but for a few in 10^5.
 *
 * Add + LayerNorm (qgemm_run_add_ln, a transformer block's output projection):
 * out = layer_norm(linear(x) + res) and optionally its codes. Rows go in groups whose float32
 * output stays in L2; per group the tiles add the residual as they store, then each row gets
 * a two-pass mean / variance and the normalize + affine + quantize pass. Replaces Inductor's
 * add + LayerNorm + quantize kernel, which reads the GEMM's output back: about +45 us on a
 * 512 x 256 x 256 GEMM of 160 us, against ~70-90 us for Inductor's kernel.
 *
 * Measured on one Zen 4 core (benchmarks/x86_qlinear.py): 427-442 GOP/s on bert-mini's
 * GEMMs, where the single-core limit (2048^3 through oneDNN or _int_mm) is about 435, and
 * 0.80-0.89x oneDNN qlinear's time; GELU costs about 130 us more per 512 x 1024 output.
 *
 * int8 activations (symmetric quantizers, flags QG_S8): the VNNI path multiplies their u8 view
 * x + 128 (the micro-kernel XORs each group of four bytes with 0x80 before the broadcast) and
 * the pre-pack keeps colcorr = -(x_zp + 128) sum_k w[n, k] for them; k_fits bounds K with zero point
 * x_zp + 128, and the weight zero-point row sums are of the signed values. u8 calls run the same
 * instructions as before (the XOR with 0 folds away).
 *
 * AMX (qgemm_amx.h, qgemm_amx_gemm.h; flags QG_AMX): where the pre-pack asks, K % 64 == 0,
 * M >= 32 and Linux grants the tile state, each thread runs its blocks as one stream of halves
 * (32 rows x 32 columns of a packed panel: TDPBUSD / TDPBSSD tiles that read the same panels,
 * which are the AMX B-tile layout), a half's epilogue (the same code as the VNNI blocks',
 * qgemm_epilogue.h) running on the vector units while the tiles compute the next half; the
 * add + LayerNorm entry and the QKV GEMM of qkv_attention_q_merged use them too. Rows past the
 * last block of 32 and every other call run the VNNI path.
 *
 * Portability: the compute functions carry target("avx512f,avx512bw,avx512vl,avx512vnni")
 * attributes and run only where __builtin_cpu_supports says so; elsewhere run() declines
 * (the descriptors require avx512_vnni anyway). A plain C path (qgemm_run_scalar, libm
 * erff / tanhf / nearbyintf; a build with -DPDLKIT_SCALAR_REFERENCE registers the same
 * kernels running it) is the reference the tests
 * compare with.
 *
 * Build (what pdlkit.runtime_abi.native_build.build_library(path, "x86_64", extra=("-fopenmp",))
 * runs; no -m flags needed; without -fopenmp the same source builds single-threaded):
 *   cc -O3 -fopenmp -shared -fPIC -Wall -I runtime_abi/include kernels/x86/qgemm_vnni.c -lm \
 *      -o libpdlkit_qgemm_vnni.so
 */

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PDLKIT_X86 1
#else
#define PDLKIT_X86 0
#endif

#include "x86_abi.h"      /* pdlkit_abi.h and helpers */
#include "gelu_avx512.h" /* GELU: scalar reference, tables, 16 lanes at a time */
#include "qgemm_amx.h"     /* the AMX tile path: cpuid, permission, tile configuration */

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU_ERF = 2, ACT_GELU_TANH = 3 };
enum { OUT_U8 = 0, OUT_S8 = 1, OUT_F32 = 2 };

/* What stays fixed for one call site and weight (built once, at pre-pack time). */
typedef struct {
    int64_t n;              /* output columns (weight rows) */
    int64_t k;              /* reduction length */
    const int8_t *packed;   /* the weight, qgemm_pack's layout */
    const int32_t *colcorr; /* [n]: -x_zp * sum_k w[n, k] */
    double x_scale;
    float inv_out_scale; /* (float)(1.0 / out_scale); unused for float32 output */
    int32_t x_zp;
    int32_t out_zp;
    int32_t qmin;
    int32_t qmax;
    int32_t act;      /* ACT_* */
    int32_t out_kind; /* OUT_* */
    int32_t flags;    /* QG_AMX | QG_S8 */
    /* s8 activations (QG_S8): colcorr is the correction of their u8 view x + 128 (what the
     * VNNI path multiplies), -(x_zp + 128) sum_k w[n, k]; colcorr_ss, -x_zp sum_k w[n, k], the
     * one of TDPBSSD's s8 x s8 sums (the AMX path). NULL otherwise. */
    const int32_t *colcorr_ss;
} pdlkit_qgemm_params;

/* flags: run on AMX tiles where the call allows it (qgemm_amx.h); the activations are int8;
 * (a pre-pack's only) packed for activations quantized per call, qlinear_dynamic */
enum { QG_AMX = 1, QG_S8 = 2, QG_DYN = 4 };

enum { NR = 64, MR = 6 };
/* GEMMs smaller than this run on the calling thread: a parallel region costs a few us */
#define PARALLEL_MIN_MACS ((int64_t)1 << 21)

/* Bytes of the packed weight: ceil(N / 64) panels of ceil(K / 4) groups of 64 x 4 bytes. */
static int64_t qgemm_packed_size(int64_t n, int64_t k) {
    return ((n + NR - 1) / NR) * ((k + 3) / 4) * NR * 4;
}

/* out (qgemm_packed_size bytes) = w [n, k] (rows ldw bytes apart) in panels. */
static void qgemm_pack(const int8_t *w, int64_t ldw, int64_t n, int64_t k, int8_t *out) {
    const int64_t k4 = (k + 3) / 4, panels = (n + NR - 1) / NR;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t q = 0; q < k4; q++)
            for (int64_t c = 0; c < NR; c++)
                for (int64_t i = 0; i < 4; i++) {
                    const int64_t row = p * NR + c, col = 4 * q + i;
                    out[((p * k4 + q) * NR + c) * 4 + i] =
                        (row < n && col < k) ? w[row * ldw + col] : 0;
                }
}

static inline int8_t packed_at(const pdlkit_qgemm_params *p, int64_t row, int64_t col) {
    const int64_t k4 = (p->k + 3) / 4;
    return p->packed[(((row / NR) * k4 + col / 4) * NR + row % NR) * 4 + col % 4];
}

/* ---------------------------------------------------------------- scalar reference path */

static float act_scalar(float y, int act) {
    switch (act) {
    case ACT_RELU: return y < 0.0f ? 0.0f : y; /* NaN stays NaN, as torch.relu */
    case ACT_GELU_ERF: return gelu_erf_scalar(y);
    case ACT_GELU_TANH: return gelu_tanh_scalar(y);
    default: return y;
    }
}

/* acc: the zero-point corrected sums sum_k (x - x_zp)(w - w_zp) of one row */
static void row_scalar(const int32_t *acc, int64_t n, const pdlkit_qgemm_params *p,
                       const float *w_scale, const float *bias, void *out) {
    const float lo = (float)(p->qmin - p->out_zp), hi = (float)(p->qmax - p->out_zp);
    for (int64_t j = 0; j < n; j++) {
        float s = (float)p->x_scale * w_scale[j];
        float y = (float)acc[j] * s + (bias ? bias[j] : 0.0f);
        y = act_scalar(y, p->act);
        if (p->out_kind == OUT_F32) {
            ((float *)out)[j] = y;
            continue;
        }
        float v = y * p->inv_out_scale;
        v = v < lo ? lo : (v > hi ? hi : v); /* NaN stays NaN: torch's clamp keeps it too */
        int32_t q = (int32_t)nearbyintf(v) + p->out_zp; /* default rounding: half to even */
        if (p->out_kind == OUT_U8)
            ((uint8_t *)out)[j] = (uint8_t)q;
        else
            ((int8_t *)out)[j] = (int8_t)q;
    }
}

/* ---------------------------------------------------------------- AVX-512 path */

#if PDLKIT_X86

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* GCC 12 copies and spills the accumulator of _mm512_dpbusd_epi32 on every iteration (half
 * the speed); the bare instruction keeps the 24 accumulators in place. */
#define DPBUSD(c, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(c) : "v"(a), "v"(b))

static inline int32_t quad_tail(const uint8_t *x, int64_t left) {
    int32_t v = 0; /* bytes past K meet the packed weight's zero padding */
    memcpy(&v, x, (size_t)left);
    return v;
}

/* The micro-kernel for mr = 1..6 rows (one function each, so that every accumulator is a
 * register): acc[r * 64 + c] = sum_k x[r, k] * w[n0 + c, k] over one packed panel. */
#define ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DECL(r) __m512i c##r##0 = _mm512_setzero_si512(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
#define STEP(r)                                  \
    if (ROWS > r) {                              \
        const __m512i av = _mm512_set1_epi32(QUAD(r)); \
        DPBUSD(c##r##0, av, b0);                 \
        DPBUSD(c##r##1, av, b1);                 \
        DPBUSD(c##r##2, av, b2);                 \
        DPBUSD(c##r##3, av, b3);                 \
    }
#define SAVE(r)                                               \
    if (ROWS > r) {                                           \
        _mm512_store_si512(acc + r * NR, c##r##0);            \
        _mm512_store_si512(acc + r * NR + 16, c##r##1);       \
        _mm512_store_si512(acc + r * NR + 32, c##r##2);       \
        _mm512_store_si512(acc + r * NR + 48, c##r##3);       \
    }
#define LOAD_B                                                                                   \
    const int8_t *g = panel + q * NR;                                                            \
    const __m512i b0 = _mm512_loadu_si512(g), b1 = _mm512_loadu_si512(g + 64);                   \
    const __m512i b2 = _mm512_loadu_si512(g + 128), b3 = _mm512_loadu_si512(g + 192);
#define KLOOP(R, SUF, FLIP)                                                                      \
    VNNI __attribute__((noinline)) static void kloop##R##SUF(const uint8_t *x, int64_t ldx,       \
                                                             int64_t k, const int8_t *panel,      \
                                                             int32_t *acc) {                      \
        enum { ROWS = R };                                                                       \
        const int32_t flip = (int32_t)(FLIP);                                                    \
        ROWS6(DECL)                                                                              \
        int64_t q = 0;                                                                           \
        for (; q + 4 <= k; q += 4) {                                                             \
            LOAD_B                                                                               \
            ROWS6(STEP)                                                                          \
        }                                                                                        \
        if (q < k) {                                                                             \
            LOAD_B                                                                               \
            ROWS6(STEP_TAIL)                                                                     \
        }                                                                                        \
        ROWS6(SAVE)                                                                              \
    }
/* four activation bytes; s8 activations (flip 0x80808080) become their u8 view x + 128 */
#define QUAD(r) ((*(const int32_t *)(x + (r) * ldx + q)) ^ flip)
#define STEP_TAIL(r)                                                    \
    if (ROWS > r) {                                                     \
        const __m512i av = _mm512_set1_epi32(quad_tail(x + (r) * ldx + q, k - q) ^ flip); \
        DPBUSD(c##r##0, av, b0);                                        \
        DPBUSD(c##r##1, av, b1);                                        \
        DPBUSD(c##r##2, av, b2);                                        \
        DPBUSD(c##r##3, av, b3);                                        \
    }
#define KLOOPS(R) KLOOP(R, , 0) KLOOP(R, _s8, 0x80808080u)
KLOOPS(1)
KLOOPS(2)
KLOOPS(3)
KLOOPS(4)
KLOOPS(5)
KLOOPS(6)
#undef QUAD

/* The micro-kernel for a block of mr = 1..6 rows; s8: the activations are int8 (multiplied as
 * x + 128, which the s8 colcorr takes back). */
VNNI static inline void kloop(int mr, int s8, const uint8_t *x, int64_t ldx, int64_t k,
                              const int8_t *panel, int32_t *acc) {
    switch (mr + 8 * s8) {
    case 6: kloop6(x, ldx, k, panel, acc); break;
    case 5: kloop5(x, ldx, k, panel, acc); break;
    case 4: kloop4(x, ldx, k, panel, acc); break;
    case 3: kloop3(x, ldx, k, panel, acc); break;
    case 2: kloop2(x, ldx, k, panel, acc); break;
    case 1: kloop1(x, ldx, k, panel, acc); break;
    case 14: kloop6_s8(x, ldx, k, panel, acc); break;
    case 13: kloop5_s8(x, ldx, k, panel, acc); break;
    case 12: kloop4_s8(x, ldx, k, panel, acc); break;
    case 11: kloop3_s8(x, ldx, k, panel, acc); break;
    case 10: kloop2_s8(x, ldx, k, panel, acc); break;
    default: kloop1_s8(x, ldx, k, panel, acc); break;
    }
}

#include "qgemm_epilogue.h" /* y16 / q16, tile_out, the add + LayerNorm epilogue */

/* Tile t of a GEMM: (panel t / blocks, row block t % blocks), so that a static schedule gives
 * each thread a run of whole panels (its share of the weight stays in its core's cache). */
VNNI static inline __attribute__((always_inline)) void gemm_tile(
    int64_t t, int64_t blocks, const uint8_t *x, int64_t m, int64_t ldx, void *out, int64_t ldo,
    const pdlkit_qgemm_params *p, const epi_t *e, int act, int kind) {
    int32_t acc[MR * NR] __attribute__((aligned(64)));
    const int64_t n = p->n, k = p->k, k4 = (k + 3) / 4, esize = kind == OUT_F32 ? 4 : 1;
    const int64_t n0 = (t / blocks) * NR, i = (t % blocks) * MR;
    const int8_t *panel = p->packed + (n0 / NR) * k4 * NR * 4;
    const int64_t nc = n - n0 < NR ? n - n0 : NR;
    const int mr = m - i < MR ? (int)(m - i) : MR;
    kloop(mr, (p->flags & QG_S8) != 0, x + i * ldx, ldx, k, panel, acc);
    tile_out(acc, mr, nc, p->colcorr, e, n0, i, (char *)out + i * ldo * esize, ldo, act, kind,
             NULL, 0);
}

/* One function per (activation, output kind), each with its own parallel loop: GCC outlines an
 * OpenMP region before it inlines, so a region inside an always_inline function taking act and
 * kind as arguments is outlined once, with both as run-time values and a branch per vector of
 * the epilogue (the single-threaded build measured 1-3.6% faster than that). Here the outlined
 * body calls gemm_tile with literal constants, which inlining then propagates. Threads come
 * from torch's own OpenMP runtime (the library links libgomp.so.1, which torch has loaded), so
 * torch.set_num_threads applies and no second pool competes for the cores. */
#if defined(_OPENMP)
#define OMP_TILES _Pragma("omp parallel for schedule(static) if (m * p->n * p->k >= PARALLEL_MIN_MACS)")
#else
#define OMP_TILES
#endif
#define GEMM_VARIANT(ACT, KIND)                                                                  \
    VNNI static void gemm_##ACT##_##KIND(const uint8_t *x, int64_t m, int64_t ldx, void *out,     \
                                         int64_t ldo, const pdlkit_qgemm_params *p,                \
                                         const epi_t *e) {                                         \
        const int64_t blocks = (m + MR - 1) / MR, tiles = ((p->n + NR - 1) / NR) * blocks;        \
        OMP_TILES                                                                                 \
        for (int64_t t = 0; t < tiles; t++) gemm_tile(t, blocks, x, m, ldx, out, ldo, p, e, ACT, KIND); \
    }
/* What the AMX engine (qgemm_amx_gemm.h) asks of this family: where the epilogue writes
 * (amx_dst), a pending half's rows through the epilogue (amx_epi_rows), the rows past the last
 * whole block of AMX_MR through the VNNI micro-kernel (amx_tail_rows). */

/* out (rows ldo apart, row 0 of the call), from sums corrected by cc; res (float32 output only;
 * rows ldr apart, or NULL): added as it stores; p, x, ldx: the call, for the tail rows. */
typedef struct {
    const int32_t *cc;
    const epi_t *e;
    void *out;
    int64_t ldo;
    const float *res;
    int64_t ldr;
    const pdlkit_qgemm_params *p;
} amx_dst;

/* Rows r0 .. r1 - 1 of a pending half through the epilogue (what tile_out does for a VNNI
 * block; act and kind are constants after inlining): zero-point correction, scales, bias,
 * activation, then the float32 store or the codes, 32 per row (pack64 of two vectors). */
VNNI static inline __attribute__((always_inline)) void amx_epi_rows(const amx_pend *pd, int r0,
                                                                   int r1, const amx_dst *d,
                                                                   int act, int kind) {
    const int32_t *cc = d->cc, *acc = (const int32_t *)pd->acc;
    const epi_t *e = d->e;
    const float(*tab)[16] = gelu_tab[act == ACT_GELU_TANH];
    const __m512 lo = _mm512_set1_ps(e->lo), hi = _mm512_set1_ps(e->hi), hk = _mm512_set1_ps(e->hk);
    const __m512i zp = _mm512_set1_epi32(e->zp);
    const int qgelu = kind != OUT_F32 && (act == ACT_GELU_ERF || act == ACT_GELU_TANH);
    __m512i ccj[2], wz[2];
    __m512 s[2], b[2];
    __mmask16 mk[2];
    for (int j = 0; j < 2; j++) { /* lanes past nc: masked off (their sums are of zero columns) */
        const int64_t col = pd->col + 16 * j;
        mk[j] = lanes(pd->nc - 16 * j);
        ccj[j] = _mm512_maskz_loadu_epi32(mk[j], cc + col);
        s[j] = _mm512_maskz_loadu_ps(mk[j], e->S + col);
        b[j] = _mm512_maskz_loadu_ps(mk[j], e->B + col);
        wz[j] = e->wzp ? _mm512_maskz_loadu_epi32(mk[j], e->wzp + col) : _mm512_setzero_si512();
    }
    for (int r = r0; r < r1; r++) {
        const int64_t row = pd->row + r;
        __m512i q[2];
        for (int j = 0; j < 2; j++) {
            __m512i a = _mm512_load_si512(acc + r * NR + 16 * j);
            if (e->wzp)
                a = _mm512_sub_epi32(a, _mm512_mullo_epi32(wz[j], _mm512_set1_epi32(e->rowcorr[row])));
            __m512 y = qgelu ? qgelu16(y16(a, ccj[j], s[j], b[j], ACT_NONE, hk, tab), e->qt)
                             : y16(a, ccj[j], s[j], b[j], act, hk, tab);
            if (kind == OUT_F32 && d->res)
                y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mk[j], d->res + row * d->ldr + pd->col + 16 * j));
            if (kind == OUT_F32)
                _mm512_mask_storeu_ps((float *)d->out + row * d->ldo + pd->col + 16 * j, mk[j], y);
            else
                q[j] = q16(y, lo, hi, zp);
        }
        if (kind != OUT_F32)
            _mm512_mask_storeu_epi8((int8_t *)d->out + row * d->ldo + pd->col, bytes_mask(pd->nc),
                                    pack64(q[0], q[1], q[0], q[1], kind == OUT_S8));
    }
}

/* Rows i .. i + rows - 1 (rows < AMX_MR: the last of a call, fewer than a block) of panel
 * column n0 through the VNNI micro-kernel, 6 at a time, and tile_out (acc: 6 x NR int32 of
 * scratch). */
VNNI static inline __attribute__((always_inline)) void amx_tail_rows(
    void *acc, const amx_gemm_t *g, const amx_dst *d, int64_t i, int64_t rows, int64_t n0,
    int act, int kind) {
    const pdlkit_qgemm_params *p = d->p;
    const uint8_t *x = (const uint8_t *)g->x;
    const int64_t n = p->n, k = p->k, k4 = (k + 3) / 4, esize = kind == OUT_F32 ? 4 : 1, ldx = g->ldx;
    const int8_t *panel = p->packed + (n0 / NR) * k4 * NR * 4;
    const int64_t nc = n - n0 < NR ? n - n0 : NR;
    for (int64_t r = i; r < i + rows; r += MR) {
        const int mr = i + rows - r < MR ? (int)(i + rows - r) : MR;
        kloop(mr, (p->flags & QG_S8) != 0, x + r * ldx, ldx, k, panel, (int32_t *)acc);
        tile_out((int32_t *)acc, mr, nc, p->colcorr, d->e, n0, r, (char *)d->out + r * d->ldo * esize,
                 d->ldo, act, kind, d->res ? d->res + r * d->ldr : NULL, d->ldr);
    }
}

#include "qgemm_amx_gemm.h" /* the AMX engine: amx_range, AMX_PARALLEL */

/* The AMX variant per (activation, output kind): the engine over this call's packed panels,
 * TDPBSSD for int8 activations (their sums corrected by colcorr_ss), TDPBUSD for uint8. */
#define AMX_VARIANT(ACT, KIND)                                                                   \
    AMX static void amx_##ACT##_##KIND(const uint8_t *x, int64_t m, int64_t ldx, void *out,      \
                                       int64_t ldo, const pdlkit_qgemm_params *p,                  \
                                       const epi_t *e) {                                           \
        const int s8 = (p->flags & QG_S8) != 0;                                                   \
        const amx_gemm_t g = {(const char *)x, m, ldx, (const char *)p->packed, p->n, (p->k + 3) / 4}; \
        const amx_dst d = {s8 ? p->colcorr_ss : p->colcorr, e, out, ldo, NULL, 0, p};             \
        AMX_PARALLEL(&g, &d, m * p->n * p->k >= PARALLEL_MIN_MACS, s8 ? AMX_DP_S8 : AMX_DP_U8,    \
                     ACT, KIND);                                                                  \
    }

/* The add + LayerNorm entry's GEMM on AMX (add_ln_group's): rows i0 .. i1 - 1 x every panel
 * into out (float32, res added), through the engine's blocked tasks (amx_range) on a view of
 * those rows: each group of panels comes from memory once for all of them, and K goes in
 * chunks. (Panels outside and K whole, as before, read the whole weight again for every 32
 * rows: on a Xeon with AMX, one thread, BERT-base's 128 x 3072 x 768 with its add, LayerNorm
 * and codes took 1.27x oneDNN's GEMM alone with the weight in the caches and 1.38x with it out
 * of them, where the engine's plain GEMM took 0.83x and 0.90x: x86_cold_weights_*.md.) */
AMX __attribute__((noinline)) static void amx_add_rows(
    const uint8_t *x, int64_t i0, int64_t i1, int64_t ldx, const pdlkit_qgemm_params *p,
    const epi_t *e, float *out, int64_t ldo, const float *res, int64_t ldr) {
    const int s8 = (p->flags & QG_S8) != 0;
    epi_t view = *e; /* the view's row 0 is row i0 */
    if (view.rowcorr) view.rowcorr += i0;
    const amx_gemm_t g = {(const char *)(x + i0 * ldx), i1 - i0, ldx, (const char *)p->packed,
                          p->n, (p->k + 3) / 4};
    const amx_dst d = {s8 ? p->colcorr_ss : p->colcorr, &view, out + i0 * ldo, ldo,
                       res + i0 * ldr, ldr, p};
    const amx_tasks_t tasks = amx_tasks(&g);
    int32_t acc[AMX_GROUP_MAX * AMX_MR * NR] __attribute__((aligned(64))); /* 128 KB */
    amx_range(acc, 0, tasks.count, tasks.blocks, tasks.group, &g, &d, s8 ? AMX_DP_S8 : AMX_DP_U8,
              ACT_NONE, OUT_F32);
}

#define GEMM_KINDS(ACT)                                                                          \
    GEMM_VARIANT(ACT, OUT_U8) GEMM_VARIANT(ACT, OUT_S8) GEMM_VARIANT(ACT, OUT_F32)               \
    AMX_VARIANT(ACT, OUT_U8) AMX_VARIANT(ACT, OUT_S8) AMX_VARIANT(ACT, OUT_F32)
GEMM_KINDS(ACT_NONE)
GEMM_KINDS(ACT_RELU)
GEMM_KINDS(ACT_GELU_ERF)
GEMM_KINDS(ACT_GELU_TANH)

typedef void (*gemm_fn)(const uint8_t *, int64_t, int64_t, void *, int64_t,
                        const pdlkit_qgemm_params *, const epi_t *);
#define KINDS(P, ACT) {P##ACT##_OUT_U8, P##ACT##_OUT_S8, P##ACT##_OUT_F32}
#define TABLE(P) {KINDS(P, ACT_NONE), KINDS(P, ACT_RELU), KINDS(P, ACT_GELU_ERF), KINDS(P, ACT_GELU_TANH)}
static const gemm_fn GEMMS[2][4][3] = {TABLE(gemm_), TABLE(amx_)}; /* [amx][act][out kind] */

/* Rows i0 .. i1 (a group whose float32 output stays in L2, about 128 KB): panels outside and
 * 6-row blocks inside, as in gemm_tile (a panel of K <= 256 stays in L1 across the blocks: with
 * all panels per block instead, a 512 x 256 x 256 call took 50 us more), then the group's rows
 * are complete and get their LayerNorm while in L2. */
VNNI static inline __attribute__((always_inline)) int add_ln_group(
    const uint8_t *x, int64_t i0, int64_t i1, int64_t ldx, float *out, int64_t ldo,
    const pdlkit_qgemm_params *p, const epi_t *e, const pdlkit_qgemm_ln_args *a, const float *res,
    int64_t ldr, void *codes, int64_t ldc, int amx) {
    const int64_t n = p->n, k = p->k, k4 = (k + 3) / 4;
    int32_t acc[AMX_MR * NR] __attribute__((aligned(64)));
    /* In a model the residual was written a few GEMMs ago and lies in L3: the tiles read it 256
     * bytes per row, 1 KB apart, which the hardware prefetchers do not follow (a third of this
     * function's time sat on that load in bert-mini). Ask for the group's rows up front; the
     * first panel's GEMM hides the wait. */
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = 0; j < n; j += 16) _mm_prefetch((const char *)(res + i * ldr + j), _MM_HINT_T1);
    if (amx) /* whole AMX blocks, then the VNNI micro-kernel for the rest (qgemm_amx_gemm.h) */
        amx_add_rows(x, i0, i1, ldx, p, e, out, ldo, res, ldr);
    for (int64_t n0 = 0; !amx && n0 < n; n0 += NR) {
        const int8_t *panel = p->packed + (n0 / NR) * k4 * NR * 4;
        for (int64_t i = i0; i < i1; i += MR) {
            const int mr = i1 - i < MR ? (int)(i1 - i) : MR;
            kloop(mr, (p->flags & QG_S8) != 0, x + i * ldx, ldx, k, panel, acc);
            tile_out(acc, mr, n - n0 < NR ? n - n0 : NR, p->colcorr, e, n0, i, out + i * ldo, ldo,
                     ACT_NONE, OUT_F32, res + i * ldr, ldr);
        }
    }
    return ln_range(out, ldo, i0, i1, n, a, codes, ldc);
}

/* The row blocks (6 rows, or AMX_MR on AMX) are split evenly over the threads first, then each
 * thread's run into groups of about 128 KB of output (equal sizes): groups of a fixed size
 * handed out whole left one of two threads with 84 of 128 rows on BERT-base's 128 x K x 768
 * (a 4th group of 2 rows). On AMX, where the packed weight is over 1 MB (it does not stay in L2
 * from one group to the next, and each group reads all of it), a group is up to 1 MB of output
 * (BERT-base's 128 x 3072 x 768: one group, not four; at K = 768 the small groups measured
 * faster: x86_cold_weights_*.md). Returns 1 where some row's sum of squares was not finite
 * (ln_rows), else 0. */
VNNI static int gemm_add_ln(const uint8_t *x, int64_t m, int64_t ldx, float *out, int64_t ldo,
                             const pdlkit_qgemm_params *p, const epi_t *e,
                             const pdlkit_qgemm_ln_args *a, const float *res, int64_t ldr,
                             void *codes, int64_t ldc, int amx) {
    const int64_t n = p->n, unit = amx ? AMX_MR : MR, blocks = (m + unit - 1) / unit;
    const int64_t big = amx && ((n + NR - 1) / NR) * ((p->k + 3) / 4) * NR * 4 > (1 << 20);
    const int64_t out_bytes = big ? (1 << 20) : (128 << 10), row_bytes = n * 4 * unit;
    const int64_t group_max = row_bytes < out_bytes ? out_bytes / row_bytes : 1;
    int bad = 0;
#if defined(_OPENMP)
#pragma omp parallel if (m * n * p->k >= PARALLEL_MIN_MACS) reduction(| : bad)
#endif
    {
        if (amx) amx_configure();
        int64_t b0 = 0, b1 = blocks;
#if defined(_OPENMP)
        const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
        b0 = blocks * me / threads;
        b1 = blocks * (me + 1) / threads;
#endif
        const int64_t groups = (b1 - b0 + group_max - 1) / group_max;
        for (int64_t g = 0; g < groups; g++) {
            const int64_t g0 = b0 + (b1 - b0) * g / groups, g1 = b0 + (b1 - b0) * (g + 1) / groups;
            bad |= add_ln_group(x, g0 * unit, g1 * unit < m ? g1 * unit : m, ldx, out, ldo, p, e,
                                a, res, ldr, codes, ldc, amx);
        }
        if (amx) amx_release();
    }
    return bad;
}

static int has_vnni(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    }
    return cached;
}
#else
static int has_vnni(void) { return 0; }
#endif

/* ---------------------------------------------------------------- entry points */

/* Whether a call of m rows with these params runs on AMX tiles: asked for (QG_AMX), K a
 * multiple of 64, at least one block of AMX_MR rows, and this process may use the tiles (the CPU
 * has AMX-INT8 and Linux granted the tile state: amx_ready). Otherwise the call runs the VNNI
 * path on the same packed weight. */
static int qgemm_uses_amx(const pdlkit_qgemm_params *p, int64_t m) {
    return (p->flags & QG_AMX) && p->k % AMX_KSTEP == 0 && m >= AMX_MR &&
           (!(p->flags & QG_S8) || p->colcorr_ss) && amx_ready();
}

/* Builds the GELU tables (call once before using the library from several threads);
 * returns 1 when the VNNI path runs on this CPU, 0 otherwise. */
static int qgemm_init(void) {
#if PDLKIT_X86
    gelu_tables_init();
#endif
    return has_vnni();
}

/* Whether every sum_k (x - x_zp)(w - w_zp) fits in int32 for these zero points (w_zp in
 * [zlo, zhi]), so that the int32 arithmetic, which wraps modulo 2^32 (vpdpbusd, the epilogue's
 * adds and multiplies, colcorr and rowcorr), gives it exactly: each term is at most
 * A B with A = max |x - x_zp| = max(|x_zp|, |255 - x_zp|) over uint8 x and
 * B = max |w - w_zp| = max(zhi + 128, 127 - zlo) over int8 w, so K A B <= 2^31 - 1 suffices
 * (and is needed: x = 255 or 0 and w = -128 throughout reach it). With symmetric weights
 * (w_zp = 0, B = 128): K <= 65793 whatever x_zp in [0, 255]; K <= 131071 for x_zp = 128. */
static int k_fits(const pdlkit_qgemm_params *p, int64_t zlo, int64_t zhi) {
    /* s8 activations: the same bound as their u8 view x + 128 with zero point x_zp + 128 */
    const int64_t bound = 2147483647, xz = p->x_zp + (p->flags & QG_S8 ? 128 : 0);
    if (zlo < -(1 << 20) || zhi > (1 << 20)) return 0; /* no int8 weight has such zero points */
    const int64_t a = xz > 255 - xz ? (xz < 0 ? -xz : xz) : 255 - xz;
    const int64_t b = zhi + 128 > 127 - zlo ? zhi + 128 : 127 - zlo;
    return p->k <= bound / (a * b); /* a >= 128, b >= 128 */
}

/* The weight zero-point terms, when some w_zp[n] != 0: wzp[n] as int32 and
 * rowcorr[m] = rowsum_x[m] - K x_zp; returns 0 (nothing to do) or 1; -1 without memory; -2
 * where K is too long for exact int32 sums (k_fits). */
static int weight_zp_terms(const int64_t *w_zp, const uint8_t *x, int64_t m, int64_t ldx,
                           const pdlkit_qgemm_params *p, int32_t **wzp, int32_t **rowcorr) {
    int64_t any = 0, zlo = 0, zhi = 0;
    for (int64_t j = 0; w_zp && j < p->n; j++) any |= w_zp[j];
    for (int64_t j = 0; any && j < p->n; j++) { /* asymmetric weights only */
        zlo = w_zp[j] < zlo ? w_zp[j] : zlo;
        zhi = w_zp[j] > zhi ? w_zp[j] : zhi;
    }
    *wzp = *rowcorr = NULL;
    if (!k_fits(p, zlo, zhi)) return -2;
    if (!any) return 0;
    *wzp = (int32_t *)malloc(sizeof(int32_t) * (size_t)(p->n + m + 1));
    if (!*wzp) return -1;
    *rowcorr = *wzp + p->n;
    for (int64_t j = 0; j < p->n; j++) (*wzp)[j] = (int32_t)w_zp[j];
    const int s8 = (p->flags & QG_S8) != 0;
    for (int64_t i = 0; i < m; i++) {
        int64_t rs = 0; /* sum_k (x - x_zp), the same for s8 activations and their u8 view */
        for (int64_t t = 0; t < p->k; t++) rs += s8 ? (int8_t)x[i * ldx + t] : x[i * ldx + t];
        (*rowcorr)[i] = (int32_t)(rs - p->k * (int64_t)p->x_zp);
    }
    return 1;
}

#if PDLKIT_X86
/* The epilogue's per-call vectors: S = x_scale * w_scale * c, B = bias * c (c = the output
 * scale's inverse, or the GELU table's index scale), and the weight zero-point terms. On
 * success the caller frees e->S unless it is `local`, and e->wzp. -1: out of memory; -2: K
 * too long for exact int32 sums (k_fits); -3: some S or B is not finite, or |S| 2^31 + |B|
 * overflows float32 (then no value the epilogue computes is NaN or inf: NaN and inf results
 * are left to the reference, whose NaN handling is torch's). AVX-512 (its callers run on VNNI
 * CPUs only): the per-column loop is 16 lanes wide. */
VNNI static int epilogue(const uint8_t *x, int64_t m, int64_t ldx, const float *w_scale,
                         const float *bias, const int64_t *w_zp, const pdlkit_qgemm_params *p,
                         float *local, epi_t *e) {
    const int gelu = p->act == ACT_GELU_ERF || p->act == ACT_GELU_TANH;
    const float inv = p->out_kind == OUT_F32 ? 1.0f : p->inv_out_scale;
    const float cs = gelu ? (float)GELU_VSCALE : inv;
    float *S = p->n <= 4096 ? local : (float *)malloc(sizeof(float) * 2 * (size_t)p->n);
    if (!S) return -1;
    float *B = S + p->n;
    int finite = 1; /* |S| 2^31 + |B| <= 3e38 for every column: false for NaN and inf too */
    for (int64_t j = 0; j < p->n; j++) {
        S[j] = (float)p->x_scale * w_scale[j] * cs;
        B[j] = bias ? bias[j] * cs : 0.0f;
        finite &= fabsf(S[j]) * 2147483648.0f + fabsf(B[j]) <= 3.0e38f;
    }
    int32_t *wzp, *rowcorr;
    const int zt = finite ? weight_zp_terms(w_zp, x, m, ldx, p, &wzp, &rowcorr) : -3;
    if (zt < 0) {
        if (S != local) free(S);
        return zt;
    }
    if (gelu && !gelu_ready) gelu_tables_init();
    e->S = S;
    e->B = B;
    e->wzp = wzp;
    e->rowcorr = rowcorr;
    e->lo = (float)(p->qmin - p->out_zp);
    e->hi = (float)(p->qmax - p->out_zp);
    e->hk = gelu ? 0.5f * inv / (float)GELU_VSCALE : 1.0f;
    if (gelu && p->out_kind != OUT_F32) {
        const float c = inv / (float)GELU_VSCALE;
        for (int d = 0; d <= QGELU_DEG; d++)
            for (int i = 0; i < 32; i++) e->qt[d][i] = qgelu_tab[p->act == ACT_GELU_TANH][d][i] * c;
    }
    e->zp = p->out_zp;
    return 0;
}

static void epilogue_free(epi_t *e, const float *local) {
    free((void *)e->wzp);
    if (e->S != local) free((void *)e->S);
}
#endif

/* out[m, n] (rows ldo elements apart; uint8, int8 or float32 by p->out_kind) from x [m, k]
 * (uint8, rows ldx bytes apart). w_scale: float32 [n]; bias: float32 [n] or NULL; w_zp:
 * int64 [n] or NULL (= all zero). Returns 0; 1 where this CPU lacks AVX-512 VNNI; -1 when
 * out of memory; 2 when the params' activation or output kind is out of range; 3 when a
 * scale or bias is not finite (or so large that the epilogue could overflow); 4 when K is too
 * long for exact int32 sums with these zero points (k_fits). Nothing is written for 1 to 4. */
__attribute__((unused)) static int qgemm_run(const uint8_t *x, int64_t m, int64_t ldx, void *out,
                                            int64_t ldo, const float *w_scale, const float *bias,
                                            const int64_t *w_zp, const pdlkit_qgemm_params *p) {
#if PDLKIT_X86
    if (!has_vnni()) return 1;
    if ((uint32_t)p->act > ACT_GELU_TANH || (uint32_t)p->out_kind > OUT_F32) return 2;
    if (m <= 0 || p->n <= 0) return 0;
    float local[2 * 4096];
    epi_t e;
    const int rc = epilogue(x, m, ldx, w_scale, bias, w_zp, p, local, &e);
    if (rc < 0) return rc == -1 ? -1 : rc == -2 ? 4 : 3;
    GEMMS[qgemm_uses_amx(p, m)][p->act][p->out_kind](x, m, ldx, out, ldo, p, &e);
    epilogue_free(&e, local);
    return 0;
#else
    (void)x, (void)m, (void)ldx, (void)out, (void)ldo, (void)w_scale, (void)bias, (void)w_zp, (void)p;
    return 1;
#endif
}

/* out[m, n] = layer_norm(x w^T (dequantized, + bias) + res) (float32, rows ldo apart; res
 * rows ldr apart; the params' out_kind must be float32 and act none), and codes (uint8 or
 * int8 by a->qmin, rows ldc apart) = its quantize_per_tensor when not NULL. Returns as
 * qgemm_run; 2 when the params do not fit; 5 when a row of linear(x) + res held a NaN,
 * an infinity or a value whose square overflows float32 (past about 1.8e19), where torch's
 * LayerNorm can give NaN through its variance (short rows; longer ones give beta) while this
 * one's two passes would not: the caller declines (the reference runs). */
static int qgemm_run_add_ln(const uint8_t *x, int64_t m, int64_t ldx, float *out, int64_t ldo,
                            const float *w_scale, const float *bias, const int64_t *w_zp,
                            const pdlkit_qgemm_params *p, const pdlkit_qgemm_ln_args *a,
                            const float *res, int64_t ldr, void *codes, int64_t ldc) {
#if PDLKIT_X86
    if (!has_vnni()) return 1;
    if (p->out_kind != OUT_F32 || p->act != ACT_NONE) return 2;
    if (m <= 0 || p->n <= 0) return 0;
    float local[2 * 4096];
    epi_t e;
    const int rc = epilogue(x, m, ldx, w_scale, bias, w_zp, p, local, &e);
    if (rc < 0) return rc == -1 ? -1 : rc == -2 ? 4 : 3;
    const int bad =
        gemm_add_ln(x, m, ldx, out, ldo, p, &e, a, res, ldr, codes, ldc, qgemm_uses_amx(p, m));
    epilogue_free(&e, local);
    return bad ? 5 : 0;
#else
    (void)x, (void)m, (void)ldx, (void)out, (void)ldo, (void)w_scale, (void)bias, (void)w_zp, (void)p, (void)a,
        (void)res, (void)ldr, (void)codes, (void)ldc;
    return 1;
#endif
}

/* The same in plain C, from the packed weight (what the tests compare the VNNI path with). */
__attribute__((unused)) static int qgemm_run_scalar(const uint8_t *x, int64_t m, int64_t ldx, void *out,
                                                   int64_t ldo, const float *w_scale, const float *bias,
                                                   const int64_t *w_zp, const pdlkit_qgemm_params *p) {
    int32_t *wzp, *rowcorr;
    int32_t *acc = (int32_t *)malloc(sizeof(int32_t) * (size_t)(p->n > 0 ? p->n : 1));
    const int zt = acc ? weight_zp_terms(w_zp, x, m, ldx, p, &wzp, &rowcorr) : -1;
    if (zt < 0) {
        free(acc);
        return zt == -2 ? 4 : -1;
    }
    const int64_t esize = p->out_kind == OUT_F32 ? 4 : 1, s8 = (p->flags & QG_S8) != 0;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < p->n; j++) { /* in int64: exact; the result fits (k_fits) */
            int64_t s = p->colcorr[j] - (wzp ? (int64_t)wzp[j] * rowcorr[i] : 0);
            for (int64_t t = 0; t < p->k; t++) /* s8: the u8 view x + 128, as colcorr expects */
                s += (s8 ? (int8_t)x[i * ldx + t] + 128 : x[i * ldx + t]) * (int64_t)packed_at(p, j, t);
            acc[j] = (int32_t)s;
        }
        row_scalar(acc, p->n, p, w_scale, bias, (char *)out + i * ldo * esize);
    }
    free(wzp);
    free(acc);
    return 0;
}

/* ---------------------------------------------------------------- the pdlkit contract */

#define QG_MAGIC 0x38494751u /* "QGI8" */
#if defined(PDLKIT_SCALAR_REFERENCE) /* tests: the same kernels on the plain C path */
#define QG_RUN qgemm_run_scalar
#else
#define QG_RUN qgemm_run
#endif

/* What a kernel's output is: the ops qlinear (float32), qlinear_q (codes), and the add +
 * LayerNorm ones (float32, or float32 and codes). */
enum { MODE_F32 = 0, MODE_Q = 1, MODE_LN = 2, MODE_LN_Q = 3 };

/* After the panels, three [n] column terms: -x_zp colsum (u8 activations), -(x_zp + 128)
 * colsum (the u8 view x + 128 of s8 activations, which the VNNI path multiplies) and -x_zp
 * colsum again (TDPBSSD's s8 x s8 sums, the AMX path's for s8 activations). */
static const int32_t *qg_colcorr(const x86_pack_header *h) {
    return (const int32_t *)((const char *)(h + 1) + qgemm_packed_size(h->n, h->k));
}

static size_t qg_packed_bytes(int64_t n, int64_t k) {
    return sizeof(x86_pack_header) + (size_t)qgemm_packed_size(n, k) + (size_t)(12 * n + 63) / 64 * 64;
}

/* The weight [n, k] (rows ldw apart) into the panels and column terms after h. */
static void qg_fill(x86_pack_header *h, const int8_t *w, int64_t ldw, int64_t x_zp) {
    const int64_t n = h->n, k = h->k;
    h->x_zp = x_zp;
    qgemm_pack(w, ldw, n, k, (int8_t *)(h + 1));
    int32_t *cc = (int32_t *)qg_colcorr(h);
    for (int64_t j = 0; j < n; j++) {
        int64_t sum = 0;
        for (int64_t t = 0; t < k; t++) sum += w[j * ldw + t];
        cc[j] = cc[2 * n + j] = (int32_t)(uint32_t)(-x_zp * sum); /* wraps as int32 sums do */
        cc[n + j] = (int32_t)(uint32_t)(-(x_zp + 128) * sum);
    }
}

/* QG_DYN (qlinear_dynamic, whose x_zp is a tensor of each call): the column terms are made
 * for x_zp = 1, -sum_k w[n, k], which each call multiplies by its zero point (qg_dyn_terms). */
static int32_t qg_prepack(pdlkit_prepack_frame *f, uint32_t flags) {
    const DLTensor *w = f->weight;
    if (!pdlkit_dtype_is(w->dtype, kDLInt, 8) || w->ndim != 2 || !pdlkit_is_contiguous(w))
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "w_q must be a contiguous [N, K] int8 tensor");
    const pdlkit_attribute *zp = x86_attr(f->attrs, f->num_attrs, "x_zp", PDLKIT_KIND_INT);
    if (zp == NULL && !(flags & QG_DYN)) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "no int attribute x_zp");
    const int64_t n = w->shape[0], k = w->shape[1];
    if (k == 0) return X86_ERR(f, PDLKIT_UNSUPPORTED, "K = 0");
    int32_t st;
    x86_pack_header *h = x86_pack_begin(f, QG_MAGIC, flags, n, k, qg_packed_bytes(n, k), &st);
    if (h != NULL) qg_fill(h, (const int8_t *)x86_data(w), k, flags & QG_DYN ? 1 : zp->i);
    return st;
}

/* The column terms of a dynamic call with zero point zp (see qg_colcorr) from its pre-pack's
 * (made for x_zp = 1): the same int32 values, wrapping as the sums do; 3 n values, malloc'd. */
static int32_t *qg_dyn_terms(const x86_pack_header *h, int64_t zp) {
    const int32_t *one = qg_colcorr(h);
    int32_t *cc = (int32_t *)malloc((size_t)(h->n > 0 ? 3 * h->n : 1) * sizeof(int32_t));
    for (int64_t j = 0; cc != NULL && j < h->n; j++) {
        const uint32_t sum = (uint32_t)one[j]; /* -sum_k w[n, k] */
        cc[j] = cc[2 * h->n + j] = (int32_t)(sum * (uint32_t)zp);
        cc[h->n + j] = (int32_t)(sum * (uint32_t)(zp + 128));
    }
    return cc;
}

/* The quantized output's range: (0, 255) or (-128, 127), else -1; 0 u8, 1 s8. */
static int qg_range(const pdlkit_call_frame *f, pdlkit_qgemm_params *p) {
    const pdlkit_attribute *os = x86_attr(f->attrs, f->num_attrs, "out_scale", PDLKIT_KIND_FLOAT);
    const pdlkit_attribute *oz = x86_attr(f->attrs, f->num_attrs, "out_zp", PDLKIT_KIND_INT);
    const pdlkit_attribute *lo = x86_attr(f->attrs, f->num_attrs, "out_qmin", PDLKIT_KIND_INT);
    const pdlkit_attribute *hi = x86_attr(f->attrs, f->num_attrs, "out_qmax", PDLKIT_KIND_INT);
    /* [0, 255], [-128, 127] or a part of one (7-bit codes: reduce_range): the epilogue clamps
     * to [qmin, qmax] itself */
    if (!os || !oz || !lo || !hi || lo->i > hi->i || lo->i < -128 || hi->i > (lo->i < 0 ? 127 : 255))
        return -1;
    p->inv_out_scale = (float)(1.0 / os->f); /* rounded to float, as quantize_per_tensor does */
    p->out_zp = (int32_t)oz->i, p->qmin = (int32_t)lo->i, p->qmax = (int32_t)hi->i;
    return lo->i < 0;
}

/* The C params of one call: the pre-pack's weight and column terms for x's dtype, the
 * activation's and output's quantization, the activation function. */
/* The activation's scale and zero point: the attributes x_scale / x_zp, or (dyn: qlinear_dynamic)
 * the one-element tensors inputs[1] / inputs[2], whose column terms go to *own (malloc'd). */
static int32_t qg_xparams(const pdlkit_call_frame *f, const x86_pack_header *h, int dyn, int s8,
                          double *scale, int64_t *zp, int32_t **own) {
    if (dyn) {
        if (!(h->flags & QG_DYN))
            return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "w_q was not packed for dynamic activations");
        /* one-element float and int tensors (choose_qparams gives float64 [1] and int64 [1]) */
        if (pdlkit_scalar_f64(&f->inputs[1], scale) != 0 || pdlkit_scalar_i64(&f->inputs[2], zp) != 0)
            return X86_ERR(f, PDLKIT_UNSUPPORTED, "x_scale / x_zp must be one float and one int");
        if (s8 ? *zp < -128 || *zp > 127 : *zp < 0 || *zp > 255)
            return X86_ERR(f, PDLKIT_UNSUPPORTED, "x_zp %lld outside the activations' dtype", (long long)*zp);
        if ((*own = qg_dyn_terms(h, *zp)) == NULL)
            return X86_ERR(f, PDLKIT_INTERNAL, "no memory for [%lld] column terms", (long long)h->n);
        return PDLKIT_OK;
    }
    const pdlkit_attribute *xs = x86_attr(f->attrs, f->num_attrs, "x_scale", PDLKIT_KIND_FLOAT);
    const pdlkit_attribute *xz = x86_attr(f->attrs, f->num_attrs, "x_zp", PDLKIT_KIND_INT);
    if (!xs || !xz) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "needs x_scale (float) and x_zp (int)");
    if (xz->i != h->x_zp)
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "x_zp %lld, but w_q was packed for %lld",
                       (long long)xz->i, (long long)h->x_zp);
    *scale = xs->f, *zp = xz->i;
    return PDLKIT_OK;
}

static int32_t qg_params(const pdlkit_call_frame *f, const x86_pack_header *h, const DLTensor *x,
                         int mode, int dyn, pdlkit_qgemm_params *p, int32_t **own) {
    const int s8 = pdlkit_dtype_is(x->dtype, kDLInt, 8);
    if (!s8 && !pdlkit_dtype_is(x->dtype, kDLUInt, 8))
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "x_q must be uint8 or int8");
    double xs;
    int64_t xz;
    const int32_t st = qg_xparams(f, h, dyn, s8, &xs, &xz, own);
    if (st != PDLKIT_OK) return st;
    const int32_t *cc = *own ? *own : qg_colcorr(h);
    memset(p, 0, sizeof(*p));
    p->n = h->n, p->k = h->k, p->packed = (const int8_t *)(h + 1);
    p->colcorr = s8 ? cc + h->n : cc;
    p->colcorr_ss = s8 ? cc + 2 * h->n : NULL;
    p->flags = (int32_t)(h->flags & QG_AMX) | (s8 ? QG_S8 : 0);
    p->x_scale = xs, p->x_zp = (int32_t)xz;
    p->out_kind = OUT_F32;
    if (mode == MODE_F32 || mode == MODE_Q) {
        const pdlkit_attribute *op = x86_attr(f->attrs, f->num_attrs, "post_op", PDLKIT_KIND_STRING);
        p->act = op ? x86_act(op->s, x86_attr(f->attrs, f->num_attrs, "algorithm", PDLKIT_KIND_STRING)) : -1;
        if (p->act < 0) return X86_ERR(f, PDLKIT_UNSUPPORTED, "post op not none / relu / gelu(none | tanh)");
    }
    if (mode == MODE_Q || mode == MODE_LN_Q) {
        const int sgn = qg_range(f, p);
        if (sgn < 0) return X86_ERR(f, PDLKIT_UNSUPPORTED, "output range not within [0, 255] or [-128, 127]");
        if (mode == MODE_Q) p->out_kind = sgn ? OUT_S8 : OUT_U8;
    }
    return PDLKIT_OK;
}

/* w_scale / w_zp as the [n] vectors the GEMM reads: the tensors (per-channel ops) or, for the
 * per-tensor ops, their numbers spread over *own (freed by the caller). */
static int32_t qg_vectors(const pdlkit_call_frame *f, const DLTensor *scale, const DLTensor *zp,
                          int64_t n, const float **ws, const int64_t **wz, void **own) {
    *own = NULL;
    if (scale != NULL) {
        if (!x86_vector(scale, n, kDLFloat, 32) || !x86_vector(zp, n, kDLInt, 64))
            return X86_ERR(f, PDLKIT_UNSUPPORTED, "w_scale / w_zp must be %lld contiguous float32 / int64",
                           (long long)n);
        *ws = (const float *)x86_data(scale), *wz = (const int64_t *)x86_data(zp);
        return PDLKIT_OK;
    }
    const pdlkit_attribute *s = x86_attr(f->attrs, f->num_attrs, "w_scale", PDLKIT_KIND_FLOAT);
    const pdlkit_attribute *z = x86_attr(f->attrs, f->num_attrs, "w_zp", PDLKIT_KIND_INT);
    if (!s || !z) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "needs w_scale (float) and w_zp (int)");
    char *buf = (char *)malloc((size_t)(n > 0 ? n : 1) * (sizeof(float) + (z->i ? 8 : 0)) + 8);
    if (buf == NULL) return X86_ERR(f, PDLKIT_INTERNAL, "no memory for [%lld] weight scales", (long long)n);
    float *sv = (float *)buf;
    int64_t *zv = z->i ? (int64_t *)(buf + 4 * n + (n & 1) * 4) : NULL;
    for (int64_t j = 0; j < n; j++) sv[j] = (float)s->f;
    for (int64_t j = 0; zv && j < n; j++) zv[j] = z->i;
    *ws = sv, *wz = zv, *own = buf;
    return PDLKIT_OK;
}

/* A failed return of qgemm_run / qgemm_run_add_ln as the call's status and message. */
static int32_t qg_failed(const pdlkit_call_frame *f, int rc, const pdlkit_qgemm_params *p) {
    const int64_t xz = p->x_zp + (p->flags & QG_S8 ? 128 : 0), a = xz > 255 - xz ? xz : 255 - xz;
    switch (rc) {
    case 1: return X86_ERR(f, PDLKIT_UNSUPPORTED, "this CPU has no AVX-512 VNNI");
    case 3:
        return X86_ERR(f, PDLKIT_UNSUPPORTED,
                       "a scale or bias is not finite, or so large that the epilogue could overflow "
                       "float32: the reference runs (its NaN / inf results are torch's)");
    case 4:
        return X86_ERR(f, PDLKIT_UNSUPPORTED,
                       "K = %lld is too long for exact int32 sums with these zero points: they "
                       "could overflow the int32 accumulator (exact up to K = %lld with x_zp %d and "
                       "symmetric weights; qgemm_vnni.c, k_fits)",
                       (long long)p->k, (long long)(2147483647 / ((a > 0 ? a : -a) * 128)), (int)p->x_zp);
    case 5:
        return X86_ERR(f, PDLKIT_UNSUPPORTED,
                       "a row of linear(x) + residual holds a NaN, an infinity or a value past about "
                       "1.8e19, where torch's LayerNorm gives NaN: the reference runs");
    case -1: return X86_ERR(f, PDLKIT_INTERNAL, "qgemm_vnni: out of memory");
    default: return X86_ERR(f, PDLKIT_INTERNAL, "qgemm_vnni: parameters out of range (rc %d)", rc);
    }
}

/* The add + LayerNorm part of a call: residual (float32, the output's shape), the LayerNorm's
 * weight and bias ([n] float32 or absent), its eps and (mode LN_Q) the codes' quantization. */
static int32_t qg_ln_args(const pdlkit_call_frame *f, int64_t n, int mode, pdlkit_qgemm_ln_args *a) {
    const DLTensor *res = &f->inputs[5], *y = &f->outputs[0], *g = &f->inputs[6], *b = &f->inputs[7];
    int same = res->ndim == y->ndim && pdlkit_dtype_is(res->dtype, kDLFloat, 32);
    char b1[256], b2[256];
    for (int32_t d = 0; same && d < y->ndim; d++) same = res->shape[d] == y->shape[d];
    if (!same)
        return X86_ERR(f, PDLKIT_UNSUPPORTED, "residual %s, output %s: not float32 of the output's shape",
                       x86_ints(b1, sizeof(b1), res->shape, (size_t)res->ndim, '('),
                       x86_ints(b2, sizeof(b2), y->shape, (size_t)y->ndim, '('));
    const pdlkit_attribute *ns = x86_attr(f->attrs, f->num_attrs, "normalized_shape", PDLKIT_KIND_INT_LIST);
    const pdlkit_attribute *eps = x86_attr(f->attrs, f->num_attrs, "eps", PDLKIT_KIND_FLOAT);
    if (!ns || !eps) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "needs normalized_shape and eps");
    if (ns->num_ints != 1 || ns->ints[0] != n)
        return X86_ERR(f, PDLKIT_UNSUPPORTED, "layer_norm over %s, not the GEMM's row [%lld]",
                       x86_ints(b1, sizeof(b1), ns->ints, ns->num_ints, '['), (long long)n);
    if ((!pdlkit_is_none(g) && !x86_vector(g, n, kDLFloat, 32)) || (!pdlkit_is_none(b) && !x86_vector(b, n, kDLFloat, 32)))
        return X86_ERR(f, PDLKIT_UNSUPPORTED, "LayerNorm weight / bias not %lld contiguous float32", (long long)n);
    pdlkit_qgemm_params q;
    memset(a, 0, sizeof(*a));
    a->gamma = pdlkit_is_none(g) ? NULL : (const float *)x86_data(g);
    a->beta = pdlkit_is_none(b) ? NULL : (const float *)x86_data(b);
    a->eps = eps->f;
    a->inv_scale = 1.0f;
    if (mode == MODE_LN_Q) {
        qg_range(f, &q); /* qg_params checked it */
        a->inv_scale = q.inv_out_scale, a->zp = q.out_zp, a->qmin = q.qmin, a->qmax = q.qmax;
    }
    return PDLKIT_OK;
}

/* Tensor inputs of a qlinear-family kernel: x_q, w_q, [w_scale, w_zp,] bias[, the add +
 * LayerNorm's three]; qlinear_dynamic (dyn) has x_scale and x_zp after x_q. */
static size_t qg_inputs(int mode, int wpt, int dyn) {
    return (size_t)(mode >= MODE_LN ? 8 : wpt ? 3 : 5) + (dyn ? 2 : 0);
}

/* One call of a qlinear-family kernel. wpt: the weight's scale and zero point are numbers
 * (qlinear_pt / qlinear_q_pt), not [n] tensors; dyn: the activation's are tensors of this call
 * (qlinear_dynamic). */
static int32_t qg_run(const pdlkit_call_frame *f, int mode, int wpt, int dyn) {
    const size_t want = qg_inputs(mode, wpt, dyn), o = dyn ? 2 : 0;
    if (f->num_inputs != want || f->num_outputs != (mode == MODE_LN_Q ? 2u : 1u))
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "expects %zu tensor inputs", want);
    const DLTensor *x = &f->inputs[0], *bias = &f->inputs[o + (wpt ? 2 : 4)], *y = &f->outputs[0];
    const x86_pack_header *h = x86_packed(&f->inputs[o + 1], QG_MAGIC);
    if (h == NULL) return X86_ERR(f, PDLKIT_UNSUPPORTED, "w_q was not packed by qgemm_vnni.c");
    if (x->ndim < 1 || x->shape[x->ndim - 1] != h->k)
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "x_q must be [..., %lld]", (long long)h->k);
    pdlkit_qgemm_params p;
    pdlkit_qgemm_ln_args ln;
    const float *ws = NULL;
    const int64_t *wz = NULL;
    void *own = NULL, *copy = NULL;
    int32_t *terms = NULL; /* a dynamic call's column terms */
    int32_t st = qg_params(f, h, x, mode, dyn, &p, &terms);
    if (st == PDLKIT_OK && mode >= MODE_LN) st = qg_ln_args(f, h->n, mode, &ln);
    if (st == PDLKIT_OK && !pdlkit_is_none(bias) && !x86_vector(bias, h->n, kDLFloat, 32))
        st = X86_ERR(f, PDLKIT_UNSUPPORTED, "bias must be %lld contiguous float32 values", (long long)h->n);
    if (st == PDLKIT_OK)
        st = qg_vectors(f, wpt ? NULL : &f->inputs[o + 2], wpt ? NULL : &f->inputs[o + 3], h->n, &ws,
                        &wz, &own);
    int64_t m, ldx, mr, ldr = h->n;
    if (st == PDLKIT_OK && x86_rows(x, &m, &ldx) != 0 && (copy = x86_compact(x, 1)) == NULL)
        st = X86_ERR(f, PDLKIT_INTERNAL, "no memory for a copy of x_q");
    if (st != PDLKIT_OK) {
        free(own);
        free(terms);
        return st;
    }
    const uint8_t *xd = copy ? (const uint8_t *)copy : (const uint8_t *)x86_data(x);
    const float *b = pdlkit_is_none(bias) ? NULL : (const float *)x86_data(bias);
    int rc;
    if (mode < MODE_LN) {
        rc = QG_RUN(xd, m, ldx, x86_data(y), h->n, ws, b, wz, &p);
    } else {
        const DLTensor *res = &f->inputs[5];
        void *rcopy = NULL; /* a residual no row stride describes */
        if (x86_rows(res, &mr, &ldr) != 0 && (rcopy = x86_compact(res, 4)) == NULL)
            rc = -1;
        else
            rc = qgemm_run_add_ln(xd, m, ldx, (float *)x86_data(y), h->n, ws, b, wz, &p, &ln,
                                  rcopy ? (const float *)rcopy : (const float *)x86_data(res), ldr,
                                  mode == MODE_LN_Q ? x86_data(&f->outputs[1]) : NULL, h->n);
        free(rcopy);
    }
    free(copy);
    free(own);
    free(terms);
    return rc == 0 ? PDLKIT_OK : qg_failed(f, rc, &p);
}

static int32_t qg_meta(const pdlkit_meta_frame *f, int mode, int wpt, int dyn) {
    const size_t want = qg_inputs(mode, wpt, dyn);
    if (f->num_inputs != want) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "expects %zu tensor inputs", want);
    DLDataType dt = {kDLFloat, 32, 1};
    int32_t st = x86_linear_meta(f, dyn ? 3 : 1, dt);
    if (st != PDLKIT_OK || (mode != MODE_Q && mode != MODE_LN_Q)) return st;
    const pdlkit_attribute *qmin = x86_attr(f->attrs, f->num_attrs, "out_qmin", PDLKIT_KIND_INT);
    if (qmin == NULL) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "no int attribute out_qmin");
    dt.code = qmin->i >= 0 ? kDLUInt : kDLInt;
    dt.bits = 8;
    DLTensor *codes = &f->outputs[mode == MODE_LN_Q ? 1 : 0];
    if (mode == MODE_LN_Q) {
        codes->ndim = f->outputs[0].ndim;
        for (int32_t d = 0; d < codes->ndim; d++) codes->shape[d] = f->outputs[0].shape[d];
    }
    codes->dtype = dt;
    return PDLKIT_OK;
}

/* ---------------------------------------------------------------- qkv_attention_q_merged */

#include "attention_core.h" /* attention.c's attention: attn_params, layout_of, execute, has_isa */

/* wq with wk and wv (prepack_with, ABI 1.2) as one [3 N, K] GEMM weight, whose float32 output
 * rows hold q | k | v side by side; packed for AMX tiles (QG_AMX), which each batch's GEMM uses
 * where qgemm_uses_amx says so (the tiles granted, K % 64 == 0, S >= 32: bert-mini's 64 x 256 x
 * 768 per batch), else the VNNI path: the same sums either way. */
static int32_t qkv_prepack(pdlkit_prepack_frame *f) {
    const DLTensor *wq = f->weight;
    const pdlkit_attribute *zp = x86_attr(f->attrs, f->num_attrs, "x_zp", PDLKIT_KIND_INT);
    if (zp == NULL) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "no int attribute x_zp");
    if (f->struct_size < sizeof(*f) || f->num_with != 2) /* a host below ABI 1.2 */
        return X86_ERR(f, PDLKIT_UNSUPPORTED, "needs wk and wv packed with wq (ABI 1.2 prepack_with)");
    const DLTensor *w3[3] = {wq, &f->with[0], &f->with[1]};
    for (int i = 0; i < 3; i++)
        if (!pdlkit_dtype_is(w3[i]->dtype, kDLInt, 8) || w3[i]->ndim != 2 || !pdlkit_is_contiguous(w3[i]) ||
            w3[i]->shape[0] != wq->shape[0] || w3[i]->shape[1] != wq->shape[1] || wq->shape[1] == 0)
            return X86_ERR(f, PDLKIT_UNSUPPORTED, "Q, K, V weights are not one [N, K > 0] int8 shape");
    const int64_t n = wq->shape[0], k = wq->shape[1];
    int32_t st;
    x86_pack_header *h = x86_pack_begin(f, QG_MAGIC, QG_AMX, 3 * n, k, qg_packed_bytes(3 * n, k), &st);
    if (h == NULL) return st;
    int8_t *cat = (int8_t *)malloc((size_t)(3 * n * k));
    if (cat == NULL) return X86_ERR(f, PDLKIT_INTERNAL, "no memory to join the Q, K, V weights");
    for (int i = 0; i < 3; i++) memcpy(cat + i * n * k, x86_data(w3[i]), (size_t)(n * k));
    qg_fill(h, cat, k, zp->i);
    free(cat);
    return PDLKIT_OK;
}

/* The attention's parameters for [b, s] activations whose projections' rows are q | k | v
 * (head views of one batch's [s, 3 n] GEMM output), codes stored as [b, s, n]; the mask's
 * geometry; the quantization. */
static int32_t qkv_attn(const pdlkit_call_frame *f, int64_t b, int64_t s, int64_t n, attn_params *a) {
    const pdlkit_attribute *hs = x86_attr(f->attrs, f->num_attrs, "head_shape", PDLKIT_KIND_INT_LIST);
    const pdlkit_attribute *causal = x86_attr(f->attrs, f->num_attrs, "is_causal", PDLKIT_KIND_INT);
    const pdlkit_attribute *scale = x86_attr(f->attrs, f->num_attrs, "scale", PDLKIT_KIND_FLOAT);
    const pdlkit_attribute *os = x86_attr(f->attrs, f->num_attrs, "out_scale", PDLKIT_KIND_FLOAT);
    if (!hs || !causal || !scale || !os) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "missing attributes");
    const int64_t d = hs->num_ints == 4 ? hs->ints[3] : -1;
    if (d <= 0 || n % d || (hs->ints[2] != -1 && hs->ints[2] != n / d))
        return X86_ERR(f, PDLKIT_UNSUPPORTED, "the view head_shape does not split N = %lld into heads",
                       (long long)n);
    if ((hs->ints[0] != -1 && hs->ints[0] != b) || (hs->ints[1] != -1 && hs->ints[1] != s))
        return X86_ERR(f, PDLKIT_UNSUPPORTED, "the view head_shape of [%lld, %lld, %lld]", (long long)b,
                       (long long)s, (long long)n);
    if (!(os->f > 0.0) || !isfinite(os->f)) return X86_ERR(f, PDLKIT_UNSUPPORTED, "out_scale %g", os->f);
    pdlkit_qgemm_params q;
    if (qg_range(f, &q) < 0) return X86_ERR(f, PDLKIT_UNSUPPORTED, "output range not within [0, 255] or [-128, 127]");
    memset(a, 0, sizeof(*a));
    a->B = b, a->H = n / d, a->Sq = a->Sk = s, a->D = d;
    a->scale = (float)(scale->f > 0.0 ? scale->f : 1.0 / sqrt((double)d));
    a->inv_out_scale = q.inv_out_scale, a->zp = q.out_zp, a->qmin = q.qmin, a->qmax = q.qmax;
    a->causal = causal->i != 0;
    int64_t *st3[3] = {a->qs, a->ks, a->vs};
    for (int i = 0; i < 3; i++) st3[i][0] = 0, st3[i][1] = d, st3[i][2] = 3 * n;
    a->os[0] = s * n, a->os[1] = d, a->os[2] = n; /* out[b, i, h d + j] */
    const DLTensor *m = &f->inputs[13];
    if (pdlkit_is_none(m)) return PDLKIT_OK;
    const int64_t want[4] = {b, a->H, s, s};
    if (m->ndim != 4 || (!pdlkit_dtype_is(m->dtype, kDLBool, 8) && !pdlkit_dtype_is(m->dtype, kDLFloat, 32)))
        return X86_ERR(f, PDLKIT_UNSUPPORTED, "attn_mask is not a 4-D bool or float32 tensor");
    for (int i = 0; i < 4; i++) {
        if (m->shape[i] != 1 && m->shape[i] != want[i])
            return X86_ERR(f, PDLKIT_UNSUPPORTED, "attn_mask dim %d is %lld, not 1 or %lld", i,
                           (long long)m->shape[i], (long long)want[i]);
        a->ms[i] = m->shape[i] == 1 ? 0 : m->strides[i];
    }
    if (s == 1) a->ms[3] = 1; /* one column: its stride is irrelevant */
    a->mask_float = pdlkit_dtype_is(m->dtype, kDLFloat, 32);
    a->mask = (const uint8_t *)x86_data(m);
    return PDLKIT_OK;
}

/* The three projections' (w_scale, bias, w_zp) joined as [3 n] vectors in *own. */
static int32_t qkv_vectors(const pdlkit_call_frame *f, int64_t n, float **ws, float **bias, int64_t **wz,
                           void **own) {
    char *buf = (char *)malloc((size_t)(3 * n) * 16);
    if (buf == NULL) return X86_ERR(f, PDLKIT_INTERNAL, "no memory for the joined vectors");
    *wz = (int64_t *)buf, *ws = (float *)(buf + 24 * n), *bias = *ws + 3 * n, *own = buf;
    for (int i = 0; i < 3; i++) { /* inputs (w, s, z, b) of q, k, v start at 1, 5, 9 */
        const DLTensor *s = &f->inputs[2 + 4 * i], *z = &f->inputs[3 + 4 * i], *b = &f->inputs[4 + 4 * i];
        if (!x86_vector(s, n, kDLFloat, 32) || !x86_vector(z, n, kDLInt, 64) ||
            (!pdlkit_is_none(b) && !x86_vector(b, n, kDLFloat, 32))) {
            free(buf);
            return X86_ERR(f, PDLKIT_UNSUPPORTED, "scales, zero points, biases not [%lld] contiguous", (long long)n);
        }
        memcpy(*ws + i * n, x86_data(s), (size_t)n * 4);
        memcpy(*wz + i * n, x86_data(z), (size_t)n * 8);
        if (pdlkit_is_none(b)) memset(*bias + i * n, 0, (size_t)n * 4);
        else memcpy(*bias + i * n, x86_data(b), (size_t)n * 4);
    }
    return PDLKIT_OK;
}

/* The Q, K and V projections and the attention of one batch after another, so that each
 * batch's q | k | v rows (s x 3 n float32) stay in L2 between the GEMM that writes them and the
 * attention that reads them. 0, or the status of what failed. */
static int32_t qkv_batches(const pdlkit_call_frame *f, const uint8_t *x, int64_t ldx, const attn_params *tmpl,
                           const pdlkit_qgemm_params *p, const float *ws, const float *bias, const int64_t *wz) {
    const int64_t s = tmpl->Sq, n = tmpl->H * tmpl->D;
    const size_t ws_size = layout_of(tmpl->Sk, tmpl->D).total, esize = tmpl->mask_float ? 4 : 1;
    /* one batch's q | k | v rows, then the attention's scratch: in the host's workspace (one
     * per thread, reused, 64-byte aligned) where they fit, else allocated for this call */
    const size_t rows = ((size_t)(s * 3 * n) * 4 + 63) / 64 * 64;
    char *own = f->workspace_size >= rows + ws_size ? NULL : (char *)aligned_alloc(64, rows + ws_size);
    char *base = own != NULL ? own : (char *)f->workspace;
    float *scratch = (float *)base;
    char *att = base + rows;
    int rc = own != NULL || f->workspace_size >= rows + ws_size ? 0 : -1, e = 0;
    attn_params a = *tmpl;
    a.B = 1, a.q = scratch, a.k = scratch + n, a.v = scratch + 2 * n;
    for (int64_t b = 0; b < tmpl->B && rc == 0 && e == 0; b++) {
        rc = qgemm_run(x + b * s * ldx, s, ldx, scratch, 3 * n, ws, bias, wz, p);
        a.mask = tmpl->mask != NULL ? tmpl->mask + b * tmpl->ms[0] * (int64_t)esize : NULL;
        a.out = tmpl->out + b * tmpl->os[0];
        if (rc == 0) e = execute(&a, att, ws_size);
    }
    free(own);
    if (rc != 0) return qg_failed(f, rc, p);
    if (e > 0)
        return X86_ERR(f, PDLKIT_UNSUPPORTED,
                       "a value of q, k, v, a score or the mask is not finite (NaN or inf; a mask's "
                       "-inf is fine): the reference runs, whose NaN / inf results are torch's");
    return e < 0 ? X86_ERR(f, PDLKIT_INTERNAL, "no memory for the attention's scratch") : PDLKIT_OK;
}

static int32_t qkv_run(const pdlkit_call_frame *f) {
    if (f->num_inputs != 14 || f->num_outputs != 1)
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "expects 14 tensor inputs and one output");
    const DLTensor *x = &f->inputs[0];
    const x86_pack_header *h = x86_packed(&f->inputs[1], QG_MAGIC);
    if (h == NULL || h->n % 3) return X86_ERR(f, PDLKIT_UNSUPPORTED, "wq was not packed by qgemm_vnni.c");
    if (x->ndim != 3 || x->shape[2] != h->k)
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "x_q must be [B, S, %lld]", (long long)h->k);
    if (!has_vnni() || !has_isa()) return X86_ERR(f, PDLKIT_UNSUPPORTED, "this CPU lacks AVX-512 VNNI / AVX512_BF16");
    const int64_t b = x->shape[0], s = x->shape[1], n = h->n / 3;
    pdlkit_qgemm_params p;
    attn_params a;
    int32_t *none = NULL; /* static activations: no per-call column terms */
    int32_t st = qg_params(f, h, x, MODE_LN, 0, &p, &none); /* the GEMM: float32, no activation */
    if (st == PDLKIT_OK) st = qkv_attn(f, b, s, n, &a);
    if (st != PDLKIT_OK || b * s == 0) return st;
    a.out = (int8_t *)x86_data(&f->outputs[0]);
    float *ws = NULL, *bias = NULL;
    int64_t *wz = NULL, m, ldx;
    void *own = NULL, *copy = NULL;
    if ((st = qkv_vectors(f, n, &ws, &bias, &wz, &own)) != PDLKIT_OK) return st;
    if (x86_rows(x, &m, &ldx) != 0 && (copy = x86_compact(x, 1)) == NULL) {
        free(own);
        return X86_ERR(f, PDLKIT_INTERNAL, "no memory for a copy of x_q");
    }
    st = qkv_batches(f, copy ? (const uint8_t *)copy : (const uint8_t *)x86_data(x), ldx, &a, &p, ws, bias, wz);
    free(copy);
    free(own);
    return st;
}

static int32_t qkv_meta(const pdlkit_meta_frame *f) {
    if (f->num_inputs != 14) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "expects 14 tensor inputs");
    const pdlkit_attribute *qmin = x86_attr(f->attrs, f->num_attrs, "out_qmin", PDLKIT_KIND_INT);
    if (qmin == NULL) return X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "no int attribute out_qmin");
    const DLDataType dt = {qmin->i >= 0 ? kDLUInt : kDLInt, 8, 1};
    int32_t st = x86_linear_meta(f, 1, dt); /* [B, S, N] */
    return st;
}

static int32_t qg_prepack_vnni(pdlkit_prepack_frame *f) { return qg_prepack(f, 0); }
static int32_t qg_prepack_amx(pdlkit_prepack_frame *f) { return qg_prepack(f, QG_AMX); }
static int32_t qg_prepack_vnni_dyn(pdlkit_prepack_frame *f) { return qg_prepack(f, QG_DYN); }
static int32_t qg_prepack_amx_dyn(pdlkit_prepack_frame *f) { return qg_prepack(f, QG_AMX | QG_DYN); }
#define QG_FUNCS(SUFFIX, MODE, WPT, DYN)                                                             \
    static int32_t qg_meta_##SUFFIX(const pdlkit_meta_frame *f) { return qg_meta(f, MODE, WPT, DYN); } \
    static int32_t qg_run_##SUFFIX(const pdlkit_call_frame *f) { return qg_run(f, MODE, WPT, DYN); }
QG_FUNCS(f32, MODE_F32, 0, 0)
QG_FUNCS(q, MODE_Q, 0, 0)
QG_FUNCS(f32_pt, MODE_F32, 1, 0)
QG_FUNCS(q_pt, MODE_Q, 1, 0)
QG_FUNCS(ln, MODE_LN, 0, 0)
QG_FUNCS(ln_q, MODE_LN_Q, 0, 0)
QG_FUNCS(dyn, MODE_F32, 0, 1)
QG_FUNCS(dyn_pt, MODE_F32, 1, 1)

static const DLDataType kU8S8[] = {{kDLUInt, 8, 1}, {kDLInt, 8, 1}};
static const DLDataType kS8[] = {{kDLInt, 8, 1}};
static const DLDataType kF32[] = {{kDLFloat, 32, 1}};
static const DLDataType kI64[] = {{kDLInt, 64, 1}};
static const DLDataType kF64F32[] = {{kDLFloat, 64, 1}, {kDLFloat, 32, 1}};
static const DLDataType kI64I32[] = {{kDLInt, 64, 1}, {kDLInt, 32, 1}};
static const int32_t kRank1[] = {1}, kRank2[] = {2};
#define QG_ARG(name, kind) {sizeof(pdlkit_arg_desc), name, kind, NULL, 0, NULL, 0, NULL, NULL, 0, 0, 0, 0}
#define QG_TENSOR(name, dt, ranks, nranks, optional)                                                  \
    {sizeof(pdlkit_arg_desc), name, PDLKIT_KIND_TENSOR, dt, sizeof(dt) / sizeof(dt[0]), ranks,        \
     nranks, NULL, NULL, 0, 0, 0, optional}
#define QG_X QG_TENSOR("x_q", kU8S8, NULL, 0, 0), QG_ARG("x_scale", PDLKIT_KIND_FLOAT), QG_ARG("x_zp", PDLKIT_KIND_INT)
#define QG_XDYN QG_TENSOR("x_q", kU8S8, NULL, 0, 0), QG_TENSOR("x_scale", kF64F32, NULL, 0, 0), \
    QG_TENSOR("x_zp", kI64I32, NULL, 0, 0)
#define QG_W QG_TENSOR("w_q", kS8, kRank2, 1, 0), QG_TENSOR("w_scale", kF32, kRank1, 1, 0), QG_TENSOR("w_zp", kI64, kRank1, 1, 0)
#define QG_W_PT QG_TENSOR("w_q", kS8, kRank2, 1, 0), QG_ARG("w_scale", PDLKIT_KIND_FLOAT), QG_ARG("w_zp", PDLKIT_KIND_INT)
#define QG_BIAS QG_TENSOR("bias", kF32, NULL, 0, 1)
#define QG_OUT QG_ARG("out_scale", PDLKIT_KIND_FLOAT), QG_ARG("out_zp", PDLKIT_KIND_INT), \
    QG_ARG("out_qmin", PDLKIT_KIND_INT), QG_ARG("out_qmax", PDLKIT_KIND_INT)
#define QG_POST QG_ARG("post_op", PDLKIT_KIND_STRING), QG_ARG("algorithm", PDLKIT_KIND_STRING)
#define QG_LN QG_TENSOR("residual", kF32, NULL, 0, 0), QG_ARG("normalized_shape", PDLKIT_KIND_INT_LIST), \
    QG_TENSOR("ln_weight", kF32, NULL, 0, 1), QG_TENSOR("ln_bias", kF32, NULL, 0, 1), QG_ARG("eps", PDLKIT_KIND_FLOAT)

/* The schemas of the logical ops (kernels/ops/logical_ops.py). */
static const pdlkit_arg_desc kQlinear[] = {QG_X, QG_W, QG_BIAS, QG_POST};
static const pdlkit_arg_desc kQlinearQ[] = {QG_X, QG_W, QG_BIAS, QG_OUT, QG_POST};
static const pdlkit_arg_desc kQlinearPt[] = {QG_X, QG_W_PT, QG_BIAS, QG_POST};
static const pdlkit_arg_desc kQlinearQPt[] = {QG_X, QG_W_PT, QG_BIAS, QG_OUT, QG_POST};
static const pdlkit_arg_desc kQlinearLn[] = {QG_X, QG_W, QG_BIAS, QG_LN};
static const pdlkit_arg_desc kQlinearLnQ[] = {QG_X, QG_W, QG_BIAS, QG_LN, QG_OUT};
static const pdlkit_arg_desc kQlinearDyn[] = {QG_XDYN, QG_W, QG_BIAS, QG_POST};
static const pdlkit_arg_desc kQlinearDynPt[] = {QG_XDYN, QG_W_PT, QG_BIAS, QG_POST};
static const char *const kIsaQ[] = {"avx512f", "avx512_vnni", "amx_tile", "amx_int8"};
static const char *const kIsaQkv[] = {"avx512f", "avx512_vnni", "avx512_bf16"};
static const DLDataType kU8[] = {{kDLUInt, 8, 1}};
static const DLDataType kMask[] = {{kDLBool, 8, 1}, {kDLFloat, 32, 1}};
static const int32_t kRank3[] = {3}, kRank4[] = {4};
#define QG_PROJ(w, s, z, b) QG_TENSOR(w, kS8, kRank2, 1, 0), QG_TENSOR(s, kF32, NULL, 0, 0), \
    QG_TENSOR(z, kI64, NULL, 0, 0), QG_TENSOR(b, kF32, NULL, 0, 1)
static const pdlkit_arg_desc kQkv[] = {
    QG_TENSOR("x_q", kU8, kRank3, 1, 0), QG_ARG("x_scale", PDLKIT_KIND_FLOAT), QG_ARG("x_zp", PDLKIT_KIND_INT),
    QG_PROJ("wq", "sq", "zq", "bq"), QG_PROJ("wk", "sk", "zk", "bk"), QG_PROJ("wv", "sv", "zv", "bv"),
    QG_ARG("head_shape", PDLKIT_KIND_INT_LIST), QG_TENSOR("attn_mask", kMask, kRank4, 1, 1),
    QG_ARG("is_causal", PDLKIT_KIND_INT), QG_ARG("scale", PDLKIT_KIND_FLOAT), QG_OUT,
};
static const char *const kQkvWith[] = {"wk", "wv"};
/* bert-mini's and BERT-base's q | k | v rows of one batch (128 x 2304 float32) and attention
 * scratch fit; longer sequences allocate theirs per call */
#define QKV_WORKSPACE ((size_t)2 << 20)

#define QG_N(a) (sizeof(a) / sizeof(a[0]))
/* name, op, arguments, meta / run suffix, outputs, engine (0 VNNI, 1 AMX), doc */
/* name, op, arguments, meta / run suffix, outputs, engine (0 VNNI, 1 AMX), doc, pre-pack suffix
 * (empty, or _dyn) */
#define QG_DESC(name, op, args, fn, outs, amx, doc, pk)                                               \
    {sizeof(pdlkit_kernel_desc), name, 1, op, kDLCPU, amx ? 20 : 10, args, QG_N(args), kIsaQ,         \
     amx ? 4 : 2, 0, PDLKIT_TRAIT_DETERMINISTIC, outs, qg_meta_##fn, qg_run_##fn, doc, "w_q",        \
     amx ? qg_prepack_amx##pk : qg_prepack_vnni##pk, NULL, 0}
#define QG_ENGINES_PK(vnni, amx, op, args, fn, outs, doc, pk)                                         \
    QG_DESC(vnni, op, args, fn, outs, 0, doc " (AVX-512 VNNI).", pk),                                  \
    QG_DESC(amx, op, args, fn, outs, 1,                                                                \
            doc " (AMX tiles where K % 64 == 0 and M >= 32 and Linux grants them; else VNNI).", pk)
#define QG_ENGINES(vnni, amx, op, args, fn, outs, doc) QG_ENGINES_PK(vnni, amx, op, args, fn, outs, doc, )
static const pdlkit_kernel_desc kDescs[] = {
    QG_ENGINES("qlinear_q_vnni", "qlinear_q_amx", "qlinear_q", kQlinearQ, q, 1,
               "quantize(act(dequantize(x_q) @ dequantize(w_q).T + bias)) in one fused int8 GEMM"),
    QG_ENGINES("qlinear_vnni", "qlinear_amx", "qlinear", kQlinear, f32, 1,
               "act(dequantize(x_q) @ dequantize(w_q).T + bias) in float32, one fused int8 GEMM"),
    QG_ENGINES("qlinear_q_pt_vnni", "qlinear_q_pt_amx", "qlinear_q_pt", kQlinearQPt, q_pt, 1,
               "qlinear_q with a per-tensor weight scale and zero point (numbers)"),
    QG_ENGINES("qlinear_pt_vnni", "qlinear_pt_amx", "qlinear_pt", kQlinearPt, f32_pt, 1,
               "qlinear with a per-tensor weight scale and zero point (numbers)"),
    QG_ENGINES("qlinear_add_layer_norm_q_vnni", "qlinear_add_layer_norm_q_amx",
               "qlinear_add_layer_norm_q", kQlinearLnQ, ln_q, 2,
               "(y, quantize(y)), y = layer_norm(qlinear(x) + residual): one int8 GEMM whose row "
               "blocks finish with the add, the LayerNorm and the codes while in L1"),
    QG_ENGINES("qlinear_add_layer_norm_vnni", "qlinear_add_layer_norm_amx", "qlinear_add_layer_norm",
               kQlinearLn, ln, 1, "layer_norm(qlinear(x) + residual) in one int8 GEMM"),
    QG_ENGINES_PK("qlinear_dynamic_vnni", "qlinear_dynamic_amx", "qlinear_dynamic", kQlinearDyn, dyn, 1,
                  "qlinear with the activation's scale and zero point tensors of each call "
                  "(choose_qparams), the weight's column terms scaled by the call's zero point",
                  _dyn),
    QG_ENGINES_PK("qlinear_dynamic_pt_vnni", "qlinear_dynamic_pt_amx", "qlinear_dynamic_pt", kQlinearDynPt,
                  dyn_pt, 1, "qlinear_dynamic with a per-tensor weight scale and zero point (numbers)",
                  _dyn),
    /* last: registered for hosts of ABI 1.2 and up (prepack_with) */
    {sizeof(pdlkit_kernel_desc), "qkv_attention_q_merged_vnni", 1, "qkv_attention_q_merged", kDLCPU, 10,
     kQkv, QG_N(kQkv), kIsaQkv, 3, QKV_WORKSPACE, PDLKIT_TRAIT_DETERMINISTIC, 1, qkv_meta, qkv_run,
     "The Q, K and V projections of a self-attention block as one int8 GEMM (N = 3 H D; VNNI, or AMX "
     "tiles where Linux grants them and the batch has 32 rows or more) into "
     "float32 rows q | k | v, then attention.c's AVX512_BF16 attention on head views of those rows, "
     "batch by batch while they are in L2; codes stored as [B, S, H * D]. wq is packed with wk and wv.",
     "wq", qkv_prepack, kQkvWith, 2},
};
#define QG_COUNT (sizeof(kDescs) / sizeof(kDescs[0]))
static const pdlkit_kernel_desc *kKernels[QG_COUNT];

PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration *out, char *error, size_t error_size) {
    PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size);
    if (host_minor < 1) /* optional bias, prepack */
        return pdlkit_error(error, error_size, PDLKIT_UNSUPPORTED,
                            "needs a host speaking pdlkit ABI >= 1.1 (prepack), got 1.%u", (unsigned)host_minor);
    qgemm_init(); /* the GELU tables, before any call from any thread */
    for (size_t i = 0; i < QG_COUNT; i++) kKernels[i] = &kDescs[i];
    out->kernels = kKernels;
    out->num_kernels = host_minor >= 2 ? QG_COUNT : QG_COUNT - 1; /* qkv: prepack_with */
    return PDLKIT_OK;
}
