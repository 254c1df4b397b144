/* int8 GEMM epilogue for PT2E qlinear on x86: int32 accumulators -> float -> activation ->
 * requantized uint8 / int8 (or float32).
 *
 * Not a pdlkit ABI library (no pdlkit_register): plain C functions that
 * kernels/x86/qlinear_intmm.py calls through ctypes around torch._int_mm. The GEMM there is
 * s8 x s8 -> s32 on activations shifted by -128 (u8 ^ 0x80, pdlkit_u8_to_s8 below), so
 *
 *   sum_k (x[m,k] - x_zp) * (w[n,k] - w_zp[n])
 *     = acc[m,n] + (128 - x_zp) * colsum_w[n]                 (exact in int32; colcorr below)
 *       - w_zp[n] * (rowsum_x[m] - K * x_zp)                   (only when some w_zp[n] != 0)
 *
 * then y = that * (x_scale * w_scale[n]) + bias[n], act(y), and
 * q = clamp(round_half_even(y * inv_out_scale) + out_zp, qmin, qmax) as torch's
 * quantize_per_tensor computes it (inv_out_scale = (float)(1.0 / out_scale)). The clamp is
 * applied in float before the rounding (same result for integer bounds, and no overflow
 * of the float -> int32 conversion).
 *
 * Method: one pass over the accumulators under per-function
 * target("avx512f,avx512bw,avx512vl") attributes, 16 columns per vector, 64 columns per
 * 64-byte store (vpackssdw / vpackuswb / vpermd), masked tails; a scalar fallback (libm
 * erff / tanhf / nearbyintf) is chosen at run time with __builtin_cpu_supports, so the
 * library loads on any x86-64 CPU. Per call, the per-column factors are folded once:
 * S[n] = x_scale * w_scale[n] * c, B[n] = bias[n] * c (c = inv_out_scale, or the GELU table's
 * index scale), so a column costs one int add, one convert and one FMA before the
 * activation. Rounding: vcvtps2dq with an explicit round-to-nearest-even mode, like
 * torch.round.
 *
 * GELU (both forms) is 0.5 y (1 + G(y)) with G odd: erf(y / sqrt 2), or
 * tanh(sqrt(2/pi) (y + 0.044715 y^3)). G(|y|) on [0, 4 sqrt 2) is 16 degree-4 polynomials,
 * one per interval of width 4 sqrt 2 / 15.5 ~ 0.365 (Chebyshev interpolants computed in
 * double at load time by gelu_tables_init, no magic constants), selected per lane with
 * vpermps: 5 permutes and 4 FMAs per 16 values, no division, no exp. Beyond 4 sqrt 2,
 * |1 - G| < 1.6e-8.
 *
 * Accuracy (float32, against double precision): |G - erf(y / sqrt 2)| <= 2.7e-7 and
 * |G - tanh(...)| <= 2.7e-7 over all y; the whole GELU is within 5.1e-7 absolute for
 * |y| <= 4 and 1.2e-6 (about one float32 ulp of y) up to |y| = 12
 * (tests/test_x86_intmm.py checks < 2e-6 relative on y in [-12, 12]). The requantized
 * outputs are within one code of PT2E's reference chain (which rounds its float GEMM
 * differently) and differ from it in under 0.001% of elements at 512 x 256 x 1024, as
 * oneDNN's do.
 *
 * Build (what pdlkit.runtime_abi.native_build.build_library(path, "x86_64") runs; no -m flags
 * needed):
 *   cc -O3 -shared -fPIC -Wall kernels/x86/int8_epilogue.c -lm -o libpdlkit_int8_epilogue.so
 */

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PDLKIT_X86 1
#else
#define PDLKIT_X86 0
#endif

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU_ERF = 2, ACT_GELU_TANH = 3 };
enum { OUT_U8 = 0, OUT_S8 = 1, OUT_F32 = 2 };

/* What stays fixed for one call site and weight (built once, at pre-pack time). */
typedef struct {
    int64_t n;              /* output columns (weight rows) */
    int64_t k;              /* reduction length */
    const int32_t *colcorr; /* [n]: (128 - x_zp) * sum_k w[n, k] */
    double x_scale;
    float inv_out_scale; /* (float)(1.0 / out_scale); unused for float32 output */
    int32_t x_zp;
    int32_t out_zp;
    int32_t qmin;
    int32_t qmax;
    int32_t act;      /* ACT_* */
    int32_t out_kind; /* OUT_* */
    int32_t pad_;
} pdlkit_qepi_params;

int pdlkit_qepi_params_size(void) { return (int)sizeof(pdlkit_qepi_params); }

/* ---------------------------------------------------------------- scalar reference path */

static float gelu_erf_scalar(float y) { return 0.5f * y * (1.0f + erff(y * 0.70710678118654752f)); }

static float gelu_tanh_scalar(float y) {
    float u = 0.7978845608028654f * (y + 0.044715f * y * y * y);
    return 0.5f * y * (1.0f + tanhf(u));
}

static float act_scalar(float y, int act) {
    switch (act) {
    case ACT_RELU: return y > 0.0f ? y : 0.0f;
    case ACT_GELU_ERF: return gelu_erf_scalar(y);
    case ACT_GELU_TANH: return gelu_tanh_scalar(y);
    default: return y;
    }
}

static void row_scalar(const int32_t *acc, int64_t n, const pdlkit_qepi_params *p,
                       const float *w_scale, const float *bias, void *out) {
    const float lo = (float)(p->qmin - p->out_zp), hi = (float)(p->qmax - p->out_zp);
    for (int64_t j = 0; j < n; j++) {
        float s = (float)p->x_scale * w_scale[j];
        float y = (float)(acc[j] + p->colcorr[j]) * s + (bias ? bias[j] : 0.0f);
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
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* GELU as 0.5 y (1 + G(y)), G odd: G(y) = erf(y / sqrt 2) (erf GELU) or
 * tanh(sqrt(2/pi) (y + 0.044715 y^3)) (tanh GELU). G(|y|) on [0, YMAX) is 16 degree-4
 * polynomials in v = |y| * VSCALE, one per interval [i - 1/2, i + 1/2) of v, i = 0..15, in the
 * local variable t = v - i (Chebyshev interpolants, built by gelu_tables_init below). Beyond
 * YMAX = 4 sqrt 2, |1 - G| < 1.6e-8. The interval index is round(v) (the magic-number trick);
 * the 16 coefficients of each degree fill one zmm register, selected with vpermps. */
#define GELU_DEG 4
#define GELU_YMAX 5.6568542494923802
#define GELU_VMAX 15.49f
static const double GELU_VSCALE = 15.5 / GELU_YMAX;
static float gelu_tab[2][GELU_DEG + 1][16] __attribute__((aligned(64)));
static volatile int gelu_ready;

static double g_erf(double y) { return erf(y * 0.70710678118654752440); }
static double g_tanh(double y) { return tanh(0.79788456080286535588 * (y + 0.044715 * y * y * y)); }

/* Chebyshev interpolation at DEG + 1 nodes per interval, converted to monomials in t. */
static void gelu_tables_init(void) {
    if (gelu_ready) return;
    enum { D = GELU_DEG, NP = GELU_DEG + 1 };
    for (int which = 0; which < 2; which++) {
        for (int i = 0; i < 16; i++) {
            double f[NP], a[NP], mono[NP] = {0}, tk[NP][NP] = {{0}};
            for (int j = 0; j < NP; j++) {
                const double t = 0.5 * cos(M_PI * (j + 0.5) / NP); /* s = 2t in [-1, 1] */
                const double y = (i + t) / GELU_VSCALE;
                f[j] = which ? g_tanh(y) : g_erf(y);
            }
            for (int k = 0; k < NP; k++) {
                double sum = 0;
                for (int j = 0; j < NP; j++) sum += f[j] * cos(M_PI * k * (j + 0.5) / NP);
                a[k] = sum * 2.0 / NP;
            }
            a[0] *= 0.5;
            /* tk[k] = monomial coefficients (in s) of T_k(s) */
            tk[0][0] = 1;
            tk[1][1] = 1;
            for (int k = 2; k < NP; k++)
                for (int e = 0; e < NP; e++)
                    tk[k][e] = (e ? 2 * tk[k - 1][e - 1] : 0) - tk[k - 2][e];
            for (int k = 0; k < NP; k++)
                for (int e = 0; e < NP; e++) mono[e] += a[k] * tk[k][e];
            for (int e = 0; e < NP; e++) gelu_tab[which][e][i] = (float)(mono[e] * ldexp(1.0, e));
        }
    }
    gelu_ready = 1; /* racing initializers write the same values */
}

/* G(y) for yv = y * GELU_VSCALE, sign included */
AVX512 static inline __m512 gelu_g16(__m512 yv, const float (*tab)[16]) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512 v = _mm512_min_ps(_mm512_abs_ps(yv), _mm512_set1_ps(GELU_VMAX));
    const __m512 w = _mm512_add_ps(v, _mm512_set1_ps(12582912.0f)); /* 1.5 * 2^23 */
    const __m512i idx = _mm512_castps_si512(w);                      /* low bits: round(v) */
    const __m512 t = _mm512_sub_ps(v, _mm512_sub_ps(w, _mm512_set1_ps(12582912.0f)));
    __m512 p = _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[4]));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[3])));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[2])));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[1])));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[0])));
    /* p ^ (yv & sign): the sign of y */
    return _mm512_castsi512_ps(
        _mm512_ternarylogic_epi32(_mm512_castps_si512(p), _mm512_castps_si512(yv), sign, 0x78));
}

/* 16 columns: y' = (acc + colcorr) * S + B with S, B pre-scaled per column (see
 * pdlkit_qepi_run), then the activation; the result is already multiplied by inv_out_scale
 * (quantized output) or not (float32). */
AVX512 static inline __m512 y16(__m512i acc, __m512i cc, __m512 s, __m512 b, int act, __m512 hk,
                                const float (*tab)[16]) {
    __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc, cc)), s, b);
    if (act == ACT_RELU) return _mm512_max_ps(y, _mm512_setzero_ps());
    if (act == ACT_GELU_ERF || act == ACT_GELU_TANH) {
        const __m512 h = _mm512_mul_ps(y, hk);
        return _mm512_fmadd_ps(h, gelu_g16(y, tab), h);
    }
    return y;
}

/* round half to even, clamp to [qmin, qmax] (in float: no overflow), as int32 */
AVX512 static inline __m512i q16(__m512 y, __m512 lo, __m512 hi, __m512i zp) {
    const __m512 v = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
    return _mm512_add_epi32(
        _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zp);
}

/* One row; the activation and output kind are constants after inlining. */
AVX512 static inline void row_avx512(const int32_t *acc, int64_t n, const pdlkit_qepi_params *p,
                                     const float *S, const float *B, void *out, int act,
                                     int kind, float hscale) {
    const __m512 lo = _mm512_set1_ps((float)(p->qmin - p->out_zp));
    const __m512 hi = _mm512_set1_ps((float)(p->qmax - p->out_zp));
    const __m512 hk = _mm512_set1_ps(hscale);
    const __m512i zp = _mm512_set1_epi32(p->out_zp);
    const int32_t *cc = p->colcorr;
    const float(*tab)[16] = gelu_tab[act == ACT_GELU_TANH];
    int64_t j = 0;
#define Y(J)                                                                              \
    y16(_mm512_loadu_si512(acc + (J)), _mm512_loadu_si512(cc + (J)), _mm512_loadu_ps(S + (J)), \
        _mm512_loadu_ps(B + (J)), act, hk, tab)
    if (kind == OUT_F32) {
        for (; j + 16 <= n; j += 16) _mm512_storeu_ps((float *)out + j, Y(j));
    } else {
        /* 64 columns -> one 64-byte store: int32 -> int16 -> 8-bit packs (saturating, but the
         * values are in range already) interleave the four 128-bit lanes; vpermd undoes it */
        const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        for (; j + 64 <= n; j += 64) {
            const __m512i a = q16(Y(j), lo, hi, zp), b = q16(Y(j + 16), lo, hi, zp);
            const __m512i c = q16(Y(j + 32), lo, hi, zp), d = q16(Y(j + 48), lo, hi, zp);
            const __m512i ab = _mm512_packs_epi32(a, b), cd = _mm512_packs_epi32(c, d);
            const __m512i r = kind == OUT_U8 ? _mm512_packus_epi16(ab, cd) : _mm512_packs_epi16(ab, cd);
            _mm512_storeu_si512((int8_t *)out + j, _mm512_permutexvar_epi32(order, r));
        }
        for (; j + 16 <= n; j += 16)
            _mm_storeu_si128((__m128i *)((int8_t *)out + j), _mm512_cvtepi32_epi8(q16(Y(j), lo, hi, zp)));
    }
#undef Y
    if (j < n) {
        const __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
        const __m512 y = y16(_mm512_maskz_loadu_epi32(m, acc + j), _mm512_maskz_loadu_epi32(m, cc + j),
                             _mm512_maskz_loadu_ps(m, S + j), _mm512_maskz_loadu_ps(m, B + j), act,
                             hk, tab);
        if (kind == OUT_F32)
            _mm512_mask_storeu_ps((float *)out + j, m, y);
        else
            _mm512_mask_cvtepi32_storeu_epi8((int8_t *)out + j, m, q16(y, lo, hi, zp));
    }
}

#define ROWS(ACT, KIND)                                                                      \
    for (int64_t i = 0; i < rows; i++)                                                       \
    row_avx512(acc + i * p->n, p->n, p, S, B, (char *)out + i * ldo * esize, ACT, KIND, hscale)

AVX512 static void rows_avx512(const int32_t *acc, int64_t rows, const pdlkit_qepi_params *p,
                               const float *S, const float *B, void *out, int64_t ldo,
                               float hscale) {
    const int64_t esize = p->out_kind == OUT_F32 ? 4 : 1;
    if (p->out_kind == OUT_F32) {
        switch (p->act) {
        case ACT_RELU: ROWS(ACT_RELU, OUT_F32); break;
        case ACT_GELU_ERF: ROWS(ACT_GELU_ERF, OUT_F32); break;
        case ACT_GELU_TANH: ROWS(ACT_GELU_TANH, OUT_F32); break;
        default: ROWS(ACT_NONE, OUT_F32); break;
        }
    } else if (p->out_kind == OUT_U8) {
        switch (p->act) {
        case ACT_RELU: ROWS(ACT_RELU, OUT_U8); break;
        case ACT_GELU_ERF: ROWS(ACT_GELU_ERF, OUT_U8); break;
        case ACT_GELU_TANH: ROWS(ACT_GELU_TANH, OUT_U8); break;
        default: ROWS(ACT_NONE, OUT_U8); break;
        }
    } else {
        switch (p->act) {
        case ACT_RELU: ROWS(ACT_RELU, OUT_S8); break;
        case ACT_GELU_ERF: ROWS(ACT_GELU_ERF, OUT_S8); break;
        case ACT_GELU_TANH: ROWS(ACT_GELU_TANH, OUT_S8); break;
        default: ROWS(ACT_NONE, OUT_S8); break;
        }
    }
}

AVX512 static void xor_avx512(const uint8_t *src, int64_t lds, int8_t *dst, int64_t m,
                              int64_t k) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int64_t i = 0; i < m; i++) {
        const uint8_t *s = src + i * lds;
        int8_t *d = dst + i * k;
        int64_t j = 0;
        for (; j + 64 <= k; j += 64)
            _mm512_storeu_si512(d + j, _mm512_xor_si512(_mm512_loadu_si512(s + j), flip));
        if (j < k) {
            const __mmask64 mk = (~0ULL) >> (64 - (k - j));
            _mm512_mask_storeu_epi8(d + j, mk, _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, s + j), flip));
        }
    }
}

static int has_avx512(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    }
    return cached;
}
#else
static int has_avx512(void) { return 0; }
#endif

/* ---------------------------------------------------------------- entry points */

/* Builds the GELU tables (call once before using the library from several threads);
 * returns 1 when the AVX-512 paths run on this CPU, 0 for the scalar fallback. */
int pdlkit_qepi_init(void) {
#if PDLKIT_X86
    gelu_tables_init();
#endif
    return has_avx512();
}

/* dst[m, k] (contiguous int8) = src[m, k] ^ 0x80 = src - 128, rows of src lds bytes apart. */
void pdlkit_u8_to_s8(const uint8_t *src, int64_t lds, int8_t *dst, int64_t m, int64_t k) {
#if PDLKIT_X86
    if (has_avx512()) {
        xor_avx512(src, lds, dst, m, k);
        return;
    }
#endif
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < k; j++) dst[i * k + j] = (int8_t)(src[i * lds + j] ^ 0x80);
}

/* Subtract w_zp[n] * (rowsum_x[m] - K * x_zp) from acc when some w_zp[n] != 0 (asymmetric
 * per-channel weights); returns at once otherwise. */
static void weight_zp_correction(int32_t *acc, int64_t rows, const pdlkit_qepi_params *p,
                                 const int64_t *w_zp, const uint8_t *x, int64_t ldx) {
    int64_t j, any = 0;
    for (j = 0; j < p->n; j++) any |= w_zp[j];
    if (!any) return;
    for (int64_t i = 0; i < rows; i++) {
        int64_t rs = 0;
        for (int64_t t = 0; t < p->k; t++) rs += x[i * ldx + t];
        const int32_t r = (int32_t)(rs - p->k * (int64_t)p->x_zp);
        for (j = 0; j < p->n; j++) acc[i * p->n + j] -= (int32_t)w_zp[j] * r;
    }
}

/* The epilogue over acc[rows, n] (contiguous int32, from _int_mm on x ^ 0x80): writes
 * out[rows, n] (row stride ldo elements) as uint8, int8 or float32 (p->out_kind).
 * w_scale: float32 [n]; bias: float32 [n] or NULL; w_zp: int64 [n] or NULL (= all zero), with
 * x (the original uint8 activations, row stride ldx) only read when some w_zp[n] != 0, in
 * which case acc is corrected in place. Returns 0. */
int pdlkit_qepi_run(int32_t *acc, int64_t rows, void *out, int64_t ldo, const float *w_scale,
                    const float *bias, const int64_t *w_zp, const uint8_t *x, int64_t ldx,
                    const pdlkit_qepi_params *p) {
    if (w_zp) weight_zp_correction(acc, rows, p, w_zp, x, ldx);
#if PDLKIT_X86
    if (has_avx512()) {
        /* per-column S = x_scale * w_scale * cs, B = bias * cs: cs = VSCALE for GELU (the
         * table's variable), inv_out_scale (quantized output) or 1 (float32) otherwise */
        const int gelu = p->act == ACT_GELU_ERF || p->act == ACT_GELU_TANH;
        const float inv = p->out_kind == OUT_F32 ? 1.0f : p->inv_out_scale;
        const float cs = gelu ? (float)GELU_VSCALE : inv;
        const float hscale = gelu ? 0.5f * inv / (float)GELU_VSCALE : 1.0f;
        float local[2 * 1024];
        float *S = p->n <= 1024 ? local : (float *)malloc(sizeof(float) * 2 * (size_t)p->n);
        if (S) {
            float *B = S + p->n;
            for (int64_t j = 0; j < p->n; j++) {
                S[j] = (float)p->x_scale * w_scale[j] * cs;
                B[j] = bias ? bias[j] * cs : 0.0f;
            }
            if (gelu && !gelu_ready) gelu_tables_init();
            rows_avx512(acc, rows, p, S, B, out, ldo, hscale);
            if (S != local) free(S);
            return 0;
        }
    }
#endif
    const int64_t esize = p->out_kind == OUT_F32 ? 4 : 1;
    for (int64_t i = 0; i < rows; i++)
        row_scalar(acc + i * p->n, p->n, p, w_scale, bias, (char *)out + i * ldo * esize);
    return 0;
}

/* The scalar path on purpose (tests compare the two paths). */
int pdlkit_qepi_run_scalar(int32_t *acc, int64_t rows, void *out, int64_t ldo,
                           const float *w_scale, const float *bias, const int64_t *w_zp,
                           const uint8_t *x, int64_t ldx, const pdlkit_qepi_params *p) {
    if (w_zp) weight_zp_correction(acc, rows, p, w_zp, x, ldx);
    const int64_t esize = p->out_kind == OUT_F32 ? 4 : 1;
    for (int64_t i = 0; i < rows; i++)
        row_scalar(acc + i * p->n, p->n, p, w_scale, bias, (char *)out + i * ldo * esize);
    return 0;
}
