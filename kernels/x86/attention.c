/*
 * attention: quantize_per_tensor(scaled_dot_product_attention(q, k, v, mask)) on x86 with
 * AVX512_BF16, as pdlkit native kernels (C ABI 1.1) of two logical ops: "attention_q" (output
 * [B, H, Sq, D]) and "attention_q_merged" (output [B, Sq, H * D]: the heads merged by
 * .transpose(1, 2).reshape(B, Sq, H * D) before the quantize, as PT2E BERT graphs have it).
 * A plain C entry, pdlkit_attention_run_qkv, serves kernels/x86/qlinear_vnni.py's
 * qkv_attention_q_merged (the Q, K, V GEMM and the attention batch by batch).
 *
 *   out[b, h, i, :] = quantize(sum_j softmax_j(q[b,h,i,:] . k[b,h,j,:] * scale + mask) v[b,h,j,:])
 *   quantize(x)     = clamp(round_half_even(x * (float)(1.0 / out_scale)) + out_zp, qmin, qmax)
 *
 * which is PT2E's quantized_decomposed.quantize_per_tensor applied to the FP32 result of
 * aten.scaled_dot_product_attention (dropout 0). This is what PT2E int8 BERT computes for
 * every attention (X86InductorQuantizer quantizes the attention output for the next linear).
 *
 * Build (pdlkit builds it itself, see attention.py; this is the same command):
 *
 *   cc -O3 -shared -fPIC -Wall -I runtime_abi/include kernels/x86/attention.c -lm \
 *      -o libpdlkit_attention.so
 *
 * No -mavx512* flags on purpose: only the compute functions carry
 * __attribute__((target("avx512f,avx512bw,avx512bf16"))), so the library loads, registers and
 * answers meta() on any x86-64 CPU; run() returns PDLKIT_UNSUPPORTED where the CPU lacks one
 * of those (the host then runs the replaced subgraph).
 *
 * Parameters (the schema): q, k, v: float32 [B, H, S, D] (k and v with Sk rows), any strides
 * with the last dim contiguous (stride 1; other calls are declined); attn_mask: optional, rank
 * 4, broadcastable to [B, H, Sq, Sk] (size-1 or stride-0 dims), bool (false = masked out) or
 * float32 (added to the scores); is_causal (int): keep j <= i (top-left aligned, as torch);
 * scale (float): the softmax scale, where scale <= 0 (or NaN) stands for None, i.e.
 * 1 / sqrt(D) (an explicit non-positive scale is therefore not expressible); out_scale,
 * out_zp, out_qmin, out_qmax: the quantization; out_qmin >= 0 gives uint8, else int8.
 * Output: a new contiguous [B, H, Sq, D] (attention_q) or [B, Sq, H * D]
 * (attention_q_merged) uint8 / int8 tensor. A fully masked row gives
 * zeros before quantization (= out_zp), as torch's SDPA does on the CPU; a float mask of
 * -FLT_MAX (torch.finfo.min, HF's) is a finite number as in torch (a row of it averages v).
 * Declined (PDLKIT_UNSUPPORTED: the reference runs, whose NaN / inf results are torch's):
 * q, k or v with a NaN or an infinity (or beyond about 1e19, whose square overflows), and a
 * NaN or +inf in the float mask or the scores (-inf masks out, as in torch).
 *
 * Method, per (b, h) (two-pass softmax over whole rows, MR query rows at a time):
 *   1. Pack K and V to BF16 in the pair layout of _mm512_dpbf16_ps (a 32-bit lane of it
 *      holds two bf16, multiplied pairwise and added to one fp32 accumulator):
 *        kp[D/2][SkP] words, word (d2, j) = (k[j, 2 d2], k[j, 2 d2 + 1])   (16x16 transposes)
 *        vp[Sk/2][DP] words, word (j2, d) = (v[2 j2, d], v[2 j2 + 1, d])   (one vpermw)
 *      zero padded: odd D, odd Sk, SkP = Sk and DP = D rounded up to 16; and max_j |k_j|^2
 *      (one dpbf16 of each transposed word with itself: a row's squares in its lane).
 *   2. Q rows -> bf16 pair words (and |q_i|^2 the same way); S = Q K^T with MR x 64 fp32
 *      accumulators (4 zmm per row): per pair d2, one broadcast q word per row and 4 loads of
 *      kp[d2]; one dpbf16 each. Where a logit of the MR rows could exceed QK_BF16_MAX = 16
 *      (|q_i| |k_j| scale, Cauchy-Schwarz), S in float32 instead: K packed once per head as
 *      kf[D][SkP] floats (16x16 transposes), per d one broadcast q per row, 4 loads, 16 FMAs.
 *   3. Softmax in fp32, the MR rows phase by phase (their max / sum reductions overlap):
 *      t = s * scale * log2(e) (-inf where masked out, by is_causal, or past Sk; with a float
 *      mask t = s * scale + mask, times log2(e) after subtracting the max), m = max t,
 *      p = 2^(t - m) by our own vectorised exp2 (round to nearest n, f = t - n in
 *      [-0.5, 0.5], degree-5 polynomial, vscalefps by n; no libm). p is rounded
 *      to bf16 for the P V product and the row sum adds the rounded values, so the weights the
 *      product uses sum to exactly 1 after normalisation. A bool mask row that is one value
 *      (stride 0 along Sk: HF BERT's expanded mask) costs nothing per element.
 *   4. O = P V with MR x 64 accumulators over the pair words of P, then the epilogue folds
 *      1/rowsum and 1/out_scale into one multiply, rounds half to even (vcvtps2dq under
 *      _MM_FROUND_TO_NEAREST_INT), adds out_zp, clamps to [qmin, qmax] and stores bytes.
 *
 * Precision. The products use BF16 inputs (8-bit significand, relative rounding <= 2^-9)
 * with FP32 accumulation; softmax, normalisation and quantization are FP32. The result is an
 * 8-bit code right after: one step is out_scale, about 1/255 of the calibrated output range.
 * A logit's error from BF16 q and k grows with |q| |k| (2^-8 of sum_d |q_d k_d| at most): on
 * logits in the tens (q, k of standard deviation 3, 10, 30 at D = 64) BF16 Q K^T moved codes by
 * 3, 20, 55. Hence float32 Q K^T wherever a logit could exceed 16 (step 2); below, the logit
 * errors stay under about 0.06 (typically 0.002). P and V in BF16 move the output by at most
 * 2^-9 (max |v| + range of v): below a code where out_scale is calibrated on outputs that span
 * v's range, and averaged out over the Sk-long sums otherwise. Measured against FP32 SDPA +
 * quantize (tests/test_x86_attention.py, benchmarks/x86_attention.py): random q, k, v of
 * standard deviation 0.8 to 100, D 8 to 256, S 16 to 384, outlier tokens, output range
 * calibrated: no code off by more than one, 1-9% off by one; bert-mini's PT2E activations:
 * 1.3-1.6% off by one. It is not a bound: with an out_scale much finer than v's values (a
 * badly calibrated quantizer) a code can move by two.
 *
 * Threads: built with -fopenmp (attention.py tries that first), calls of 2^20 multiply-adds
 * (B H Sq Sk D) or more share their heads over torch's OpenMP threads, each thread with its
 * own scratch (allocated per call); otherwise, and without OpenMP, one thread. Memory: about
 * 8 Sk D bytes of packed K (bf16 pairs and float32) and V plus row buffers; the host's
 * workspace (WORKSPACE_BYTES, 576 KiB, one per thread, reused) holds them up to Sk D of about
 * 70000 (Sk 512 with D 128); larger calls allocate their scratch with aligned_alloc and
 * free it before returning (declining if that fails). Sk and D up to 65536.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pdlkit_abi.h"

#if defined(_OPENMP)
#include <omp.h>
#endif
/* calls with fewer multiply-adds (B H Sq Sk D) run on the calling thread */
#define PARALLEL_MIN_MACS ((int64_t)1 << 20)

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define INLINE static inline __attribute__((always_inline))

enum { MR = 4, NV = 4 };                /* micro-tile: MR rows x NV zmm (64 fp32 columns) */
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

typedef struct { /* sizes of the scratch buffers for one call */
  int64_t SkP, DP, D2, D2P, Sk2;
  size_t kp, kf, vp, qb, sb, pb, mrow, total; /* byte offsets; total = size */
} attn_layout;

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

static attn_layout layout_of(int64_t Sk, int64_t D) {
  attn_layout L;
  L.SkP = (Sk + 15) / 16 * 16;
  L.DP = (D + 15) / 16 * 16;
  L.D2 = (D + 1) / 2;
  L.D2P = (L.D2 + 15) / 16 * 16;
  L.Sk2 = (Sk + 1) / 2;
  size_t off = 0;
  L.kp = off, off += round64((size_t)(L.D2 * L.SkP) * 4);
  L.kf = off, off += round64((size_t)(D * L.SkP) * 4); /* K in float32, where a block needs it */
  L.vp = off, off += round64((size_t)(L.Sk2 * L.DP) * 4);
  L.qb = off, off += round64((size_t)(MR * L.D2P) * 4);
  L.sb = off, off += round64((size_t)(MR * L.SkP) * 4);
  L.pb = off, off += round64((size_t)(MR * L.SkP) * 2);
  L.mrow = off, off += round64((size_t)L.SkP * 4);
  L.total = off;
  return L;
}

/* ---- vector helpers ------------------------------------------------------------------- */

INLINE __mmask16 first_n(int64_t n) {
  if (n >= 16) return (__mmask16)0xFFFF;
  if (n <= 0) return 0;
  return (__mmask16)((1u << n) - 1u);
}

/* 32 floats row[e0 .. e0+32) (zero past n) -> 16 words of bf16 pairs (row[2i], row[2i+1]). */
INLINE BF16_TARGET __m512i pair_words(const float* row, int64_t e0, int64_t n) {
  __m512 lo = _mm512_maskz_loadu_ps(first_n(n - e0), row + e0);
  __m512 hi = _mm512_maskz_loadu_ps(first_n(n - e0 - 16), row + e0 + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); /* bf16 element i = row[e0 + i] */
}

/* In-register transpose of a 16 x 16 matrix of 32-bit words. */
INLINE BF16_TARGET void transpose16(__m512i r[16]) {
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
 * times 2^n by vscalefps. x is clamped at -150 so that -inf gives exactly 0; NaN stays NaN
 * (vmaxps returns its second operand where one is NaN). */
INLINE BF16_TARGET __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3333558146e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
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

/* max over r < MR of the lane sums of a[r] (a 4 x 16 transposing reduction); NaN where one
 * is NaN */
INLINE BF16_TARGET float max_row_sum4(const __m512 a[MR]) {
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

/* acc[r][0 .. 16 nv) = sum_w a[r][w] . b[w][0 .. 16 nv) over w < n (MR rows of bf16 pair
 * words against n rows of ldb words): the product loop of P V and of BF16 Q K^T. */
INLINE BF16_TARGET void dot_tile(const int nv, const uint32_t* a, int64_t lda, int64_t n,
                                 const uint32_t* b, int64_t ldb, __m512 acc[MR][NV]) {
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < nv; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t w = 0; w < n; ++w) {
    __m512bh bw[NV];
    for (int j = 0; j < nv; ++j) bw[j] = (__m512bh)_mm512_loadu_si512(b + w * ldb + 16 * j);
    for (int r = 0; r < MR; ++r) {
      __m512bh aw = (__m512bh)_mm512_set1_epi32((int)a[r * lda + w]);
      for (int j = 0; j < nv; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], aw, bw[j]);
    }
  }
}

/* s[r][0 .. 16 nv) = sum_d2 qb[r][d2] . kp[d2][0 .. 16 nv)  (MR rows, bf16 pairs). */
INLINE BF16_TARGET void qk_tile_bf16(const int nv, const uint32_t* qb, int64_t ldq, int64_t d2n,
                                     const uint32_t* kp, int64_t ldk, float* s, int64_t lds) {
  __m512 acc[MR][NV];
  dot_tile(nv, qb, ldq, d2n, kp, ldk, acc);
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < nv; ++j) _mm512_storeu_ps(s + r * lds + 16 * j, acc[r][j]);
}

/* s[r][0 .. 16 nv) = sum_d q[r][d] kf[d][0 .. 16 nv)  (MR rows, float32 FMA). */
INLINE BF16_TARGET void qk_tile_f32(const int nv, const float* const* q, int64_t D,
                                    const float* kf, int64_t ldk, float* s, int64_t lds) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < nv; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    __m512 b[NV];
    for (int j = 0; j < nv; ++j) b[j] = _mm512_loadu_ps(kf + d * ldk + 16 * j);
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(q[r][d]);
      for (int j = 0; j < nv; ++j) acc[r][j] = _mm512_fmadd_ps(a, b[j], acc[r][j]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < nv; ++j) _mm512_storeu_ps(s + r * lds + 16 * j, acc[r][j]);
}

/* out[r][0 .. min(16 nv, ncols)) = quantize(inv[r] * sum_j2 pw[r][j2] . vp[j2][..]) for
 * r < mr, where inv[r] = 1 / (rowsum * out_scale). */
INLINE BF16_TARGET void pv_tile(const int nv, const uint32_t* pw, int64_t ldp, int64_t j2n,
                                const uint32_t* vp, int64_t ldv, const float* inv, int mr,
                                int8_t* out, int64_t ldo, int64_t ncols, const attn_params* p) {
  __m512 acc[MR][NV];
  dot_tile(nv, pw, ldp, j2n, vp, ldv, acc);
  const __m512i zp = _mm512_set1_epi32(p->zp);
  const __m512i lo = _mm512_set1_epi32(p->qmin), hi = _mm512_set1_epi32(p->qmax);
  /* keep the product inside int32 before converting (saturates to the right end) */
  const __m512 flo = _mm512_set1_ps((float)p->qmin - (float)p->zp - 1.0f);
  const __m512 fhi = _mm512_set1_ps((float)p->qmax - (float)p->zp + 1.0f);
  for (int r = 0; r < MR; ++r) {
    if (r >= mr) break;
    __m512 scale = _mm512_set1_ps(inv[r]);
    for (int j = 0; j < nv; ++j) {
      __m512 y = _mm512_mul_ps(acc[r][j], scale);
      y = _mm512_min_ps(_mm512_max_ps(y, flo), fhi);
      __m512i c = _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      c = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(c, zp), lo), hi);
      _mm512_mask_cvtepi32_storeu_epi8(out + r * ldo + 16 * j, first_n(ncols - 16 * j), c);
    }
  }
}

/* ---- softmax -------------------------------------------------------------------------- */

/* Phase 1 of one row: t = s * mul (+ mask), -inf past `keep` (Sk or is_causal) and where a
 * bool mask is false; stored back into s; returns the lane-wise max. mul is scale log2(e)
 * (t in log2 units) but for a float mask, which is added as torch adds it, in natural-log
 * units (mul = scale; exp_row converts after subtracting the max): so a mask of -FLT_MAX, which
 * torch's masks use, stays finite (times log2(e) it would be -inf, which means "fully masked").
 * Lanes where a float mask made t NaN are or'ed into *nan (the max below could drop them). */
INLINE BF16_TARGET __m512 scores_row(float* s, int64_t SkP, int64_t keep, const uint8_t* mrow,
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
INLINE BF16_TARGET __m512 exp_row(const float* s, uint16_t* prow, int64_t SkP, float mx,
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

/* One (b, h). Returns 1 where the call must be declined (the reference, whose NaN / inf results
 * are torch's, runs instead): a q, k or v that is not finite (or past about 1e19, where |q|^2
 * overflows), a NaN score or mask value, or +inf (which makes the row's max +inf and its sum
 * NaN); -inf is fine (masked out). Else 0. */
static BF16_TARGET int attention_head(const attn_params* p, int64_t b, int64_t h,
                                      const attn_layout* L, char* ws) {
  const uint32_t* kp = (const uint32_t*)(ws + L->kp);
  const float* kf = (const float*)(ws + L->kf);
  uint32_t* vp = (uint32_t*)(ws + L->vp);
  uint32_t* qb = (uint32_t*)(ws + L->qb);
  float* sb = (float*)(ws + L->sb);
  uint16_t* pb = (uint16_t*)(ws + L->pb);
  uint8_t* mbuf = (uint8_t*)(ws + L->mrow);
  const int64_t Sq = p->Sq, Sk = p->Sk, D = p->D, SkP = L->SkP;
  const float* q = p->q + b * p->qs[0] + h * p->qs[1];
  const float* kh = p->k + b * p->ks[0] + h * p->ks[1];
  const float kn = pack_k_bf16(kh, p->ks[2], Sk, D, L, (uint32_t*)kp);
  const __m512 vsum = pack_v(p->v + b * p->vs[0] + h * p->vs[1], p->vs[2], Sk, D, L, vp);
  int bad = !(kn <= FLT_MAX) || _mm512_cmp_ps_mask(_mm512_mul_ps(vsum, _mm512_setzero_ps()),
                                                  _mm512_setzero_ps(), _CMP_NEQ_UQ) != 0;
  int kf_ready = 0; /* K in float32, packed when the first row block needs it */
  const uint8_t* mhead = NULL;
  const size_t esize = p->mask_float ? 4 : 1;
  if (p->mask) mhead = p->mask + (b * p->ms[0] + h * p->ms[1]) * (int64_t)esize;
  int8_t* out = p->out + b * p->os[0] + h * p->os[1];
  const int64_t ldo = p->os[2];
  /* scores in log2 units (scale log2(e)), or natural ones with a float mask (scores_row) */
  const float mul = p->mask_float ? p->scale : p->scale * LOG2E;
  float inv[MR];

  for (int64_t i0 = 0; i0 < Sq; i0 += MR) {
    int mr = Sq - i0 < MR ? (int)(Sq - i0) : MR;
    __m512 n2[MR]; /* |q_r|^2 in lanes (bf16 values, as for k) */
    for (int r = 0; r < MR; ++r) {
      n2[r] = _mm512_setzero_ps();
      for (int64_t w0 = 0; w0 < L->D2P; w0 += 16) {
        const __m512i w = r < mr ? pair_words(q + (i0 + r) * p->qs[2], 2 * w0, D)
                                 : _mm512_setzero_si512();
        _mm512_storeu_si512(qb + r * L->D2P + w0, w);
        n2[r] = _mm512_dpbf16_ps(n2[r], (__m512bh)w, (__m512bh)w);
      }
    }
    /* BF16 products only where no logit of the block can be large: |q_i . k_j| scale <=
     * |q_i| |k_j| scale <= QK_BF16_MAX (Cauchy-Schwarz); else float32 (see Precision) */
    const float qn = max_row_sum4(n2);
    bad |= !(qn <= FLT_MAX);
    if (p->scale * p->scale * qn * kn <= QK_BF16_MAX * QK_BF16_MAX) {
      for (int64_t c0 = 0; c0 < SkP; c0 += 16 * NV) {
        const uint32_t* kc = kp + c0;
        float* sc = sb + c0;
        switch ((SkP - c0) / 16 < NV ? (int)((SkP - c0) / 16) : NV) {
          case 1: qk_tile_bf16(1, qb, L->D2P, L->D2, kc, SkP, sc, SkP); break;
          case 2: qk_tile_bf16(2, qb, L->D2P, L->D2, kc, SkP, sc, SkP); break;
          case 3: qk_tile_bf16(3, qb, L->D2P, L->D2, kc, SkP, sc, SkP); break;
          default: qk_tile_bf16(4, qb, L->D2P, L->D2, kc, SkP, sc, SkP); break;
        }
      }
    } else {
      if (!kf_ready) pack_k_f32(kh, p->ks[2], Sk, D, L, (float*)kf);
      kf_ready = 1;
      const float* qr[MR]; /* rows past Sq repeat the last one (their scores are not used) */
      for (int r = 0; r < MR; ++r) qr[r] = q + (i0 + (r < mr ? r : mr - 1)) * p->qs[2];
      for (int64_t c0 = 0; c0 < SkP; c0 += 16 * NV) {
        switch ((SkP - c0) / 16 < NV ? (int)((SkP - c0) / 16) : NV) {
          case 1: qk_tile_f32(1, qr, D, kf + c0, SkP, sb + c0, SkP); break;
          case 2: qk_tile_f32(2, qr, D, kf + c0, SkP, sb + c0, SkP); break;
          case 3: qk_tile_f32(3, qr, D, kf + c0, SkP, sb + c0, SkP); break;
          default: qk_tile_f32(4, qr, D, kf + c0, SkP, sb + c0, SkP); break;
        }
      }
    }
    /* softmax of the MR rows, phase by phase (their reductions overlap) */
    __m512 red[MR];
    float mx[MR];
    for (int r = 0; r < MR; ++r) {
      red[r] = _mm512_set1_ps(-INFINITY);
      if (r >= mr) continue;
      int64_t i = i0 + r;
      int64_t keep = p->causal && i + 1 < Sk ? i + 1 : Sk;
      const uint8_t* mrow = NULL;
      if (mhead != NULL) {
        mrow = mhead + i * p->ms[2] * (int64_t)esize;
        if (p->ms[3] == 0 && !p->mask_float) { /* one bool for the row (HF BERT) */
          if (!mrow[0]) keep = 0;
          mrow = NULL;
        } else if (p->ms[3] != 1) { /* a broadcast / strided mask row: gather it */
          gather_row(mrow, p->ms[3], Sk, p->mask_float, mbuf);
          mrow = mbuf;
        }
      }
      __mmask16 nan = 0;
      red[r] = scores_row(sb + r * SkP, SkP, keep, mrow, p->mask_float, mul, &nan);
      bad |= nan != 0;
    }
    for (int r = 0; r < MR; ++r) mx[r] = _mm512_reduce_max_ps(red[r]);
    for (int r = 0; r < MR; ++r) {
      red[r] = _mm512_setzero_ps();
      bad |= mx[r] != mx[r];
      if (!(mx[r] > -INFINITY)) { /* fully masked (torch gives zeros) or a padding row */
        memset(pb + r * SkP, 0, (size_t)SkP * 2);
        continue;
      }
      red[r] = p->mask_float ? exp_row(sb + r * SkP, pb + r * SkP, SkP, mx[r], 1)
                             : exp_row(sb + r * SkP, pb + r * SkP, SkP, mx[r], 0);
    }
    for (int r = 0; r < MR; ++r) { /* 1 / (rowsum out_scale); 0: fully masked, out = zp */
      float t = _mm512_reduce_add_ps(red[r]);
      bad |= t != t; /* a NaN score, or +inf (mx = +inf) */
      inv[r] = t > 0.0f ? p->inv_out_scale / t : 0.0f;
    }
    const uint32_t* pw = (const uint32_t*)pb;
    for (int64_t c0 = 0; c0 < L->DP; c0 += 16 * NV) {
      int8_t* oc = out + i0 * ldo + c0;
      const uint32_t* vc = vp + c0;
      switch ((L->DP - c0) / 16 < NV ? (int)((L->DP - c0) / 16) : NV) {
        case 1: pv_tile(1, pw, SkP / 2, L->Sk2, vc, L->DP, inv, mr, oc, ldo, D - c0, p); break;
        case 2: pv_tile(2, pw, SkP / 2, L->Sk2, vc, L->DP, inv, mr, oc, ldo, D - c0, p); break;
        case 3: pv_tile(3, pw, SkP / 2, L->Sk2, vc, L->DP, inv, mr, oc, ldo, D - c0, p); break;
        default: pv_tile(4, pw, SkP / 2, L->Sk2, vc, L->DP, inv, mr, oc, ldo, D - c0, p); break;
      }
    }
  }
  return bad;
}

/* Heads one after another on this thread, with the scratch ws; 1 where some head saw a value
 * that is not finite (see attention_head). */
static BF16_TARGET int attention(const attn_params* p, const attn_layout* L, char* ws) {
  int bad = 0;
  for (int64_t b = 0; b < p->B; ++b)
    for (int64_t h = 0; h < p->H; ++h) bad |= attention_head(p, b, h, L, ws);
  return bad;
}

/* Threads for this call: torch's OpenMP threads (the library links libgomp.so.1, which torch
 * has loaded, so torch.set_num_threads applies) when built with -fopenmp, the call is large
 * enough and there are several heads; else 1. */
static int attention_threads(const attn_params* p) {
#if defined(_OPENMP)
  const int64_t heads = p->B * p->H;
  if (heads < 2 || heads * p->Sq * p->Sk * p->D < PARALLEL_MIN_MACS) return 1;
  const int t = omp_get_max_threads();
  return t < heads ? t : (int)heads;
#else
  (void)p;
  return 1;
#endif
}

/* The heads shared over `threads` threads, each with its own scratch: thread i uses
 * ws + i * L->total (heads write disjoint slices of the output). */
static BF16_TARGET int attention_parallel(const attn_params* p, const attn_layout* L, char* ws,
                                          int threads) {
#if defined(_OPENMP)
  const int64_t heads = p->B * p->H;
  int bad = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(| : bad)
  for (int64_t t = 0; t < heads; ++t)
    bad |= attention_head(p, t / p->H, t % p->H, L, ws + (size_t)omp_get_thread_num() * L->total);
  return bad;
#else
  (void)threads;
  return attention(p, L, ws);
#endif
}

/* ---- the pdlkit contract -------------------------------------------------------------- */

static const pdlkit_attribute* attr(const pdlkit_attribute* const* attrs, size_t n,
                                    const char* name, int32_t kind) {
  const pdlkit_attribute* a = pdlkit_find_attr(attrs, n, name);
  return a != NULL && a->kind == kind ? a : NULL;
}

static int32_t check_mask(const DLTensor* m, char* error, size_t error_size) {
  if (!pdlkit_is_none(m)) {
    if (m->ndim != 4)
      return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT, "attn_mask must be 4-D");
    if (!pdlkit_dtype_is(m->dtype, kDLBool, 8) && !pdlkit_dtype_is(m->dtype, kDLFloat, 32))
      return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                          "attn_mask must be bool or float32");
  }
  return PDLKIT_OK;
}

/* Ranks and dtypes of q, k, v and the mask (meta() and run()). */
static int32_t check_shapes(const DLTensor* in, size_t n, char* error, size_t error_size) {
  if (n != 4)
    return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                        "expects 4 tensor inputs (q, k, v, attn_mask), got %zu", n);
  for (int i = 0; i < 3; ++i)
    if (in[i].ndim != 4 || !pdlkit_dtype_is(in[i].dtype, kDLFloat, 32))
      return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                          "q, k, v must be 4-D float32");
  return check_mask(&in[3], error, error_size);
}

/* run() only: the sizes agree. (meta() skips this: with dynamic shapes the host probes meta
 * by doubling one size symbol at a time, and sizes that are equal but carry different
 * symbols would then disagree; the output's shape needs only q's sizes.) */
static int32_t check_agreement(const DLTensor* in, char* error, size_t error_size) {
  const DLTensor *q = &in[0], *k = &in[1], *v = &in[2];
  if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] ||
      v->shape[1] != q->shape[1] || k->shape[3] != q->shape[3] || v->shape[3] != q->shape[3] ||
      v->shape[2] != k->shape[2])
    return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                        "q [B, H, Sq, D], k and v [B, H, Sk, D] do not agree");
  return PDLKIT_OK;
}

/* merged = 0: out [B, H, Sq, D] (attention_q); 1: out [B, Sq, H * D], the heads merged as
 * attention's output projection reads them (attention_q_merged). */
static int32_t meta(const pdlkit_meta_frame* f, int merged) {
  int32_t st = check_shapes(f->inputs, f->num_inputs, f->error, f->error_size);
  if (st != PDLKIT_OK) return st;
  if (f->num_outputs != 1 || f->max_ndim < 4)
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "one 4-D output");
  const pdlkit_attribute* qmin = attr(f->attrs, f->num_attrs, "out_qmin", PDLKIT_KIND_INT);
  if (qmin == NULL)
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "no int out_qmin");
  DLTensor* y = &f->outputs[0];
  const int64_t* qs = f->inputs[0].shape;
  if (merged) {
    y->ndim = 3;
    y->shape[0] = qs[0], y->shape[1] = qs[2], y->shape[2] = qs[1] * qs[3];
  } else {
    y->ndim = 4;
    for (int d = 0; d < 4; ++d) y->shape[d] = qs[d];
  }
  y->dtype.code = qmin->i >= 0 ? kDLUInt : kDLInt;
  y->dtype.bits = 8;
  y->dtype.lanes = 1;
  return PDLKIT_OK;
}

static int32_t attention_q_meta(const pdlkit_meta_frame* f) { return meta(f, 0); }
static int32_t attention_q_merged_meta(const pdlkit_meta_frame* f) { return meta(f, 1); }

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
  void* own = NULL;
  int threads = attention_threads(p);
  if (threads > 1) { /* one scratch per thread (L.total is a multiple of 64) */
    own = aligned_alloc(64, (size_t)threads * L.total);
    threads = own != NULL ? threads : 1; /* no memory for all: one thread, as below */
  }
  int bad;
  if (threads > 1) {
    bad = attention_parallel(p, &L, (char*)own, threads);
  } else {
    if (ws == NULL || ws_size < L.total) {
      own = aligned_alloc(64, L.total);
      if (own == NULL) return -1;
      ws = (char*)own;
    }
    bad = attention(p, &L, ws);
  }
  free(own);
  return bad;
}

#define DECLINE(...) pdlkit_error(f->error, f->error_size, PDLKIT_UNSUPPORTED, __VA_ARGS__)

static int32_t run(const pdlkit_call_frame* f, int merged) {
  int32_t st = check_shapes(f->inputs, f->num_inputs, f->error, f->error_size);
  if (st == PDLKIT_OK) st = check_agreement(f->inputs, f->error, f->error_size);
  if (st != PDLKIT_OK) return st;
  const DLTensor *q = &f->inputs[0], *k = &f->inputs[1], *v = &f->inputs[2];
  const DLTensor* m = &f->inputs[3];
  const DLTensor* y = &f->outputs[0];
  const pdlkit_attribute* at[6];
  static const char* const names[6] = {"is_causal", "out_qmax", "out_qmin",
                                       "out_scale", "out_zp",   "scale"};
  static const int32_t kinds[6] = {PDLKIT_KIND_INT,   PDLKIT_KIND_INT, PDLKIT_KIND_INT,
                                   PDLKIT_KIND_FLOAT, PDLKIT_KIND_INT, PDLKIT_KIND_FLOAT};
  for (int i = 0; i < 6; ++i)
    if ((at[i] = attr(f->attrs, f->num_attrs, names[i], kinds[i])) == NULL)
      return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT,
                          "missing attribute %s", names[i]);
  attn_params p;
  memset(&p, 0, sizeof(p));
  p.B = q->shape[0], p.H = q->shape[1], p.Sq = q->shape[2], p.Sk = k->shape[2];
  p.D = q->shape[3];
  int is_u8 = at[2]->i >= 0;
  const int64_t want3[3] = {p.B, p.Sq, p.H * p.D};
  int shape_ok = f->num_outputs == 1 && y->ndim == (merged ? 3 : 4);
  for (int d = 0; shape_ok && d < y->ndim; ++d)
    shape_ok = y->shape[d] == (merged ? want3[d] : q->shape[d]);
  if (!shape_ok || !pdlkit_is_contiguous(y) ||
      !pdlkit_dtype_is(y->dtype, is_u8 ? kDLUInt : kDLInt, 8))
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT,
                        "output must be a contiguous %s 8-bit tensor",
                        merged ? "[B, Sq, H * D]" : "[B, H, Sq, D]");
  if (p.B * p.H * p.Sq * p.D == 0) return PDLKIT_OK;
  for (int i = 0; i < 4; ++i)
    if (!pdlkit_is_none(&f->inputs[i]) && f->inputs[i].device.device_type != kDLCPU)
      return DECLINE("CPU tensors only");
  for (int i = 0; i < 3; ++i)
    if (f->inputs[i].shape[3] > 1 && f->inputs[i].strides[3] != 1)
      return DECLINE("%s: the last dim is not contiguous", i == 0 ? "q" : i == 1 ? "k" : "v");
  if (p.Sk == 0) return DECLINE("no keys (Sk = 0)");
  if (p.Sk > MAX_DIM || p.D > MAX_DIM)
    return DECLINE("Sk = %lld or D = %lld above %d", (long long)p.Sk, (long long)p.D, MAX_DIM);
  double scale = at[5]->f, out_scale = at[3]->f;
  if (!(out_scale > 0.0) || !isfinite(out_scale))
    return DECLINE("out_scale %g is not a positive number", out_scale);
  int64_t qmin = at[2]->i, qmax = at[1]->i, zp = at[4]->i;
  if (qmin > qmax || qmin < (is_u8 ? 0 : -128) || qmax > (is_u8 ? 255 : 127) || zp < -(1 << 20) ||
      zp > (1 << 20))
    return DECLINE("quantization range [%lld, %lld] / zero point %lld not 8-bit", (long long)qmin,
                   (long long)qmax, (long long)zp);
  if (!has_isa()) return DECLINE("this CPU lacks AVX512F / AVX512BW / AVX512_BF16");

  if (!(scale > 0.0)) scale = 1.0 / sqrt((double)p.D); /* scale <= 0 / NaN: None */
  p.scale = (float)scale;
  p.inv_out_scale = (float)(1.0 / out_scale);
  p.zp = (int32_t)zp, p.qmin = (int32_t)qmin, p.qmax = (int32_t)qmax;
  p.causal = at[0]->i != 0;
  const DLTensor* t3[3] = {q, k, v};
  const float** ptr3[3] = {&p.q, &p.k, &p.v};
  int64_t* s3[3] = {p.qs, p.ks, p.vs};
  for (int i = 0; i < 3; ++i) {
    *ptr3[i] = (const float*)((const char*)t3[i]->data + t3[i]->byte_offset);
    for (int d = 0; d < 3; ++d) s3[i][d] = t3[i]->strides[d];
  }
  if (!pdlkit_is_none(m)) {
    const int64_t want[4] = {p.B, p.H, p.Sq, p.Sk};
    for (int d = 0; d < 4; ++d) {
      if (m->shape[d] != want[d] && m->shape[d] != 1)
        return DECLINE("attn_mask dim %d is %lld, not 1 or %lld", d, (long long)m->shape[d],
                       (long long)want[d]);
      p.ms[d] = m->shape[d] == 1 ? 0 : m->strides[d];
    }
    p.mask = (const uint8_t*)m->data + m->byte_offset;
    p.mask_float = pdlkit_dtype_is(m->dtype, kDLFloat, 32);
    if (p.Sk == 1) p.ms[3] = 1; /* one column: its stride is irrelevant */
  }
  p.out = (int8_t*)((char*)y->data + y->byte_offset);
  if (merged) /* out[b, i, h D + d] */
    p.os[0] = p.Sq * p.H * p.D, p.os[1] = p.D, p.os[2] = p.H * p.D;
  else /* out[b, h, i, d] */
    p.os[0] = p.H * p.Sq * p.D, p.os[1] = p.Sq * p.D, p.os[2] = p.D;

  int rc = execute(&p, (char*)f->workspace, f->workspace_size);
  if (rc > 0)
    return DECLINE("q, k, v, a score q . k * scale or the mask is not finite (NaN or inf; a "
                   "mask's -inf is fine): the reference runs, whose NaN / inf results are torch's");
  if (rc < 0) return DECLINE("no memory for the attention's scratch");
  return PDLKIT_OK;
}

static int32_t attention_q_run(const pdlkit_call_frame* f) { return run(f, 0); }
static int32_t attention_q_merged_run(const pdlkit_call_frame* f) { return run(f, 1); }

/* ---- the plain C entry (ctypes) ------------------------------------------------------ */

/* For qlinear_vnni.py's qkv_attention_q_merged, which mirrors attn_params in ctypes. */
PDLKIT_EXPORT int64_t pdlkit_attention_params_size(void) { return (int64_t)sizeof(attn_params); }

/* The Q, K and V projections and the attention of one batch after another, so that each
 * batch's q | k | v rows (S x 3 N float32, N = H D) stay in L2 between the GEMM that writes
 * them and the attention that reads them: gemm is qgemm_vnni.c's pdlkit_qgemm_run (another
 * library; passed in by the caller) with its vectors and params; x holds B S rows of ldx
 * bytes; scratch S x 3 N floats; tmpl holds what is the same in every call of a site (B, H,
 * S, D, the strides of q, k, v in scratch and of out, scale, quantization, the mask's
 * strides), checked by the caller as run() checks them. 0; 1: the CPU lacks AVX512F /
 * AVX512BW / AVX512_BF16; 2: no memory for the scratch; 3: a value was not finite (as run()
 * declines it); 10 + rc: the GEMM returned rc > 0. */
typedef int32_t (*qkv_gemm_fn)(const void* x, int64_t m, int64_t ldx, void* out, int64_t ldo,
                               const void* w_scale, const void* bias, const void* w_zp,
                               const void* params);

PDLKIT_EXPORT int32_t pdlkit_attention_run_qkv(const attn_params* tmpl, qkv_gemm_fn gemm,
                                               const uint8_t* x, int64_t ldx,
                                               const void* const* vectors, const void* params,
                                               float* scratch, const uint8_t* mask,
                                               int8_t* out) {
  if (!has_isa()) return 1;
  const int64_t S = tmpl->Sq, N = tmpl->H * tmpl->D;
  const size_t esize = tmpl->mask_float ? 4 : 1;
  attn_params p = *tmpl;
  p.B = 1;
  p.q = scratch, p.k = scratch + N, p.v = scratch + 2 * N;
  /* the attention's scratch, once for all batches (several threads allocate their own) */
  const size_t ws_size = layout_of(p.Sk, p.D).total;
  char* ws = (char*)aligned_alloc(64, ws_size);
  if (ws == NULL) return 2;
  int32_t rc = 0;
  for (int64_t b = 0; b < tmpl->B && rc == 0; ++b) {
    int32_t g = gemm(x + b * S * ldx, S, ldx, scratch, 3 * N, vectors[0], vectors[1],
                     vectors[2], params);
    if (g != 0) {
      rc = g < 0 ? 2 : 10 + g;
      break;
    }
    p.mask = mask != NULL ? mask + b * tmpl->ms[0] * (int64_t)esize : NULL;
    p.out = out + b * tmpl->os[0];
    const int e = execute(&p, ws, ws_size);
    rc = e > 0 ? 3 : e < 0 ? 2 : 0;
  }
  free(ws);
  return rc;
}

static const DLDataType kF32[] = {{kDLFloat, 32, 1}};
static const DLDataType kMask[] = {{kDLBool, 8, 1}, {kDLFloat, 32, 1}};
static const int32_t kRank4[] = {4};

#define QKV(name) \
  {sizeof(pdlkit_arg_desc), name, PDLKIT_KIND_TENSOR, kF32, 1, kRank4, 1, NULL, NULL, 0, 0, 0, 0}
#define ARG(name, kind) {sizeof(pdlkit_arg_desc), name, kind, NULL, 0, NULL, 0, NULL, NULL, 0, 0, 0, 0}

static const pdlkit_arg_desc kArgs[] = {
    QKV("q"),
    QKV("k"),
    QKV("v"),
    {sizeof(pdlkit_arg_desc), "attn_mask", PDLKIT_KIND_TENSOR, kMask, 2, kRank4, 1, NULL, NULL, 0,
     0, 0, 1},
    ARG("is_causal", PDLKIT_KIND_INT),
    ARG("scale", PDLKIT_KIND_FLOAT),
    ARG("out_scale", PDLKIT_KIND_FLOAT),
    ARG("out_zp", PDLKIT_KIND_INT),
    ARG("out_qmin", PDLKIT_KIND_INT),
    ARG("out_qmax", PDLKIT_KIND_INT),
};

/* avx512bw is not among pdlkit's ISA feature names (runtime_abi/capability.py); every CPU with
 * AVX512_BF16 has it, and run() checks all three itself. */
static const char* const kIsa[] = {"avx512f", "avx512_bf16"};

#define DESC(name, op, meta_fn, run_fn, doc)                                                 \
  {sizeof(pdlkit_kernel_desc), name, 1, op, kDLCPU, 10 /* priority */, kArgs,                  \
   sizeof(kArgs) / sizeof(kArgs[0]), kIsa, sizeof(kIsa) / sizeof(kIsa[0]), WORKSPACE_BYTES,     \
   PDLKIT_TRAIT_DETERMINISTIC, 1, meta_fn, run_fn, doc, NULL, NULL}

static const pdlkit_kernel_desc kAttentionQ = DESC(
    "x86_attention_q_bf16", "attention_q", attention_q_meta, attention_q_run,
    "quantize_per_tensor(scaled_dot_product_attention(q, k, v, mask)) -> u8 / s8 [B, H, Sq, D]: "
    "AVX512_BF16 dpbf16 for Q K^T (float32 FMA where a logit could exceed 16) and P V with "
    "fp32 accumulation, fp32 softmax (own exp2), quantization fused into the store; any B, H, "
    "S, D, bool / float / no mask, causal; declines a non-contiguous last dim and NaN / inf "
    "inputs, scores or mask values (but a mask's -inf).");

static const pdlkit_kernel_desc kAttentionQMerged = DESC(
    "x86_attention_q_merged_bf16", "attention_q_merged", attention_q_merged_meta,
    attention_q_merged_run,
    "attention_q with the heads merged: quantize_per_tensor(sdpa(q, k, v, mask).transpose(1, 2)"
    ".reshape(B, Sq, H * D)) -> u8 / s8, stored straight into the [B, Sq, H * D] layout the "
    "output projection reads (PT2E BERT graphs); same method as x86_attention_q_bf16.");

static const pdlkit_kernel_desc* const kKernels[] = {&kAttentionQ, &kAttentionQMerged};

PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration* out, char* error,
                                      size_t error_size) {
  PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size);
  if (host_minor < 1) /* attn_mask is an optional tensor (ABI 1.1) */
    return pdlkit_error(error, error_size, PDLKIT_UNSUPPORTED,
                        "needs a host speaking pdlkit ABI >= 1.1 (optional attn_mask), got 1.%u",
                        (unsigned)host_minor);
  out->kernels = kKernels;
  out->num_kernels = sizeof(kKernels) / sizeof(kKernels[0]);
  return PDLKIT_OK;
}
