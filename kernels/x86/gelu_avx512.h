/* GELU for the x86 kernels' epilogues (included by qgemm_vnni.c and gemm_bf16.c; each
 * library gets its own copy of the tables). Needs <math.h>, <immintrin.h> and PDLKIT_X86.
 *
 * GELU (both forms) is 0.5 y (1 + G(y)) with G odd: G(y) = erf(y / sqrt 2) (erf GELU) or
 * tanh(sqrt(2/pi) (y + 0.044715 y^3)) (tanh GELU). Accuracy (float32, against double
 * precision): |G - erf(y / sqrt 2)| and |G - tanh(...)| <= 2.7e-7 over all y; the whole GELU
 * is within 5.1e-7 absolute for |y| <= 4 and 1.2e-6 (about one float32 ulp of y) up to
 * |y| = 12 (tests/test_x86_qgemm.py). */
#ifndef PDLKIT_GELU_AVX512_H
#define PDLKIT_GELU_AVX512_H

/* the scalar reference paths: libm */
static float gelu_erf_scalar(float y) { return 0.5f * y * (1.0f + erff(y * 0.70710678118654752f)); }

static float gelu_tanh_scalar(float y) {
    float u = 0.7978845608028654f * (y + 0.044715f * y * y * y);
    return 0.5f * y * (1.0f + tanhf(u));
}

#if PDLKIT_X86
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* GELU as 0.5 y (1 + G(y)), G odd: G(y) = erf(y / sqrt 2) (erf GELU) or
 * tanh(sqrt(2/pi) (y + 0.044715 y^3)) (tanh GELU). G(|y|) on [0, YMAX) is 16 degree-4
 * polynomials in v = |y| * VSCALE, one per interval [i - 1/2, i + 1/2) of v, i = 0..15, in the
 * local variable t = v - i (Chebyshev interpolants, built by gelu_tables_init below), but for
 * the last, v >= 14.5 (|y| >= 5.29), which is the constant 1 (|1 - G| <= 1.4e-7 there), as is G
 * beyond YMAX = 4 sqrt 2, where v is clamped: GELU is then exactly 0 below -5.29 and y above
 * 5.29 but for its roundings (a polynomial there, 1e-7 off, made GELU(-1e6) about -0.1). The
 * interval index is round(v) (the magic-number trick); the 16 coefficients of each degree fill
 * one zmm register, selected with vpermps. */
#define GELU_DEG 4
#define GELU_YMAX 5.6568542494923802
#define GELU_VMAX 15.49f
static const double GELU_VSCALE = 15.5 / GELU_YMAX;
static float gelu_tab[2][GELU_DEG + 1][16] __attribute__((aligned(64)));
static volatile int gelu_ready;

static double g_erf(double y) { return erf(y * 0.70710678118654752440); }
static double g_tanh(double y) { return tanh(0.79788456080286535588 * (y + 0.044715 * y * y * y)); }
static double g_of(double y, int which) { return which ? g_tanh(y) : g_erf(y); }

/* For outputs that are quantized right after (one code is about 1/255 of the output range),
 * a cheaper form: Phi(y) = 0.5 (1 + G(y)) itself on [-YMAX, YMAX] as 31 degree-3 pieces in
 * v = y * VSCALE, interval i = round(v) in -15..15 at slot i & 31 (slot 16 unused), so that
 * one vpermt2ps per coefficient selects it and neither |y| nor the sign needs handling:
 * GELU(y) = y Phi(y), 4 selects and 4 FMA / multiplies per 16 values. The end pieces are the
 * constants 0 (i = -15) and 1 (i = 15), within 6.7e-8 of Phi there and beyond, where v is
 * clamped: GELU(y) is exactly 0 for y <= -5.29, however large |y| (a polynomial's 2e-8 there
 * made GELU(-1e9) -20, hundreds of codes at a fine output scale). Accuracy: |Phi - exact|
 * <= 3e-6 (a GELU error far below any code step that calibration gives). */
#define QGELU_DEG 3
static float qgelu_tab[2][QGELU_DEG + 1][32] __attribute__((aligned(64)));

/* mono[0..deg]: f(y, which) on the interval v = y * VSCALE in [lo - 1/2, lo + 1/2] as a
 * polynomial in t = v - lo: Chebyshev interpolation at deg + 1 nodes, converted to monomials. */
static void cheb_mono(int deg, int which, double lo, double (*f)(double, int), double *mono) {
    enum { NMAX = 8 };
    const int np = deg + 1;
    double fv[NMAX], a[NMAX], tk[NMAX][NMAX] = {{0}};
    for (int e = 0; e < np; e++) mono[e] = 0;
    for (int j = 0; j < np; j++) {
        const double t = 0.5 * cos(M_PI * (j + 0.5) / np); /* s = 2t in [-1, 1] */
        fv[j] = f((lo + t) / GELU_VSCALE, which);
    }
    for (int k = 0; k < np; k++) {
        double sum = 0;
        for (int j = 0; j < np; j++) sum += fv[j] * cos(M_PI * k * (j + 0.5) / np);
        a[k] = sum * 2.0 / np;
    }
    a[0] *= 0.5;
    tk[0][0] = 1;
    tk[1][1] = 1;
    for (int k = 2; k < np; k++) /* tk[k]: monomial coefficients (in s) of T_k(s) */
        for (int e = 0; e < np; e++) tk[k][e] = (e ? 2 * tk[k - 1][e - 1] : 0) - tk[k - 2][e];
    for (int k = 0; k < np; k++)
        for (int e = 0; e < np; e++) mono[e] += a[k] * tk[k][e] * ldexp(1.0, e); /* in t = s / 2 */
}

static double phi_of(double y, int which) { return 0.5 * (1.0 + g_of(y, which)); }

static void qgelu_tables_init(void) {
    for (int which = 0; which < 2; which++)
        for (int i = -15; i <= 15; i++) {
            double mono[QGELU_DEG + 1] = {i == 15 ? 1.0 : 0.0}; /* the ends: Phi = 0 or 1 */
            if (i > -15 && i < 15) cheb_mono(QGELU_DEG, which, (double)i, phi_of, mono);
            for (int e = 0; e <= QGELU_DEG; e++) qgelu_tab[which][e][i & 31] = (float)mono[e];
        }
}

static void gelu_tables_init(void) {
    if (gelu_ready) return;
    for (int which = 0; which < 2; which++)
        for (int i = 0; i < 16; i++) {
            double mono[GELU_DEG + 1] = {1.0}; /* the last piece: G = 1 */
            if (i < 15) cheb_mono(GELU_DEG, which, (double)i, g_of, mono);
            for (int e = 0; e <= GELU_DEG; e++) gelu_tab[which][e][i] = (float)mono[e];
        }
    qgelu_tables_init();
    gelu_ready = 1; /* racing initializers write the same values */
}

/* The piece of v (|v| < 2^22): round(v) in the low bits of the result (the magic-number
 * trick: no conversion), and *t = v - round(v), the polynomial's variable. */
AVX512 static inline __m512i piece16(__m512 v, __m512 *t) {
    const __m512 magic = _mm512_set1_ps(12582912.0f); /* 1.5 * 2^23 */
    const __m512 w = _mm512_add_ps(v, magic);
    *t = _mm512_sub_ps(v, _mm512_sub_ps(w, magic));
    return _mm512_castps_si512(w);
}

/* G(y) for yv = y * GELU_VSCALE, sign included */
AVX512 static inline __m512 gelu_g16(__m512 yv, const float (*tab)[16]) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512 v = _mm512_min_ps(_mm512_abs_ps(yv), _mm512_set1_ps(GELU_VMAX));
    __m512 t;
    const __m512i idx = piece16(v, &t);
    __m512 p = _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[4]));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[3])));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[2])));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[1])));
    p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[0])));
    /* p ^ (yv & sign): the sign of y */
    return _mm512_castsi512_ps(
        _mm512_ternarylogic_epi32(_mm512_castps_si512(p), _mm512_castps_si512(yv), sign, 0x78));
}

/* 0.5 y (1 + G(y)) for y = yv / GELU_VSCALE, times hk / (0.5 / GELU_VSCALE): the callers fold
 * GELU's 0.5, the table's variable scale and any output scale into hk */
AVX512 static inline __m512 gelu16(__m512 yv, __m512 hk, const float (*tab)[16]) {
    const __m512 h = _mm512_mul_ps(yv, hk);
    return _mm512_fmadd_ps(h, gelu_g16(yv, tab), h);
}

/* y Phi(y) * c for yv = y * GELU_VSCALE, where tab is qgelu_tab times c / GELU_VSCALE (the
 * caller's copy, scaled per call by the output scale) */
AVX512 static inline __m512 qgelu16(__m512 yv, const float (*tab)[32]) {
    const __m512 v = _mm512_min_ps(_mm512_max_ps(yv, _mm512_set1_ps(-GELU_VMAX)), _mm512_set1_ps(GELU_VMAX));
    __m512 t;
    const __m512i idx = piece16(v, &t); /* low 5 bits: round(v) & 31 */
#define SEL(e) _mm512_permutex2var_ps(_mm512_load_ps(tab[e]), idx, _mm512_load_ps(tab[e] + 16))
    __m512 p = SEL(3);
    p = _mm512_fmadd_ps(p, t, SEL(2));
    p = _mm512_fmadd_ps(p, t, SEL(1));
    p = _mm512_fmadd_ps(p, t, SEL(0));
#undef SEL
    return _mm512_mul_ps(yv, p);
}
#endif /* PDLKIT_X86 */
#endif /* PDLKIT_GELU_AVX512_H */
