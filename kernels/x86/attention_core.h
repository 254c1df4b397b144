/* The attention of attention.c (its method and precision are described there): scaled dot
 * product attention with the quantization of its output fused, on AVX512_BF16, for one
 * attn_params. Included by attention.c (the attention_q kernels) and by qgemm_vnni.c (whose
 * qkv_attention_q_merged runs it on each batch's Q, K, V projections while they are in L2). */
#ifndef PDLKIT_ATTENTION_CORE_H
#define PDLKIT_ATTENTION_CORE_H

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


#if defined(_OPENMP)
#include <omp.h>
#endif
/* calls with fewer multiply-adds (B H Sq Sk D) run on the calling thread */
#define ATT_PARALLEL_MIN_MACS ((int64_t)1 << 20)

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define ATT_INLINE static inline __attribute__((always_inline))

enum { ATT_MR = 4, ATT_NV = 4 };                /* micro-tile: ATT_MR rows x ATT_NV zmm (64 fp32 columns) */
enum { ATT_TR = 16 };                   /* query rows per block on AMX tiles (attention_amx.h) */
enum { MAX_DIM = 1 << 16 };             /* Sk and D beyond this are declined */
#define WORKSPACE_BYTES ((size_t)576 << 10)
#define LOG2E 1.44269504088896340736f
/* BF16 Q K^T where every logit |q . k * scale| is at most this (by the row norms), else FP32 */
#define QK_BF16_MAX 16.0f

typedef struct {
  const float *q, *k, *v;
  int64_t qs[3], ks[3], vs[3]; /* strides of dims 0..2 (dim 3 is 1) */
  int64_t B, H, Sq, Sk, D;
  const uint8_t* mask; /* NULL: none; else bool bytes or float32 */
  int mask_float;
  int64_t ms[4];       /* mask strides in elements, 0 on broadcast dims */
  int causal;
  float scale;         /* the softmax scale (1 / sqrt(D) for None) */
  float inv_out_scale;
  int32_t zp, qmin, qmax;
  int8_t* out;         /* bytes; row (b, h, i) at out + b os[0] + h os[1] + i os[2] */
  int64_t os[3];
} attn_params;

typedef struct { /* sizes of the scratch buffers for one call (either path: vector or tiles) */
  int64_t SkP, SkT, DP, D2, D2P, Sk2;
  size_t kp, kf, vp, qb, sb, pb, ob, mrow, total; /* byte offsets; total = size */
  int tiles; /* set by execute: the heads run on AMX tiles (attention_amx.h) */
} attn_layout;

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Row buffers hold ATT_TR rows (the vector path uses ATT_MR of them); P rows are SkT long and
 * V has SkT / 2 pair rows so that the tiles' P V steps of 32 keys read zeros past Sk. */
static attn_layout layout_of(int64_t Sk, int64_t D) {
  attn_layout L;
  L.SkP = (Sk + 15) / 16 * 16;
  L.SkT = (Sk + 31) / 32 * 32;
  L.DP = (D + 15) / 16 * 16;
  L.D2 = (D + 1) / 2;
  L.D2P = (L.D2 + 15) / 16 * 16;
  L.Sk2 = (Sk + 1) / 2;
  size_t off = 0;
  L.kp = off, off += round64((size_t)(L.D2 * L.SkP) * 4);
  L.kf = off, off += round64((size_t)(D * L.SkP) * 4); /* K in float32, where a block needs it */
  L.vp = off, off += round64((size_t)(L.SkT / 2 * L.DP) * 4);
  L.qb = off, off += round64((size_t)(ATT_TR * L.D2P) * 4);
  L.sb = off, off += round64((size_t)(ATT_TR * L.SkP) * 4);
  L.pb = off, off += round64((size_t)(ATT_TR * L.SkT) * 2);
  L.ob = off, off += round64((size_t)(ATT_TR * L.DP) * 4);
  L.mrow = off, off += round64((size_t)L.SkP * 4);
  L.total = off;
  L.tiles = 0;
  return L;
}

/* ---- vector helpers ------------------------------------------------------------------- */

ATT_INLINE __mmask16 first_n(int64_t n) {
  if (n >= 16) return (__mmask16)0xFFFF;
  if (n <= 0) return 0;
  return (__mmask16)((1u << n) - 1u);
}

/* 32 floats row[e0 .. e0+32) (zero past n) -> 16 words of bf16 pairs (row[2i], row[2i+1]). */
ATT_INLINE BF16_TARGET __m512i pair_words(const float* row, int64_t e0, int64_t n) {
  __m512 lo = _mm512_maskz_loadu_ps(first_n(n - e0), row + e0);
  __m512 hi = _mm512_maskz_loadu_ps(first_n(n - e0 - 16), row + e0 + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); /* bf16 element i = row[e0 + i] */
}

/* In-register transpose of a 16 x 16 matrix of 32-bit words. */
ATT_INLINE BF16_TARGET void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) { /* r[4i + c], 128-bit lane L: column 4L + c of rows 4i.. */
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    __m512i a = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    __m512i b = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    __m512i e = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    __m512i f = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
    t[c] = _mm512_shuffle_i32x4(a, e, 0x88);
    t[8 + c] = _mm512_shuffle_i32x4(a, e, 0xDD);
    t[4 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(b, f, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

/* 2^x for x <= 0 (and -inf): n = round(x), f = x - n in [-0.5, 0.5], 2^f by its Taylor
 * polynomial of degree 5 (relative error < 3e-6, far below the bf16 rounding that follows),
 * times 2^n by vscalefps. Below x = -126 the result is exactly 0 (a zeroing mask), and x is
 * clamped there, so no lane's result underflows: an underflowing result (a denormal, or a zero
 * rounded from one) costs a microcode assist per instruction on Intel cores running without
 * FTZ. Clamped at -150 instead (-inf, a masked score, gave 2^-150 rounded to 0), a causal
 * mask's half of -inf scores made Llama-shaped attention ([8, 8, 64, 64], one thread, on a Xeon
 * with AMX) take 1094 us against 327 us with an all-true mask. (Results below 2^-126 were
 * denormals, which the bf16 conversion that follows flushes to zero anyway.) NaN stays NaN:
 * vmaxps returns its second operand where one is NaN, and the mask keeps unordered lanes. */
ATT_INLINE BF16_TARGET __m512 exp2_ps(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
  x = _mm512_max_ps(_mm512_set1_ps(-126.0f), x);
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3333558146e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(live, p, n);
}

/* ---- packing -------------------------------------------------------------------------- */

/* kp[d2][j] (row length SkP) = bf16 pair (k[j, 2 d2], k[j, 2 d2 + 1]); zero past Sk / D.
 * Returns max_j |k_j|^2 of the bf16 values (one dpbf16 of each transposed word with itself
 * adds a pair's squares to its row's lane; inf for huge values). */
static BF16_TARGET float pack_k_bf16(const float* k, int64_t ld, int64_t Sk, int64_t D,
                                     const attn_layout* L, uint32_t* kp) {
  __m512i r[16];
  __m512 kmax = _mm512_setzero_ps();
  for (int64_t j0 = 0; j0 < L->SkP; j0 += 16) {
    __m512 n2 = _mm512_setzero_ps();
    for (int64_t w0 = 0; w0 < L->D2; w0 += 16) {
      for (int i = 0; i < 16; ++i)
        r[i] = j0 + i < Sk ? pair_words(k + (j0 + i) * ld, 2 * w0, D) : _mm512_setzero_si512();
      transpose16(r);
      int64_t nw = L->D2 - w0 < 16 ? L->D2 - w0 : 16;
      for (int64_t c = 0; c < nw; ++c) {
        _mm512_storeu_si512(kp + (w0 + c) * L->SkP + j0, r[c]);
        n2 = _mm512_dpbf16_ps(n2, (__m512bh)r[c], (__m512bh)r[c]);
      }
    }
    kmax = _mm512_max_ps(kmax, n2);
  }
  return _mm512_reduce_max_ps(kmax);
}

/* kf[d][j] (row length SkP) = k[j, d], float32 (K transposed); zero past Sk. */
static BF16_TARGET void pack_k_f32(const float* k, int64_t ld, int64_t Sk, int64_t D,
                                   const attn_layout* L, float* kf) {
  __m512i r[16];
  for (int64_t j0 = 0; j0 < L->SkP; j0 += 16) {
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      const __mmask16 m = first_n(D - d0);
      for (int i = 0; i < 16; ++i)
        r[i] = j0 + i < Sk ? _mm512_castps_si512(_mm512_maskz_loadu_ps(m, k + (j0 + i) * ld + d0))
                           : _mm512_setzero_si512();
      transpose16(r);
      int64_t nd = D - d0 < 16 ? D - d0 : 16;
      for (int64_t c = 0; c < nd; ++c) _mm512_storeu_si512(kf + (d0 + c) * L->SkP + j0, r[c]);
    }
  }
}

/* vp[j2][d] (row length DP) = bf16 pair (v[2 j2, d], v[2 j2 + 1, d]); zero past Sk / D.
 * Returns the sum of the products v[2 j2, d] v[2 j2 + 1, d] (and v * 0 for odd Sk): NaN or inf
 * where some v is not finite (or past 1e19 in magnitude, which the caller also declines). */
static BF16_TARGET __m512 pack_v(const float* v, int64_t ld, int64_t Sk, int64_t D,
                                 const attn_layout* L, uint32_t* vp) {
  const __m512i interleave = _mm512_set_epi16(
      31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
      23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);  /* element i: 0, 16, 1, 17.. */
  const __m512 zero = _mm512_setzero_ps();
  __m512 nf = zero;
  for (int64_t j2 = 0; j2 < L->Sk2; ++j2) {
    const float* r0 = v + 2 * j2 * ld;
    const float* r1 = r0 + ld;
    int has1 = 2 * j2 + 1 < Sk;
    for (int64_t d0 = 0; d0 < L->DP; d0 += 16) {
      __mmask16 m = first_n(D - d0);
      __m512 a = _mm512_maskz_loadu_ps(m, r0 + d0);
      __m512 b = has1 ? _mm512_maskz_loadu_ps(m, r1 + d0) : zero;
      nf = _mm512_fmadd_ps(a, b, nf); /* a * 0 for odd Sk: NaN for a non-finite a */
      __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* a0..a15, b0..b15 */
      _mm512_storeu_si512(vp + j2 * L->DP + d0, _mm512_permutexvar_epi16(interleave, ab));
    }
  }
  return nf;
}

/* max over r < ATT_MR of the lane sums of a[r] (a 4 x 16 transposing reduction); NaN where one
 * is NaN */
ATT_INLINE BF16_TARGET float max_row_sum4(const __m512 a[ATT_MR]) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
  /* per 128-bit lane: a, b, c, d partial sums after these two adds */
  __m512 x = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E)); /* + the other 256-bit half */
  x = _mm512_add_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1)); /* + the neighbouring 128 bits */
  __m128 m = _mm512_castps512_ps128(x);                  /* the 4 rows' sums, in some order */
  if (_mm_movemask_ps(_mm_cmpunord_ps(m, m))) return NAN; /* vmaxps would drop it */
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

/* ---- micro-kernels -------------------------------------------------------------------- */

/* acc[r][0 .. 16 nv) = sum_w a[r][w] . b[w][0 .. 16 nv) over w < n (ATT_MR rows of bf16 pair
 * words against n rows of ldb words): the product loop of P V and of BF16 Q K^T. */
ATT_INLINE BF16_TARGET void dot_tile(const int nv, const uint32_t* a, int64_t lda, int64_t n,
                                 const uint32_t* b, int64_t ldb, __m512 acc[ATT_MR][ATT_NV]) {
  for (int r = 0; r < ATT_MR; ++r)
    for (int j = 0; j < nv; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t w = 0; w < n; ++w) {
    __m512bh bw[ATT_NV];
    for (int j = 0; j < nv; ++j) bw[j] = (__m512bh)_mm512_loadu_si512(b + w * ldb + 16 * j);
    for (int r = 0; r < ATT_MR; ++r) {
      __m512bh aw = (__m512bh)_mm512_set1_epi32((int)a[r * lda + w]);
      for (int j = 0; j < nv; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], aw, bw[j]);
    }
  }
}

/* s[r][0 .. 16 nv) = sum_d2 qb[r][d2] . kp[d2][0 .. 16 nv)  (ATT_MR rows, bf16 pairs). */
ATT_INLINE BF16_TARGET void qk_tile_bf16(const int nv, const uint32_t* qb, int64_t ldq, int64_t d2n,
                                     const uint32_t* kp, int64_t ldk, float* s, int64_t lds) {
  __m512 acc[ATT_MR][ATT_NV];
  dot_tile(nv, qb, ldq, d2n, kp, ldk, acc);
  for (int r = 0; r < ATT_MR; ++r)
    for (int j = 0; j < nv; ++j) _mm512_storeu_ps(s + r * lds + 16 * j, acc[r][j]);
}

/* s[r][0 .. 16 nv) = sum_d q[r][d] kf[d][0 .. 16 nv)  (ATT_MR rows, float32 FMA). */
ATT_INLINE BF16_TARGET void qk_tile_f32(const int nv, const float* const* q, int64_t D,
                                    const float* kf, int64_t ldk, float* s, int64_t lds) {
  __m512 acc[ATT_MR][ATT_NV];
  for (int r = 0; r < ATT_MR; ++r)
    for (int j = 0; j < nv; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 b[ATT_NV];
    for (int j = 0; j < nv; ++j) b[j] = _mm512_loadu_ps(kf + d * ldk + 16 * j);
    for (int r = 0; r < ATT_MR; ++r) {
      const __m512 a = _mm512_set1_ps(q[r][d]);
      for (int j = 0; j < nv; ++j) acc[r][j] = _mm512_fmadd_ps(a, b[j], acc[r][j]);
    }
  }
  for (int r = 0; r < ATT_MR; ++r)
    for (int j = 0; j < nv; ++j) _mm512_storeu_ps(s + r * lds + 16 * j, acc[r][j]);
}

/* The codes of y * scale (y: 16 sums of P V; scale: 1 / (rowsum out_scale)) into out's lanes m:
 * rounded half to even, + zp, clamped to [qmin, qmax]. */
ATT_INLINE BF16_TARGET void store_codes(__m512 y, __m512 scale, int8_t* out, __mmask16 m,
                                        const attn_params* p) {
  /* keep the product inside int32 before converting (saturates to the right end) */
  const __m512 flo = _mm512_set1_ps((float)p->qmin - (float)p->zp - 1.0f);
  const __m512 fhi = _mm512_set1_ps((float)p->qmax - (float)p->zp + 1.0f);
  y = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(y, scale), flo), fhi);
  __m512i c = _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  c = _mm512_add_epi32(c, _mm512_set1_epi32(p->zp));
  c = _mm512_min_epi32(_mm512_max_epi32(c, _mm512_set1_epi32(p->qmin)), _mm512_set1_epi32(p->qmax));
  _mm512_mask_cvtepi32_storeu_epi8(out, m, c);
}

/* out[r][0 .. min(16 nv, ncols)) = quantize(inv[r] * sum_j2 pw[r][j2] . vp[j2][..]) for
 * r < mr, where inv[r] = 1 / (rowsum * out_scale). */
ATT_INLINE BF16_TARGET void pv_tile(const int nv, const uint32_t* pw, int64_t ldp, int64_t j2n,
                                const uint32_t* vp, int64_t ldv, const float* inv, int mr,
                                int8_t* out, int64_t ldo, int64_t ncols, const attn_params* p) {
  __m512 acc[ATT_MR][ATT_NV];
  dot_tile(nv, pw, ldp, j2n, vp, ldv, acc);
  for (int r = 0; r < ATT_MR && r < mr; ++r)
    for (int j = 0; j < nv; ++j)
      store_codes(acc[r][j], _mm512_set1_ps(inv[r]), out + r * ldo + 16 * j,
                  first_n(ncols - 16 * j), p);
}

/* ---- softmax -------------------------------------------------------------------------- */

/* Phase 1 of one row: t = s * mul (+ mask), -inf past `keep` (Sk or is_causal) and where a
 * bool mask is false; stored back into s; returns the lane-wise max. mul is scale log2(e)
 * (t in log2 units) but for a float mask, which is added as torch adds it, in natural-log
 * units (mul = scale; exp_row converts after subtracting the max): so a mask of -FLT_MAX, which
 * torch's masks use, stays finite (times log2(e) it would be -inf, which means "fully masked").
 * Lanes where a float mask made t NaN are or'ed into *nan (the max below could drop them). */
ATT_INLINE BF16_TARGET __m512 scores_row(float* s, int64_t SkP, int64_t keep, const uint8_t* mrow,
                                    int mask_float, float mul, __mmask16* nan) {
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 ninf = _mm512_set1_ps(-INFINITY), vmul = _mm512_set1_ps(mul);
  __m512 vmax = ninf;
  for (int64_t j = 0; j < SkP; j += 16) {
    __m512 t = _mm512_mul_ps(_mm512_loadu_ps(s + j), vmul);
    __mmask16 ok = _mm512_cmplt_epi32_mask(_mm512_add_epi32(iota, _mm512_set1_epi32((int)j)),
                                           _mm512_set1_epi32((int)keep));
    if (mrow != NULL) {
      __mmask16 in = first_n(keep - j);
      if (mask_float) {
        t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(in, (const float*)mrow + j));
        *nan |= _mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q);
      } else {
        __m128i bytes;
        if (in == 0xFFFF) {
          bytes = _mm_loadu_si128((const __m128i*)(mrow + j));
        } else {
          uint8_t tail[16] = {0};
          if (in) memcpy(tail, mrow + j, (size_t)(keep - j));
          bytes = _mm_loadu_si128((const __m128i*)tail);
        }
        __m512i m = _mm512_cvtepu8_epi32(bytes);
        ok &= _mm512_test_epi32_mask(m, m);
      }
    }
    t = _mm512_mask_blend_ps(ok, ninf, t);
    _mm512_storeu_ps(s + j, t);
    vmax = _mm512_max_ps(vmax, t);
  }
  return vmax;
}

/* Phase 2 of one row: prow = bf16(2^(t - mx)) (times log2(e) first where t is in natural-log
 * units, `natural`; zero where t = -inf); returns the lane-wise sums of the rounded values (NaN
 * where a t was NaN, or +inf with mx = +inf). */
ATT_INLINE BF16_TARGET __m512 exp_row(const float* s, uint16_t* prow, int64_t SkP, float mx,
                                  const int natural) {
  __m512 vm = _mm512_set1_ps(mx), vsum = _mm512_setzero_ps(), log2e = _mm512_set1_ps(LOG2E);
  for (int64_t j = 0; j < SkP; j += 16) {
    __m512 x = _mm512_sub_ps(_mm512_loadu_ps(s + j), vm);
    __m512 e = exp2_ps(natural ? _mm512_mul_ps(x, log2e) : x);
    __m256i h = (__m256i)_mm512_cvtneps_pbh(e);
    _mm256_storeu_si256((__m256i*)(prow + j), h);
    vsum = _mm512_add_ps(vsum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  return vsum;
}

/* The mask row mrow[0, st, 2 st, ..] (Sk elements) into buf, contiguous. */
static void gather_row(const uint8_t* mrow, int64_t st, int64_t Sk, int mask_float,
                       uint8_t* buf) {
  if (mask_float) {
    const float* src = (const float*)mrow;
    float* dst = (float*)buf;
    for (int64_t j = 0; j < Sk; ++j) dst[j] = src[j * st];
  } else {
    for (int64_t j = 0; j < Sk; ++j) buf[j] = mrow[j * st];
  }
}

/* ---- one (b, h) ----------------------------------------------------------------------- */

/* One (b, h): its views of q, k, the mask and the output, its packed K and V, the row buffers
 * of this thread's scratch (attention_head sets it up; the steps below read it). */
typedef struct {
  const attn_params* p;
  const attn_layout* L;
  const float *q, *kh;     /* the head's q and k rows */
  const uint8_t* mhead;    /* the head's mask (NULL: none) */
  int8_t* out;
  const uint32_t *kp, *vp; /* K, V as bf16 pair words (pack_k_bf16, pack_v) */
  float *kf, *sb, *ob;     /* K in float32 (once needed), scores, P V sums (tiles) */
  uint32_t* qb;            /* query rows as bf16 pair words */
  uint16_t* pb;            /* bf16 softmax weights */
  uint8_t* mbuf;           /* a gathered mask row */
  float kn, mul;           /* max_j |k_j|^2; the scores' multiplier (see scores_row) */
  int kf_ready;
} att_head;

/* Rows i0 .. i0 + mr - 1 of q -> bf16 pair words qb[r][0 .. D2P) for r < ATT_MR (zero past mr);
 * returns max_r |q_r|^2 of the bf16 values (one dpbf16 of each word with itself, as for k). */
static BF16_TARGET float q_rows(const att_head* h, int64_t i0, int mr, uint32_t* qb) {
  const int64_t D2P = h->L->D2P;
  __m512 n2[ATT_MR];
  for (int r = 0; r < ATT_MR; ++r) {
    n2[r] = _mm512_setzero_ps();
    for (int64_t w0 = 0; w0 < D2P; w0 += 16) {
      const __m512i w = r < mr ? pair_words(h->q + (i0 + r) * h->p->qs[2], 2 * w0, h->p->D)
                               : _mm512_setzero_si512();
      _mm512_storeu_si512(qb + r * D2P + w0, w);
      n2[r] = _mm512_dpbf16_ps(n2[r], (__m512bh)w, (__m512bh)w);
    }
  }
  return max_row_sum4(n2);
}

/* BF16 products only where no logit of the rows can be large: |q_i . k_j| scale <= |q_i| |k_j|
 * scale <= QK_BF16_MAX (Cauchy-Schwarz), qn = max |q_i|^2; else float32 (see Precision). */
ATT_INLINE int qk_bf16_ok(const att_head* h, float qn) {
  return h->p->scale * h->p->scale * qn * h->kn <= QK_BF16_MAX * QK_BF16_MAX;
}

/* Scores of ATT_MR query rows from i0 into sb (rows SkP apart) on the vector units: BF16 from
 * qb (q_rows) where bf16, else float32 FMA (K packed to kf on the head's first need). */
static BF16_TARGET void qk_rows(att_head* h, int64_t i0, int mr, const uint32_t* qb, int bf16,
                                float* sb) {
  const attn_layout* L = h->L;
  const int64_t SkP = L->SkP, D = h->p->D;
  if (bf16) {
    for (int64_t c0 = 0; c0 < SkP; c0 += 16 * ATT_NV) {
      const uint32_t* kc = h->kp + c0;
      switch ((SkP - c0) / 16 < ATT_NV ? (int)((SkP - c0) / 16) : ATT_NV) {
        case 1: qk_tile_bf16(1, qb, L->D2P, L->D2, kc, SkP, sb + c0, SkP); break;
        case 2: qk_tile_bf16(2, qb, L->D2P, L->D2, kc, SkP, sb + c0, SkP); break;
        case 3: qk_tile_bf16(3, qb, L->D2P, L->D2, kc, SkP, sb + c0, SkP); break;
        default: qk_tile_bf16(4, qb, L->D2P, L->D2, kc, SkP, sb + c0, SkP); break;
      }
    }
    return;
  }
  if (!h->kf_ready) pack_k_f32(h->kh, h->p->ks[2], h->p->Sk, D, L, h->kf);
  h->kf_ready = 1;
  const float* qr[ATT_MR]; /* rows past Sq repeat the last one (their scores are not used) */
  for (int r = 0; r < ATT_MR; ++r) qr[r] = h->q + (i0 + (r < mr ? r : mr - 1)) * h->p->qs[2];
  for (int64_t c0 = 0; c0 < SkP; c0 += 16 * ATT_NV) {
    const float* kc = h->kf + c0;
    switch ((SkP - c0) / 16 < ATT_NV ? (int)((SkP - c0) / 16) : ATT_NV) {
      case 1: qk_tile_f32(1, qr, D, kc, SkP, sb + c0, SkP); break;
      case 2: qk_tile_f32(2, qr, D, kc, SkP, sb + c0, SkP); break;
      case 3: qk_tile_f32(3, qr, D, kc, SkP, sb + c0, SkP); break;
      default: qk_tile_f32(4, qr, D, kc, SkP, sb + c0, SkP); break;
    }
  }
}

/* The mask row of query row i (NULL: none) and how many keys it may keep (Sk, or i + 1 where
 * causal; 0 for a row one bool masks out). */
static const uint8_t* mask_row(const att_head* h, int64_t i, int64_t* keep) {
  const attn_params* p = h->p;
  *keep = p->causal && i + 1 < p->Sk ? i + 1 : p->Sk;
  if (h->mhead == NULL) return NULL;
  const uint8_t* mrow = h->mhead + i * p->ms[2] * (int64_t)(p->mask_float ? 4 : 1);
  if (p->ms[3] == 0 && !p->mask_float) { /* one bool for the row (HF BERT) */
    if (!mrow[0]) *keep = 0;
    return NULL;
  }
  if (p->ms[3] != 1) { /* a broadcast / strided mask row: gather it */
    gather_row(mrow, p->ms[3], p->Sk, p->mask_float, h->mbuf);
    return h->mbuf;
  }
  return mrow;
}

/* Softmax of ATT_MR rows from i0 (those below mr), phase by phase (their reductions overlap):
 * scores sb (rows SkP apart) -> bf16 weights pb (rows ldp apart; zero for a fully masked or
 * padding row) and inv[r] = 1 / (rowsum out_scale) (0 for those). 1 where a score or mask value
 * is NaN or +inf (see attention_head). */
static BF16_TARGET int softmax_rows(const att_head* h, int64_t i0, int mr, float* sb,
                                    uint16_t* pb, int64_t ldp, float* inv) {
  const attn_params* p = h->p;
  const int64_t SkP = h->L->SkP;
  __m512 red[ATT_MR];
  float mx[ATT_MR];
  int bad = 0;
  for (int r = 0; r < ATT_MR; ++r) {
    red[r] = _mm512_set1_ps(-INFINITY);
    if (r >= mr) continue;
    int64_t keep;
    const uint8_t* mrow = mask_row(h, i0 + r, &keep);
    __mmask16 nan = 0;
    red[r] = scores_row(sb + r * SkP, SkP, keep, mrow, p->mask_float, h->mul, &nan);
    bad |= nan != 0;
  }
  for (int r = 0; r < ATT_MR; ++r) mx[r] = _mm512_reduce_max_ps(red[r]);
  for (int r = 0; r < ATT_MR; ++r) {
    red[r] = _mm512_setzero_ps();
    bad |= mx[r] != mx[r];
    if (!(mx[r] > -INFINITY)) { /* fully masked (torch gives zeros) or a padding row */
      memset(pb + r * ldp, 0, (size_t)SkP * 2);
      continue;
    }
    red[r] = p->mask_float ? exp_row(sb + r * SkP, pb + r * ldp, SkP, mx[r], 1)
                           : exp_row(sb + r * SkP, pb + r * ldp, SkP, mx[r], 0);
  }
  for (int r = 0; r < ATT_MR; ++r) { /* 1 / (rowsum out_scale); 0: fully masked, out = zp */
    float t = _mm512_reduce_add_ps(red[r]);
    bad |= t != t; /* a NaN score, or +inf (mx = +inf) */
    inv[r] = t > 0.0f ? p->inv_out_scale / t : 0.0f;
  }
  return bad;
}

/* Codes of ATT_MR rows from i0 (those below mr): P V on the vector units, quantized. */
static BF16_TARGET void pv_rows(const att_head* h, int64_t i0, int mr, const float* inv) {
  const attn_layout* L = h->L;
  const int64_t SkP = L->SkP, DP = L->DP, D = h->p->D, ldo = h->p->os[2];
  const uint32_t* pw = (const uint32_t*)h->pb;
  for (int64_t c0 = 0; c0 < DP; c0 += 16 * ATT_NV) {
    int8_t* oc = h->out + i0 * ldo + c0;
    const uint32_t* vc = h->vp + c0;
    switch ((DP - c0) / 16 < ATT_NV ? (int)((DP - c0) / 16) : ATT_NV) {
      case 1: pv_tile(1, pw, SkP / 2, L->Sk2, vc, DP, inv, mr, oc, ldo, D - c0, h->p); break;
      case 2: pv_tile(2, pw, SkP / 2, L->Sk2, vc, DP, inv, mr, oc, ldo, D - c0, h->p); break;
      case 3: pv_tile(3, pw, SkP / 2, L->Sk2, vc, DP, inv, mr, oc, ldo, D - c0, h->p); break;
      default: pv_tile(4, pw, SkP / 2, L->Sk2, vc, DP, inv, mr, oc, ldo, D - c0, h->p); break;
    }
  }
}

/* The head's query rows ATT_MR at a time on the vector units (AVX512_BF16); 1 where a value
 * is not finite (see attention_head). */
static BF16_TARGET int head_rows(att_head* h) {
  int bad = 0;
  float inv[ATT_MR];
  for (int64_t i0 = 0; i0 < h->p->Sq; i0 += ATT_MR) {
    const int mr = h->p->Sq - i0 < ATT_MR ? (int)(h->p->Sq - i0) : ATT_MR;
    const float qn = q_rows(h, i0, mr, h->qb);
    bad |= !(qn <= FLT_MAX);
    qk_rows(h, i0, mr, h->qb, qk_bf16_ok(h, qn), h->sb);
    bad |= softmax_rows(h, i0, mr, h->sb, h->pb, h->L->SkP, inv);
    pv_rows(h, i0, mr, inv);
  }
  return bad;
}

#include "attention_amx.h" /* head_rows_amx: the same steps with Q K^T and P V on AMX tiles */

/* One (b, h). Returns 1 where the call must be declined (the reference, whose NaN / inf results
 * are torch's, runs instead): a q, k or v that is not finite (or past about 1e19, where |q|^2
 * overflows), a NaN score or mask value, or +inf (which makes the row's max +inf and its sum
 * NaN); -inf is fine (masked out). Else 0. */
static BF16_TARGET int attention_head(const attn_params* p, int64_t b, int64_t hd,
                                      const attn_layout* L, char* ws) {
  att_head h;
  h.p = p, h.L = L;
  h.q = p->q + b * p->qs[0] + hd * p->qs[1];
  h.kh = p->k + b * p->ks[0] + hd * p->ks[1];
  h.mhead = p->mask ? p->mask + (b * p->ms[0] + hd * p->ms[1]) * (int64_t)(p->mask_float ? 4 : 1)
                    : NULL;
  h.out = p->out + b * p->os[0] + hd * p->os[1];
  h.kp = (const uint32_t*)(ws + L->kp), h.vp = (const uint32_t*)(ws + L->vp);
  h.kf = (float*)(ws + L->kf), h.sb = (float*)(ws + L->sb), h.ob = (float*)(ws + L->ob);
  h.qb = (uint32_t*)(ws + L->qb), h.pb = (uint16_t*)(ws + L->pb), h.mbuf = (uint8_t*)(ws + L->mrow);
  /* scores in log2 units (scale log2(e)), or natural ones with a float mask (scores_row) */
  h.mul = p->mask_float ? p->scale : p->scale * LOG2E;
  h.kf_ready = 0; /* K in float32, packed when the first row block needs it */
  h.kn = pack_k_bf16(h.kh, p->ks[2], p->Sk, p->D, L, (uint32_t*)h.kp);
  const __m512 vsum =
      pack_v(p->v + b * p->vs[0] + hd * p->vs[1], p->vs[2], p->Sk, p->D, L, (uint32_t*)h.vp);
  int bad = !(h.kn <= FLT_MAX) || _mm512_cmp_ps_mask(_mm512_mul_ps(vsum, _mm512_setzero_ps()),
                                                    _mm512_setzero_ps(), _CMP_NEQ_UQ) != 0;
  return bad | (L->tiles ? head_rows_amx(&h) : head_rows(&h));
}

/* Heads one after another on this thread, with the scratch ws; 1 where some head saw a value
 * that is not finite (see attention_head). */
static BF16_TARGET int attention(const attn_params* p, const attn_layout* L, char* ws) {
  int bad = 0;
  if (L->tiles) att_amx_begin();
  for (int64_t b = 0; b < p->B; ++b)
    for (int64_t h = 0; h < p->H; ++h) bad |= attention_head(p, b, h, L, ws);
  if (L->tiles) att_amx_end();
  return bad;
}

/* Threads for this call: all of torch's OpenMP threads (the library links libgomp.so.1, which
 * torch has loaded, so torch.set_num_threads applies) when built with -fopenmp, the call is
 * large enough and there are several heads; else 1. All of them even with fewer heads (those
 * past the heads wait at the loop's end): a team smaller than the GEMM's before it made
 * libgomp shrink and regrow its team at every call, and qkv_attention_q_merged, which runs a
 * GEMM on every thread and then the attention, batch after batch, took 6-65 ms a call on 8
 * and 16 threads of a 16-core Xeon with AMX (bert-mini int8, 4 heads), against 0.5 ms on 4
 * threads and 0.75-1.2 ms on 8 and 16 with one team size (benchmarks/x86_kernel_threads.py). */
static int attention_threads(const attn_params* p) {
#if defined(_OPENMP)
  const int64_t heads = p->B * p->H;
  if (heads < 2 || heads * p->Sq * p->Sk * p->D < ATT_PARALLEL_MIN_MACS) return 1;
  return omp_get_max_threads(); /* the GEMMs' team size: see attention_parallel */
#else
  (void)p;
  return 1;
#endif
}

/* The heads shared over `threads` threads (some may get none), each with its own scratch:
 * thread i uses ws + i * L->total (heads write disjoint slices of the output). */
static BF16_TARGET int attention_parallel(const attn_params* p, const attn_layout* L, char* ws,
                                          int threads) {
#if defined(_OPENMP)
  const int64_t heads = p->B * p->H;
  int bad = 0;
#pragma omp parallel num_threads(threads) reduction(| : bad)
  { /* the tile configuration is per thread: loaded before its heads, released after them */
    char* own = ws + (size_t)omp_get_thread_num() * L->total;
    if (L->tiles) att_amx_begin();
#pragma omp for schedule(static)
    for (int64_t t = 0; t < heads; ++t) bad |= attention_head(p, t / p->H, t % p->H, L, own);
    if (L->tiles) att_amx_end();
  }
  return bad;
#else
  (void)threads;
  return attention(p, L, ws);
#endif
}


/* Whether this CPU has what the compute functions use (BF16_TARGET). */
static int has_isa(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

/* Runs p (already checked) with the caller's scratch ws of ws_size bytes (NULL: none): on
 * one thread in ws, or allocated where it is too small or several threads share the heads.
 * 0; 1 when some input, score or mask value was not finite (see attention_head); -1 when the
 * scratch cannot be allocated. */
static int execute(const attn_params* p, char* ws, size_t ws_size) {
  attn_layout L = layout_of(p->Sk, p->D);
  L.tiles = att_uses_amx(p);
  void* own = NULL;
  int threads = attention_threads(p);
  if (threads > 1) { /* one scratch per thread (L.total is a multiple of 64) */
    own = aligned_alloc(64, (size_t)threads * L.total);
    threads = own != NULL ? threads : 1; /* no memory for all: one thread, as below */
  }
  int bad;
  if (threads > 1) {
    att_poison(own, (size_t)threads * L.total);
    bad = attention_parallel(p, &L, (char*)own, threads);
  } else {
    if (ws == NULL || ws_size < L.total) {
      own = aligned_alloc(64, L.total);
      if (own == NULL) return -1;
      ws = (char*)own;
    }
    att_poison(ws, L.total);
    bad = attention(p, &L, ws);
  }
  free(own);
  return bad;
}


#endif
