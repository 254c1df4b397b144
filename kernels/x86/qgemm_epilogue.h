/* The epilogue of qgemm_vnni.c's int8 GEMMs, VNNI and AMX alike (included by qgemm_vnni.c
 * after its parameter struct and micro-kernels; not a header of its own to other files):
 * per 16 columns the zero-point correction, the folded scales and bias, ReLU / GELU and the
 * requantization (y16, q16, q16_nan, pack64), a block of rows x one panel of int32 sums
 * (tile_out: VNNI blocks of 6 rows and AMX blocks of 32 alike), and the add + LayerNorm +
 * quantize of a block's rows (ln_rows, ln_range). See qgemm_vnni.c for the numerics. */

#ifndef PDLKIT_QGEMM_EPILOGUE_H
#define PDLKIT_QGEMM_EPILOGUE_H

/* 16 columns: y' = (acc + colcorr) * S + B with S, B pre-scaled per column (see
 * qgemm_run), then the activation; the result is already multiplied by inv_out_scale
 * (quantized output) or not (float32). */
AVX512 static inline __m512 y16(__m512i acc, __m512i cc, __m512 s, __m512 b, int act, __m512 hk,
                                const float (*tab)[16]) {
    __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(acc, cc)), s, b);
    /* max(0, y): vmaxps returns its second operand where one is NaN, so NaN stays NaN */
    if (act == ACT_RELU) return _mm512_max_ps(_mm512_setzero_ps(), y);
    if (act == ACT_GELU_ERF || act == ACT_GELU_TANH) return gelu16(y, hk, tab);
    return y;
}

/* round half to even, clamp to [qmin, qmax] (in float: no overflow), as int32 */
AVX512 static inline __m512i q16(__m512 y, __m512 lo, __m512 hi, __m512i zp) {
    const __m512 v = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
    return _mm512_add_epi32(
        _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zp);
}

/* q16, with code 0 where y is NaN: what torch's quantize_per_tensor gives for NaN (its clamp
 * keeps NaN, and the conversion of NaN to uint8 / int8 gives 0 on x86), for outputs whose
 * inputs are not checked for NaN (the LayerNorm's residual). */
AVX512 static inline __m512i q16_nan(__m512 y, __m512 lo, __m512 hi, __m512i zp) {
    return _mm512_mask_mov_epi32(q16(y, lo, hi, zp), _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q),
                                 _mm512_setzero_si512());
}

/* Per call: what the epilogue of every tile reads. */
typedef struct {
    const float *S, *B;    /* [n] folded scales and biases */
    const int32_t *wzp;    /* [n] or NULL: asymmetric weights */
    const int32_t *rowcorr; /* [m] rowsum_x - K x_zp, with wzp */
    float lo, hi, hk;       /* clamp bounds (minus out_zp), GELU's half scale */
    int32_t zp;
    float qt[QGELU_DEG + 1][32] __attribute__((aligned(64))); /* GELU, quantized output */
} epi_t;

/* 64 codes from four vectors of 16 int32 already within [qmin, qmax], in order: two packs
 * and one permute, one store. (A vpmovdb store per 16 codes, what _mm_mask_storeu_epi8 of
 * _mm512_cvtepi32_epi8 compiles to, had ~12% of the LayerNorm pass's samples on the
 * instruction after it on Zen 4; in the GEMM tiles both forms measure the same.) */
AVX512 static inline __m512i pack64(__m512i a, __m512i b, __m512i c, __m512i d, int is_signed) {
    const __m512i ab = _mm512_packs_epi32(a, b), cd = _mm512_packs_epi32(c, d);
    const __m512i bytes = is_signed ? _mm512_packs_epi16(ab, cd) : _mm512_packus_epi16(ab, cd);
    /* per 128-bit lane L the packs leave the dwords a[4L..4L+3], b[..], c[..], d[..] */
    return _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), bytes);
}

/* the first `left` of 16 lanes (none when left <= 0) */
static inline __mmask16 lanes(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

static inline __mmask64 bytes_mask(int64_t left) {
    return left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
}

/* mr rows x nc columns of output from the tile's accumulators; act and kind are constants
 * after inlining. Quantized outputs go back into acc as int32 codes first, then out 64 per
 * row (pack64). A float32 output adds res (rows ldr apart, at the tile's first row) when
 * res is not NULL. */
VNNI static inline __attribute__((always_inline)) void tile_out(
    int32_t *acc, int mr, int64_t nc, const int32_t *cc, const epi_t *e, int64_t n0,
    int64_t m0, void *out, int64_t ldo, int act, int kind, const float *res, int64_t ldr) {
    const float(*tab)[16] = gelu_tab[act == ACT_GELU_TANH];
    const __m512 lo = _mm512_set1_ps(e->lo), hi = _mm512_set1_ps(e->hi), hk = _mm512_set1_ps(e->hk);
    const __m512i zp = _mm512_set1_epi32(e->zp);
    for (int j = 0; j < NR / 16; j++) {
        const int64_t left = nc - 16 * j;
        if (left <= 0) break;
        const __mmask16 m = lanes(left);
        const int64_t col = n0 + 16 * j;
        const __m512i ccj = _mm512_maskz_loadu_epi32(m, cc + col);
        const __m512 s = _mm512_maskz_loadu_ps(m, e->S + col), b = _mm512_maskz_loadu_ps(m, e->B + col);
        const __m512i wz = e->wzp ? _mm512_maskz_loadu_epi32(m, e->wzp + col) : _mm512_setzero_si512();
        for (int r = 0; r < mr; r++) {
            __m512i a = _mm512_load_si512(acc + r * NR + 16 * j);
            if (e->wzp)
                a = _mm512_sub_epi32(a, _mm512_mullo_epi32(wz, _mm512_set1_epi32(e->rowcorr[m0 + r])));
            const int qgelu = kind != OUT_F32 && (act == ACT_GELU_ERF || act == ACT_GELU_TANH);
            __m512 y = qgelu ? qgelu16(y16(a, ccj, s, b, ACT_NONE, hk, tab), e->qt)
                             : y16(a, ccj, s, b, act, hk, tab);
            if (kind == OUT_F32 && res)
                y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, res + r * ldr + col));
            if (kind == OUT_F32)
                _mm512_mask_storeu_ps((float *)out + r * ldo + col, m, y);
            else
                _mm512_store_si512(acc + r * NR + 16 * j, q16(y, lo, hi, zp));
        }
    }
    if (kind == OUT_F32) return;
    const __mmask64 m = bytes_mask(nc);
    for (int r = 0; r < mr; r++) {
        const int32_t *q = acc + r * NR; /* lanes past nc hold old sums: masked off below */
        _mm512_mask_storeu_epi8((int8_t *)out + r * ldo + n0, m,
                                pack64(_mm512_load_si512(q), _mm512_load_si512(q + 16),
                                       _mm512_load_si512(q + 32), _mm512_load_si512(q + 48),
                                       kind == OUT_S8));
    }
}

/* ---------------------------------------------------------------- add + LayerNorm epilogue */

/* What qgemm_run_add_ln adds to the GEMM: a transformer block's output projection
 *   y = layer_norm(linear(x) + res) * gamma + beta        (over the whole row of n columns)
 * and optionally codes = quantize_per_tensor(y) for the next int8 GEMM. The constants of one
 * call site (the per-call tensors res and codes are arguments): */
typedef struct {
    const float *gamma, *beta; /* [n] or NULL */
    double eps;
    float inv_scale; /* (float)(1.0 / scale) of the codes */
    int32_t zp;
    int32_t qmin;
    int32_t qmax;
} pdlkit_qgemm_ln_args;

/* R output rows (R = 1 or LN_ROWS), in place: o[r] = linear(x) + res on entry (in L2: its row
 * group was just written); the LayerNorm's result on return, and its codes where codes[r] is
 * not NULL. Two-pass mean and variance in float32 (torch's own CPU LayerNorm and Inductor's
 * accumulate in float32 too), four accumulators per row (one would make each pass a chain of
 * dependent adds). Rows go LN_ROWS at a time, and gamma / beta are loaded once for them: one row
 * alone is a chain of dependent steps (sum, reduction, variance, reduction, 1 / sqrt,
 * normalize). Paired against one row at a time (two builds in one process, alternating):
 * 512 x 256 x 256 with add + LayerNorm + codes 0.947-0.966 (151.5 -> 143.4 us), 512 x 1024 x 256
 * 0.982: about 8 us less per call. Each row's sums are added in the same order either way, so
 * the results are identical. */
enum { LN_ROWS = 4 };
#define COLS4(X) X(0) X(1) X(2) X(3)
VNNI static inline __attribute__((always_inline)) void ln_rows(float *const *o, const int R,
                                                               int64_t n,
                                                               const pdlkit_qgemm_ln_args *a,
                                                               void *const *codes, int *bad) {
    const __m512 z = _mm512_setzero_ps();
    __m512 s[LN_ROWS][4], mv[LN_ROWS], rstd[LN_ROWS];
    float mean[LN_ROWS];
    for (int r = 0; r < R; r++) s[r][0] = s[r][1] = s[r][2] = s[r][3] = z;
#define SUM(u)                                                                                  \
    {                                                                                           \
        const __mmask16 m = lanes(n - j - 16 * u);                                              \
        for (int r = 0; r < R; r++)                                                             \
            s[r][u] = _mm512_add_ps(s[r][u], _mm512_maskz_loadu_ps(m, o[r] + j + 16 * u));      \
    }
    for (int64_t j = 0; j < n; j += 64) { COLS4(SUM) }
    for (int r = 0; r < R; r++) {
        const __m512 t = _mm512_add_ps(_mm512_add_ps(s[r][0], s[r][1]), _mm512_add_ps(s[r][2], s[r][3]));
        mean[r] = _mm512_reduce_add_ps(t) / (float)n;
        mv[r] = _mm512_set1_ps(mean[r]);
        s[r][0] = s[r][1] = s[r][2] = s[r][3] = z;
    }
#define SQ(u)                                                                                   \
    {                                                                                           \
        const __mmask16 m = lanes(n - j - 16 * u);                                              \
        for (int r = 0; r < R; r++) {                                                           \
            const __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, o[r] + j + 16 * u), mv[r]); \
            s[r][u] = _mm512_fmadd_ps(d, d, s[r][u]);                                           \
        }                                                                                       \
    }
    for (int64_t j = 0; j < n; j += 64) { COLS4(SQ) }
    for (int r = 0; r < R; r++) {
        const __m512 t = _mm512_add_ps(_mm512_add_ps(s[r][0], s[r][1]), _mm512_add_ps(s[r][2], s[r][3]));
        const float ssd = _mm512_reduce_add_ps(t), var = ssd / (float)n;
        rstd[r] = _mm512_set1_ps(1.0f / sqrtf(var + (float)a->eps));
        /* sum x^2 = ssd + n mean^2: past float32 (or NaN) where torch's LayerNorm, whose variance
         * goes through it, can give NaN (a value past about 1.8e19, an infinity, a NaN): the
         * caller declines then (per row, nothing per element) */
        *bad |= !((double)ssd + (double)n * mean[r] * mean[r] <= FLT_MAX);
    }
    const __m512 inv = _mm512_set1_ps(a->inv_scale);
    const __m512 lo = _mm512_set1_ps((float)(a->qmin - a->zp)), hi = _mm512_set1_ps((float)(a->qmax - a->zp));
    const __m512i zp = _mm512_set1_epi32(a->zp);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t j = 0; j < n; j += 64) {
        const __mmask64 bm = bytes_mask(n - j);
        __m512 g[4], be[4]; /* loaded once for the R rows */
#define GB(u)                                                                                   \
    {                                                                                           \
        const __mmask16 m = lanes(n - j - 16 * u);                                              \
        g[u] = a->gamma ? _mm512_maskz_loadu_ps(m, a->gamma + j + 16 * u) : one;                \
        be[u] = a->beta ? _mm512_maskz_loadu_ps(m, a->beta + j + 16 * u) : z;                   \
    }
        COLS4(GB)
        for (int r = 0; r < R; r++) {
            __m512i q0, q1, q2, q3;
#define NORM(u)                                                                                 \
    {                                                                                           \
        const __mmask16 m = lanes(n - j - 16 * u);                                              \
        __m512 y = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, o[r] + j + 16 * u), mv[r]), rstd[r]); \
        if (a->gamma) y = _mm512_mul_ps(y, g[u]);                                               \
        if (a->beta) y = _mm512_add_ps(y, be[u]);                                               \
        _mm512_mask_storeu_ps(o[r] + j + 16 * u, m, y);                                         \
        q##u = q16_nan(_mm512_mul_ps(y, inv), lo, hi, zp);                                      \
    }
            COLS4(NORM)
            if (codes[r])
                _mm512_mask_storeu_epi8((int8_t *)codes[r] + j, bm, pack64(q0, q1, q2, q3, a->qmin < 0));
        }
    }
#undef GB
#undef SUM
#undef SQ
#undef NORM
}

/* Rows i0 .. i1 of out (rows ldo apart) and their codes (rows ldc apart, or none); 1 where a
 * row's sum of squares was not finite (see ln_rows), else 0 */
VNNI static int ln_range(float *out, int64_t ldo, int64_t i0, int64_t i1, int64_t n,
                         const pdlkit_qgemm_ln_args *a, void *codes, int64_t ldc) {
    int bad = 0;
    int64_t i = i0;
    for (; i + LN_ROWS <= i1; i += LN_ROWS) {
        float *o[LN_ROWS];
        void *c[LN_ROWS];
        for (int r = 0; r < LN_ROWS; r++) {
            o[r] = out + (i + r) * ldo;
            c[r] = codes ? (char *)codes + (i + r) * ldc : NULL;
        }
        ln_rows(o, LN_ROWS, n, a, c, &bad);
    }
    for (; i < i1; i++) {
        float *o[1] = {out + i * ldo};
        void *c[1] = {codes ? (char *)codes + i * ldc : NULL};
        ln_rows(o, 1, n, a, c, &bad);
    }
    return bad;
}

#endif
