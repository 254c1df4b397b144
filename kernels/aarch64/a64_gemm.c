/*
 * a64_gemm: int8 and BF16 GEMM kernels for AArch64 (Alibaba Yitian 710 / Neoverse N2 class)
 * as a pdlkit native kernel library (C ABI 1.1: optional bias, pre-packed weights).
 *
 *   qlinear / qlinear_q / qlinear_dynamic   PT2E int8 linear: u8 or s8 activations, s8
 *       weights (per-channel or per-tensor scales, zero points 0), fp32 bias, ReLU / GELU,
 *       fp32 output (dequantize) or u8 / s8 output (requantize). Two variants each:
 *         *_i8mm  SMMLA (s8 x s8) and USMMLA (u8 x s8)          requires i8mm
 *         *_sdot  SDOT, u8 activations offset by -128            requires asimddp
 *   qlinear_pt / qlinear_q_pt / qlinear_dynamic_pt   the same with the weight quantized per
 *       tensor (its scale and zero point are numbers: torchao's ArmInductorQuantizer graphs)
 *   linear / linear_relu / linear_gelu      BF16 GEMM with BFMMLA, fp32 accumulation, bf16
 *       or fp32 bias, bf16 output                                 requires bf16
 *
 * Build (see kernels/aarch64/README.md; `pdlkit build-kernels` runs the same command):
 *
 *   aarch64-linux-gnu-gcc -O3 -march=armv8-a -mtune=neoverse-n2 -shared -fPIC -Wall \
 *       -I runtime_abi/include kernels/aarch64/a64_gemm.c -lm -o libpdlkit_a64_gemm.so
 *
 * (`gcc` instead of `aarch64-linux-gnu-gcc` on an AArch64 host.) The baseline is plain
 * Armv8-A: only the inner loops carry `target` attributes (i8mm, bf16, dotprod), so the
 * library loads and registers on every AArch64 CPU and run() checks the CPU's hwcaps
 * (getauxval) before it touches an instruction the CPU may lack: it returns
 * PDLKIT_UNSUPPORTED instead of dying of SIGILL.
 *
 * Layout. The weight W[N, K] (a linear's [out, in]) is packed once (the ABI's prepack hook)
 * into panels of 8 output columns. Inside a panel, for every K step (8 int8 / 4 bf16
 * values) come four 16-byte vectors, one per column pair (n, n+1):
 *     int8:  W[n][k .. k+8]  W[n+1][k .. k+8]
 *     bf16:  W[n][k .. k+4]  W[n+1][k .. k+4]
 * which is the right-hand operand of SMMLA / USMMLA / BFMMLA (a 2 x 8 or 2 x 4 matrix).
 * N and K are zero-padded to whole steps and panels, and the int8 packing also stores each
 * column's sum (for the activation zero point). The activation needs no packing: two rows'
 * 8 bytes loaded side by side are the left operand, so a micro-tile of 8 rows x 8 columns
 * reads 4 + 4 vectors per K step and issues 16 MMLA instructions (8 x 8 x 8 = 512 MACs
 * for int8, 256 for bf16), with 16 accumulators of 2 x 2 results.
 *
 * The SDOT fallback reads the same packed panels: one row's 8 bytes replicated twice
 * (ld1r) dotted with a column-pair vector gives, per lane, four products of (n, k..k+3),
 * (n, k+4..k+7), (n+1, ...), (n+1, ...); a pairwise add of two rows' lanes yields exactly
 * the 2 x 2 tile SMMLA produces, so both variants share the packing and the epilogue.
 *
 * Edges: any M (a tile's missing rows repeat its last row and are not stored), any N
 * (padded columns are not stored), any K (the last partial step is copied zero-padded),
 * M = 0 and K = 0 included. Single-threaded.
 */
#include <arm_neon.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>

#include "pdlkit_abi.h"

#define I8MM_FN __attribute__((target("arch=armv8.6-a+i8mm")))
#define BF16_FN __attribute__((target("arch=armv8.6-a+bf16")))
#define DOT_FN __attribute__((target("arch=armv8.2-a+dotprod")))
#define INLINE static inline __attribute__((always_inline))

/* Linux arm64 hwcaps (asm/hwcap.h), spelled out for older headers. */
#define A64_HWCAP_ASIMDDP (1UL << 20)
#define A64_HWCAP2_I8MM (1UL << 13)
#define A64_HWCAP2_BF16 (1UL << 14)

enum { MR = 8, NR = 8 };

/* ---- packed weights ---------------------------------------------------------------- */

#define PACK_MAGIC 0x38413650u /* "P6A8" */
enum { PACK_INT8 = 1, PACK_BF16 = 2 };

typedef struct {
  uint32_t magic;
  uint32_t kind;   /* PACK_INT8 or PACK_BF16 */
  int64_t n, k;    /* the logical weight: [n, k] */
  int64_t n_pad;   /* n rounded up to NR */
  int64_t k_pad;   /* k rounded up to the K step (8 int8, 4 bf16) */
  int64_t reserved[3];
} pack_header; /* 64 bytes; int8 packs follow it with int32 colsum[n_pad], then the panels */

_Static_assert(sizeof(pack_header) == 64, "pack header is one cache line");

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

static size_t packed_bytes(int kind, int64_t n, int64_t k) {
  int64_t n_pad = round_up(n, NR);
  if (kind == PACK_INT8) return sizeof(pack_header) + (size_t)(n_pad * 4 + n_pad * round_up(k, 8));
  return sizeof(pack_header) + (size_t)(n_pad * round_up(k, 4) * 2);
}

/* The header of a `kind` pack of an [n, k] weight, K padded to a multiple of `k_step`. */
static pack_header* pack_start(void* out, uint32_t kind, int64_t n, int64_t k, int64_t k_step) {
  pack_header* h = (pack_header*)out;
  memset(h, 0, sizeof(*h));
  h->magic = PACK_MAGIC;
  h->kind = kind;
  h->n = n, h->k = k, h->n_pad = round_up(n, NR), h->k_pad = round_up(k, k_step);
  return h;
}

static void pack_int8(const int8_t* w, int64_t n, int64_t k, void* out) {
  pack_header* h = pack_start(out, PACK_INT8, n, k, 8);
  int64_t n_pad = h->n_pad, k_pad = h->k_pad;
  int32_t* colsum = (int32_t*)(h + 1);
  int8_t* panels = (int8_t*)(colsum + n_pad);
  memset(colsum, 0, (size_t)n_pad * 4);
  memset(panels, 0, (size_t)(n_pad * k_pad));
  for (int64_t col = 0; col < n; ++col) {
    const int8_t* row = w + col * k;
    int64_t tile = col / NR, pair = (col % NR) / 2, half = col % 2;
    int8_t* dst = panels + tile * (k_pad * NR) + pair * 16 + half * 8;
    int32_t sum = 0;
    for (int64_t kk = 0; kk < k; ++kk) {
      dst[(kk / 8) * 64 + (kk % 8)] = row[kk];
      sum += row[kk];
    }
    colsum[col] = sum;
  }
}

static void pack_bf16(const uint16_t* w, int64_t n, int64_t k, void* out) {
  pack_header* h = pack_start(out, PACK_BF16, n, k, 4);
  int64_t n_pad = h->n_pad, k_pad = h->k_pad;
  uint16_t* panels = (uint16_t*)(h + 1);
  memset(panels, 0, (size_t)(n_pad * k_pad) * 2);
  for (int64_t col = 0; col < n; ++col) {
    const uint16_t* row = w + col * k;
    int64_t tile = col / NR, pair = (col % NR) / 2, half = col % 2;
    uint16_t* dst = panels + tile * (k_pad * NR) + pair * 8 + half * 4;
    for (int64_t kk = 0; kk < k; ++kk) dst[(kk / 4) * 32 + (kk % 4)] = row[kk];
  }
}

/* ---- int8 micro-kernels: 8 x 8 int32 tile = rows r[0..8) . panel --------------------- */

/* Store 2 x 2 accumulator tiles acc[p][q] (row pair p, column pair q) as tile[8][8]. */
INLINE void store_tiles(int32x4_t acc[4][4], int pairs, int32_t (*tile)[NR]) {
  for (int p = 0; p < pairs; ++p)
    for (int q = 0; q < 4; q += 2) {
      int64x2_t a = vreinterpretq_s64_s32(acc[p][q]), b = vreinterpretq_s64_s32(acc[p][q + 1]);
      vst1q_s32(&tile[2 * p][2 * q], vreinterpretq_s32_s64(vzip1q_s64(a, b)));
      vst1q_s32(&tile[2 * p + 1][2 * q], vreinterpretq_s32_s64(vzip2q_s64(a, b)));
    }
}

/* The last K step when K % 8 != 0: rows' tails copied into zero-padded 8-byte slots. */
static void tail_rows(const int8_t* const r[MR], int64_t k0, int64_t k, int8_t out[MR][8]) {
  memset(out, 0, MR * 8);
  for (int i = 0; i < MR; ++i) memcpy(out[i], r[i] + k0, (size_t)(k - k0));
}

#define MMLA_KERNEL(NAME, ATTR, ELEM, LOAD_HALF, MMLA)                                       \
  INLINE ATTR void NAME##_pairs(int pairs, const int8_t* const r[MR], int64_t k,             \
                                const int8_t* panel, int32_t tile[MR][NR]) {                 \
    int32x4_t acc[4][4];                                                                     \
    for (int p = 0; p < pairs; ++p)                                                          \
      for (int q = 0; q < 4; ++q) acc[p][q] = vdupq_n_s32(0);                                \
    int64_t k8 = k & ~(int64_t)7, kk = 0;                                                    \
    for (; kk < k8; kk += 8, panel += 64) {                                                  \
      int8x16_t b0 = vld1q_s8(panel), b1 = vld1q_s8(panel + 16);                             \
      int8x16_t b2 = vld1q_s8(panel + 32), b3 = vld1q_s8(panel + 48);                        \
      for (int p = 0; p < pairs; ++p) {                                                      \
        ELEM a = vcombine_##LOAD_HALF(r[2 * p] + kk, r[2 * p + 1] + kk);                     \
        acc[p][0] = MMLA(acc[p][0], a, b0);                                                  \
        acc[p][1] = MMLA(acc[p][1], a, b1);                                                  \
        acc[p][2] = MMLA(acc[p][2], a, b2);                                                  \
        acc[p][3] = MMLA(acc[p][3], a, b3);                                                  \
      }                                                                                      \
    }                                                                                        \
    if (kk < k) {                                                                            \
      int8_t t[MR][8];                                                                       \
      tail_rows(r, kk, k, t);                                                                \
      int8x16_t b[4] = {vld1q_s8(panel), vld1q_s8(panel + 16), vld1q_s8(panel + 32),         \
                        vld1q_s8(panel + 48)};                                               \
      for (int p = 0; p < pairs; ++p) {                                                      \
        ELEM a = vcombine_##LOAD_HALF(t[2 * p], t[2 * p + 1]);                               \
        for (int q = 0; q < 4; ++q) acc[p][q] = MMLA(acc[p][q], a, b[q]);                    \
      }                                                                                      \
    }                                                                                        \
    store_tiles(acc, pairs, tile);                                                           \
  }                                                                                          \
  static ATTR void NAME(int rows, const int8_t* const r[MR], int64_t k, const int8_t* panel, \
                        int32_t tile[MR][NR]) {                                              \
    switch ((rows + 1) / 2) {                                                                \
      case 1: NAME##_pairs(1, r, k, panel, tile); break;                                     \
      case 2: NAME##_pairs(2, r, k, panel, tile); break;                                     \
      case 3: NAME##_pairs(3, r, k, panel, tile); break;                                     \
      default: NAME##_pairs(4, r, k, panel, tile); break;                                    \
    }                                                                                        \
  }

/* Two rows' 8 bytes side by side: the 2 x 8 left operand of (U)SMMLA. */
INLINE int8x16_t vcombine_s8rows(const int8_t* a, const int8_t* b) {
  return vcombine_s8(vld1_s8(a), vld1_s8(b));
}
INLINE uint8x16_t vcombine_u8rows(const int8_t* a, const int8_t* b) {
  return vcombine_u8(vld1_u8((const uint8_t*)a), vld1_u8((const uint8_t*)b));
}

MMLA_KERNEL(tile_smmla, I8MM_FN, int8x16_t, s8rows, vmmlaq_s32)
MMLA_KERNEL(tile_usmmla, I8MM_FN, uint8x16_t, u8rows, vusmmlaq_s32)

/* SDOT: one row replicated (ld1r) against each column-pair vector; u8 rows are flipped to
 * s8 (x - 128) by `flip`, which the epilogue's zero point compensates. */
INLINE DOT_FN void sdot_rows(int quads, const int8_t* const* r, int64_t k,
                             const int8_t* panel, int32_t (*tile)[NR], int8x16_t flip) {
  int32x4_t acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int q = 0; q < 4; ++q) acc[i][q] = vdupq_n_s32(0);
  int rows = 2 * quads; /* quads: row pairs, 1 or 2 */
  int64_t k8 = k & ~(int64_t)7, kk = 0;
  for (; kk < k8; kk += 8, panel += 64) {
    int8x16_t b0 = vld1q_s8(panel), b1 = vld1q_s8(panel + 16);
    int8x16_t b2 = vld1q_s8(panel + 32), b3 = vld1q_s8(panel + 48);
    for (int i = 0; i < rows; ++i) {
      int8x16_t a = veorq_s8(vreinterpretq_s8_u64(vld1q_dup_u64((const uint64_t*)(r[i] + kk))),
                             flip);
      acc[i][0] = vdotq_s32(acc[i][0], a, b0);
      acc[i][1] = vdotq_s32(acc[i][1], a, b1);
      acc[i][2] = vdotq_s32(acc[i][2], a, b2);
      acc[i][3] = vdotq_s32(acc[i][3], a, b3);
    }
  }
  if (kk < k) {
    int8_t t[4][8];
    memset(t, 0, sizeof(t));
    for (int i = 0; i < rows; ++i) memcpy(t[i], r[i] + kk, (size_t)(k - kk));
    int8x16_t b[4] = {vld1q_s8(panel), vld1q_s8(panel + 16), vld1q_s8(panel + 32),
                      vld1q_s8(panel + 48)};
    /* zero padding must stay zero after the flip: flip only the real bytes */
    int8x8_t keep = vcreate_s8(k - kk >= 8 ? ~0ULL : ((1ULL << (8 * (k - kk))) - 1));
    int8x16_t mask = vcombine_s8(keep, keep);
    for (int i = 0; i < rows; ++i) {
      int8x16_t a = vcombine_s8(vld1_s8(t[i]), vld1_s8(t[i]));
      a = veorq_s8(a, vandq_s8(flip, mask));
      for (int q = 0; q < 4; ++q) acc[i][q] = vdotq_s32(acc[i][q], a, b[q]);
    }
  }
  /* rows 2p and 2p+1: pairwise sums give the same 2 x 2 tiles as SMMLA */
  int32x4_t tiles[4][4];
  for (int p = 0; p < quads; ++p)
    for (int q = 0; q < 4; ++q) tiles[p][q] = vpaddq_s32(acc[2 * p][q], acc[2 * p + 1][q]);
  store_tiles(tiles, quads, tile);
}

static DOT_FN void tile_sdot(int rows, const int8_t* const r[MR], int64_t k, const int8_t* panel,
                             int32_t tile[MR][NR], int flip_u8) {
  int8x16_t flip = vdupq_n_s8(flip_u8 ? (int8_t)0x80 : 0);
  /* 16 accumulators at most: rows 0..3, then rows 4..7 */
  const int8_t* const* hi = r + 4;
  int32_t(*tile_hi)[NR] = tile + 4;
  switch ((rows < 4 ? rows + 1 : 4) / 2) {
    case 1: sdot_rows(1, r, k, panel, tile, flip); break;
    default: sdot_rows(2, r, k, panel, tile, flip); break;
  }
  if (rows > 4) {
    if (rows <= 6)
      sdot_rows(1, hi, k, panel, tile_hi, flip);
    else
      sdot_rows(2, hi, k, panel, tile_hi, flip);
  }
}

/* ---- int8 epilogue: dequantize, bias, activation, [requantize], store ------------------ */

enum { POST_NONE = 0, POST_RELU = 1, POST_GELU_ERF = 2, POST_GELU_TANH = 3 };

/* exp(x), 4 lanes: x = n ln2 + r (Cody-Waite), Cephes' degree-6 polynomial for exp(r),
 * 2^n through the exponent field; relative error ~1e-7; x clamped to [-87, 88]. */
INLINE float32x4_t v_exp(float32x4_t x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
  float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  float32x4_t y = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
  int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(y, vreinterpretq_f32_s32(e));
}

/* GELU, 4 lanes. erf: Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7);
 * tanh(u) = 1 - 2 / (exp(2u) + 1). Both well inside the fp32 tolerance of torch's GELU. */
INLINE float32x4_t v_gelu(float32x4_t v, int post) {
  float32x4_t half_v = vmulq_n_f32(v, 0.5f), one = vdupq_n_f32(1.0f);
  if (post == POST_GELU_TANH) {
    float32x4_t u = vmulq_n_f32(vfmaq_f32(v, vmulq_n_f32(vmulq_f32(v, v), 0.044715f), v),
                                0.79788456080286536f);
    float32x4_t t = vsubq_f32(one, vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(v_exp(vaddq_f32(u, u)), one)));
    return vfmaq_f32(half_v, half_v, t);
  }
  float32x4_t x = vmulq_n_f32(v, 0.70710678118654752f), ax = vabsq_f32(x);
  float32x4_t t = vdivq_f32(one, vfmaq_f32(one, ax, vdupq_n_f32(0.3275911f)));
  float32x4_t q = vdupq_n_f32(1.061405429f);
  q = vfmaq_f32(vdupq_n_f32(-1.453152027f), q, t);
  q = vfmaq_f32(vdupq_n_f32(1.421413741f), q, t);
  q = vfmaq_f32(vdupq_n_f32(-0.284496736f), q, t);
  q = vfmaq_f32(vdupq_n_f32(0.254829592f), q, t);
  float32x4_t e = v_exp(vnegq_f32(vmulq_f32(ax, ax)));
  float32x4_t erf_abs = vfmsq_f32(one, vmulq_f32(q, t), e);
  float32x4_t erf = vbslq_f32(vcltzq_f32(x), vnegq_f32(erf_abs), erf_abs);
  return vfmaq_f32(half_v, half_v, erf);
}

/* One activation on 4 lanes. */
INLINE float32x4_t v_post(float32x4_t f, int post) {
  if (post == POST_RELU) return vmaxq_f32(f, vdupq_n_f32(0.0f));
  if (post >= POST_GELU_ERF) return v_gelu(f, post);
  return f;
}

typedef struct {
  int64_t m, n, k;
  const int8_t* x;    /* [m, k] u8 or s8 */
  int x_unsigned;
  int32_t x_zp;
  float x_scale;
  const pack_header* w;
  const float* w_scale; /* n entries, or 1 (per-tensor) */
  int64_t w_scale_n;
  const float* bias;    /* NULL or n entries */
  int post;
  int out_kind;         /* 0: fp32, 1: u8, 2: s8 */
  float inv_out_scale;
  int32_t out_zp, out_qmin, out_qmax;
  void* y;              /* [m, n] */
  int use_sdot;
} qgemm_args;

/* The 8 columns' x_scale * w_scale and bias, once per column panel. */
static void column_terms(const qgemm_args* g, int64_t n0, int cols, float scale[NR],
                         float bias[NR]) {
  for (int c = 0; c < NR; ++c) {
    int64_t n = n0 + (c < cols ? c : 0);
    scale[c] = g->x_scale * g->w_scale[g->w_scale_n == 1 ? 0 : n];
    bias[c] = g->bias ? g->bias[n] : 0.0f;
  }
}

static void epilogue_int8(const qgemm_args* g, int32_t tile[MR][NR], int rows, int64_t m0,
                          int64_t n0, int cols, int32_t zp_eff, const int32_t* colsum,
                          const float scale[NR], const float bias[NR]) {
  int32x4_t qzp = vdupq_n_s32(g->out_zp), qlo = vdupq_n_s32(g->out_qmin);
  int32x4_t qhi = vdupq_n_s32(g->out_qmax);
  for (int i = 0; i < rows; ++i) {
    float32x4_t f[2];
    for (int h = 0; h < 2; ++h) {
      int c = 4 * h;
      int32x4_t acc = vld1q_s32(&tile[i][c]);
      /* sum_k (x - zp) w = sum_k x w - zp * colsum (exact: qlinear_run bounds K) */
      acc = vmlsq_n_s32(acc, vld1q_s32(colsum + n0 + c), zp_eff);
      f[h] = v_post(vmlaq_f32(vld1q_f32(bias + c), vcvtq_f32_s32(acc), vld1q_f32(scale + c)),
                    g->post);
    }
    int64_t row = (m0 + i) * g->n + n0;
    if (g->out_kind == 0) {
      float* dst = (float*)g->y + row;
      if (cols == NR) {
        vst1q_f32(dst, f[0]), vst1q_f32(dst + 4, f[1]);
      } else {
        float v[NR];
        vst1q_f32(v, f[0]), vst1q_f32(v + 4, f[1]);
        memcpy(dst, v, (size_t)cols * sizeof(float));
      }
      continue;
    }
    /* quantize_per_tensor: clamp(round_half_even(v * (1 / scale)) + zp, qmin, qmax) */
    int32x4_t q[2];
    for (int h = 0; h < 2; ++h) {
      q[h] = vqaddq_s32(vcvtnq_s32_f32(vmulq_n_f32(f[h], g->inv_out_scale)), qzp);
      q[h] = vminq_s32(vmaxq_s32(q[h], qlo), qhi);
    }
    /* in [qmin, qmax]: narrowing keeps the value, as int8 or (reinterpreted) uint8 */
    int8x8_t bytes = vmovn_s16(vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1])));
    int8_t* dst = (int8_t*)g->y + row;
    if (cols == NR) {
      vst1_s8(dst, bytes);
    } else {
      int8_t b[NR];
      vst1_s8(b, bytes);
      memcpy(dst, b, (size_t)cols);
    }
  }
}

static void qgemm(const qgemm_args* g) {
  const pack_header* h = g->w;
  const int32_t* colsum = (const int32_t*)(h + 1);
  const int8_t* panels = (const int8_t*)(colsum + h->n_pad);
  /* SDOT sees u8 activations as x - 128: their zero point moves by the same 128 */
  int flip = g->use_sdot && g->x_unsigned;
  int32_t zp_eff = flip ? g->x_zp - 128 : g->x_zp;
  /* keep a block of activation rows in L1 while the panels stream past it */
  int64_t mc = (16384 / (h->k_pad ? h->k_pad : 8)) & ~(int64_t)(MR - 1);
  if (mc < MR) mc = MR;
  int32_t tile[MR][NR];
  for (int64_t mb = 0; mb < g->m; mb += mc) {
    int64_t me = mb + mc < g->m ? mb + mc : g->m;
    for (int64_t n0 = 0; n0 < g->n; n0 += NR) {
      const int8_t* panel = panels + (n0 / NR) * (h->k_pad * NR);
      int cols = (int)(g->n - n0 < NR ? g->n - n0 : NR);
      float scale[NR], bias[NR];
      column_terms(g, n0, cols, scale, bias);
      for (int64_t m0 = mb; m0 < me; m0 += MR) {
        int rows = (int)(me - m0 < MR ? me - m0 : MR);
        const int8_t* r[MR];
        for (int i = 0; i < MR; ++i) r[i] = g->x + (m0 + (i < rows ? i : rows - 1)) * g->k;
        if (g->use_sdot)
          tile_sdot(rows, r, g->k, panel, tile, flip);
        else if (g->x_unsigned)
          tile_usmmla(rows, r, g->k, panel, tile);
        else
          tile_smmla(rows, r, g->k, panel, tile);
        epilogue_int8(g, tile, rows, m0, n0, cols, zp_eff, colsum, scale, bias);
      }
    }
  }
}

/* ---- BF16: BFMMLA micro-kernel and epilogue --------------------------------------------- */

INLINE BF16_FN bfloat16x8_t bf16_rows(const uint16_t* a, const uint16_t* b) {
  return vcombine_bf16(vld1_bf16((const bfloat16_t*)a), vld1_bf16((const bfloat16_t*)b));
}

INLINE BF16_FN void bf16_pairs(int pairs, const uint16_t* const r[MR], int64_t k,
                               const uint16_t* panel, float tile[MR][NR]) {
  float32x4_t acc[4][4];
  for (int p = 0; p < pairs; ++p)
    for (int q = 0; q < 4; ++q) acc[p][q] = vdupq_n_f32(0.0f);
  int64_t k4 = k & ~(int64_t)3, kk = 0;
  for (; kk < k4; kk += 4, panel += 32) {
    bfloat16x8_t b0 = vld1q_bf16((const bfloat16_t*)panel);
    bfloat16x8_t b1 = vld1q_bf16((const bfloat16_t*)(panel + 8));
    bfloat16x8_t b2 = vld1q_bf16((const bfloat16_t*)(panel + 16));
    bfloat16x8_t b3 = vld1q_bf16((const bfloat16_t*)(panel + 24));
    for (int p = 0; p < pairs; ++p) {
      bfloat16x8_t a = bf16_rows(r[2 * p] + kk, r[2 * p + 1] + kk);
      acc[p][0] = vbfmmlaq_f32(acc[p][0], a, b0);
      acc[p][1] = vbfmmlaq_f32(acc[p][1], a, b1);
      acc[p][2] = vbfmmlaq_f32(acc[p][2], a, b2);
      acc[p][3] = vbfmmlaq_f32(acc[p][3], a, b3);
    }
  }
  if (kk < k) {
    uint16_t t[MR][4];
    memset(t, 0, sizeof(t));
    for (int i = 0; i < 2 * pairs; ++i) memcpy(t[i], r[i] + kk, (size_t)(k - kk) * 2);
    for (int p = 0; p < pairs; ++p) {
      bfloat16x8_t a = bf16_rows(t[2 * p], t[2 * p + 1]);
      for (int q = 0; q < 4; ++q)
        acc[p][q] = vbfmmlaq_f32(acc[p][q], a, vld1q_bf16((const bfloat16_t*)(panel + 8 * q)));
    }
  }
  for (int p = 0; p < pairs; ++p)
    for (int q = 0; q < 4; q += 2) {
      float64x2_t a = vreinterpretq_f64_f32(acc[p][q]), b = vreinterpretq_f64_f32(acc[p][q + 1]);
      vst1q_f32(&tile[2 * p][2 * q], vreinterpretq_f32_f64(vzip1q_f64(a, b)));
      vst1q_f32(&tile[2 * p + 1][2 * q], vreinterpretq_f32_f64(vzip2q_f64(a, b)));
    }
}

static BF16_FN void tile_bfmmla(int rows, const uint16_t* const r[MR], int64_t k,
                                const uint16_t* panel, float tile[MR][NR]) {
  switch ((rows + 1) / 2) {
    case 1: bf16_pairs(1, r, k, panel, tile); break;
    case 2: bf16_pairs(2, r, k, panel, tile); break;
    case 3: bf16_pairs(3, r, k, panel, tile); break;
    default: bf16_pairs(4, r, k, panel, tile); break;
  }
}

static float bf16_to_f32(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest, ties to even (torch's float -> bfloat16); NaN stays a quiet NaN. */
static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

typedef struct {
  int64_t m, n, k;
  const uint16_t* x;
  const pack_header* w;
  const void* bias; /* NULL, bf16 or fp32 */
  int bias_f32;
  int post;
  uint16_t* y;
} bgemm_args;

static void bgemm(const bgemm_args* g) {
  const pack_header* h = g->w;
  const uint16_t* panels = (const uint16_t*)(h + 1);
  int64_t mc = (8192 / (h->k_pad ? h->k_pad : 4)) & ~(int64_t)(MR - 1);
  if (mc < MR) mc = MR;
  float tile[MR][NR];
  for (int64_t mb = 0; mb < g->m; mb += mc) {
    int64_t me = mb + mc < g->m ? mb + mc : g->m;
    for (int64_t n0 = 0; n0 < g->n; n0 += NR) {
      const uint16_t* panel = panels + (n0 / NR) * (h->k_pad * NR);
      int cols = (int)(g->n - n0 < NR ? g->n - n0 : NR);
      float bias[NR] = {0};
      for (int c = 0; c < cols && g->bias; ++c)
        bias[c] = g->bias_f32 ? ((const float*)g->bias)[n0 + c]
                              : bf16_to_f32(((const uint16_t*)g->bias)[n0 + c]);
      for (int64_t m0 = mb; m0 < me; m0 += MR) {
        int rows = (int)(me - m0 < MR ? me - m0 : MR);
        const uint16_t* r[MR];
        for (int i = 0; i < MR; ++i) r[i] = g->x + (m0 + (i < rows ? i : rows - 1)) * g->k;
        tile_bfmmla(rows, r, g->k, panel, tile);
        for (int i = 0; i < rows; ++i) {
          uint16_t* dst = g->y + (m0 + i) * g->n + n0;
          float v[NR];
          for (int c = 0; c < NR; c += 4)
            vst1q_f32(v + c, v_post(vaddq_f32(vld1q_f32(&tile[i][c]), vld1q_f32(bias + c)), g->post));
          for (int c = 0; c < cols; ++c) dst[c] = f32_to_bf16(v[c]);
        }
      }
    }
  }
}

/* ---- the pdlkit contract ------------------------------------------------------------------ */

/* What each descriptor computes; descriptors point here through their own run/meta. */
typedef enum { OUT_F32, OUT_REQUANT, OUT_DYNAMIC } qmode;

#define ERR(f, status, ...) pdlkit_error((f)->error, (f)->error_size, (status), __VA_ARGS__)

static int has_hwcap(int which, unsigned long bit) {
  return (getauxval(which == 2 ? AT_HWCAP2 : AT_HWCAP) & bit) != 0;
}

static int64_t rows_of(const DLTensor* x) {
  int64_t m = 1;
  for (int32_t d = 0; d + 1 < x->ndim; ++d) m *= x->shape[d];
  return m;
}

static const pdlkit_attribute* attr(const pdlkit_attribute* const* attrs, size_t n,
                                    const char* name, int32_t kind) {
  const pdlkit_attribute* a = pdlkit_find_attr(attrs, n, name);
  return a != NULL && a->kind == kind ? a : NULL;
}

/* post_op / algorithm -> POST_*, or -1 */
static int post_of(const pdlkit_attribute* const* attrs, size_t n, const char* op_name,
                   const char* algo_name, const char* fixed) {
  const char* op = fixed;
  if (op == NULL) {
    const pdlkit_attribute* a = attr(attrs, n, op_name, PDLKIT_KIND_STRING);
    if (a == NULL) return -1;
    op = a->s;
  }
  if (strcmp(op, "none") == 0 || op[0] == '\0') return POST_NONE;
  if (strcmp(op, "relu") == 0) return POST_RELU;
  if (strcmp(op, "gelu") == 0) {
    const pdlkit_attribute* g = attr(attrs, n, algo_name, PDLKIT_KIND_STRING);
    const char* algo = g ? g->s : "none";
    if (strcmp(algo, "none") == 0 || algo[0] == '\0') return POST_GELU_ERF;
    if (strcmp(algo, "tanh") == 0) return POST_GELU_TANH;
  }
  return -1;
}

/* Tensor inputs of the qlinear family, in parameter order. */
typedef struct {
  const DLTensor *x, *x_scale, *x_zp, *w, *w_scale, *w_zp, *bias;
} qinputs;

/* wpt: the weight's scale and zero point are per-tensor FLOAT / INT attributes, not tensors
 * (the qlinear*_pt ops of ArmInductorQuantizer-style graphs). */
static int32_t qinputs_of(const DLTensor* in, size_t n, qmode mode, int wpt, qinputs* q,
                          char* error, size_t error_size) {
  size_t want = (mode == OUT_DYNAMIC ? 7 : 5) - (wpt ? 2 : 0);
  memset(q, 0, sizeof(*q));
  if (n != want)
    return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT, "expects %zu tensor inputs, got %zu",
                        want, n);
  size_t i = 0;
  q->x = &in[i++];
  if (mode == OUT_DYNAMIC) q->x_scale = &in[i++], q->x_zp = &in[i++];
  q->w = &in[i++];
  if (!wpt) q->w_scale = &in[i++], q->w_zp = &in[i++];
  q->bias = pdlkit_is_none(&in[i]) ? NULL : &in[i];
  if (q->x->ndim < 1)
    return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT, "x_q must have at least 1 dim");
  return PDLKIT_OK;
}

static int32_t qlinear_meta(const pdlkit_meta_frame* f, qmode mode, int wpt) {
  qinputs q;
  int32_t st = qinputs_of(f->inputs, f->num_inputs, mode, wpt, &q, f->error, f->error_size);
  if (st != PDLKIT_OK) return st;
  if (q.w->ndim != 2 || q.w->shape[1] != q.x->shape[q.x->ndim - 1])
    return ERR(f, PDLKIT_INVALID_ARGUMENT, "w_q must be [N, K] with K = x_q's last dim (%lld)",
               (long long)q.x->shape[q.x->ndim - 1]);
  if (f->num_outputs != 1 || f->max_ndim < q.x->ndim)
    return ERR(f, PDLKIT_INVALID_ARGUMENT, "one output of rank %d", (int)q.x->ndim);
  DLTensor* y = &f->outputs[0];
  y->ndim = q.x->ndim;
  for (int32_t d = 0; d + 1 < q.x->ndim; ++d) y->shape[d] = q.x->shape[d];
  y->shape[q.x->ndim - 1] = q.w->shape[0];
  y->dtype.bits = mode == OUT_REQUANT ? 8 : 32;
  y->dtype.lanes = 1;
  y->dtype.code = kDLFloat;
  if (mode == OUT_REQUANT) {
    const pdlkit_attribute* qmin = attr(f->attrs, f->num_attrs, "out_qmin", PDLKIT_KIND_INT);
    if (qmin == NULL) return ERR(f, PDLKIT_INVALID_ARGUMENT, "no int attribute out_qmin");
    y->dtype.code = qmin->i >= 0 ? kDLUInt : kDLInt;
  }
  return PDLKIT_OK;
}

static int32_t qlinear_run(const pdlkit_call_frame* f, qmode mode, int use_sdot, int wpt) {
  if (use_sdot ? !has_hwcap(1, A64_HWCAP_ASIMDDP) : !has_hwcap(2, A64_HWCAP2_I8MM))
    return ERR(f, PDLKIT_UNSUPPORTED, "this CPU lacks %s (hwcaps)", use_sdot ? "asimddp" : "i8mm");
  qinputs q;
  int32_t st = qinputs_of(f->inputs, f->num_inputs, mode, wpt, &q, f->error, f->error_size);
  if (st != PDLKIT_OK) return st;
  const pack_header* h = (const pack_header*)pdlkit_data(q.w);
  if (!pdlkit_dtype_is(q.w->dtype, kDLUInt, 8) || q.w->ndim != 1 ||
      (size_t)q.w->shape[0] < sizeof(pack_header) || h->magic != PACK_MAGIC ||
      h->kind != PACK_INT8 || (size_t)q.w->shape[0] != packed_bytes(PACK_INT8, h->n, h->k))
    return ERR(f, PDLKIT_UNSUPPORTED, "w_q is not an int8 weight packed by this library");
  const DLTensor* x = q.x;
  int64_t k = x->shape[x->ndim - 1], m = rows_of(x), n = h->n;
  if (h->k != k) return ERR(f, PDLKIT_INVALID_ARGUMENT, "x_q has K = %lld, w_q %lld", (long long)k, (long long)h->k);
  if (!pdlkit_is_contiguous(x)) return ERR(f, PDLKIT_UNSUPPORTED, "x_q is not contiguous");
  int x_unsigned = pdlkit_dtype_is(x->dtype, kDLUInt, 8);
  if (!x_unsigned && !pdlkit_dtype_is(x->dtype, kDLInt, 8))
    return ERR(f, PDLKIT_INVALID_ARGUMENT, "x_q must be uint8 or int8");
  /* weight scales and zero points */
  float w_scale_pt = 0.0f;
  int64_t ns = 1, nz = 0;
  if (wpt) {
    const pdlkit_attribute* s = attr(f->attrs, f->num_attrs, "w_scale", PDLKIT_KIND_FLOAT);
    const pdlkit_attribute* z = attr(f->attrs, f->num_attrs, "w_zp", PDLKIT_KIND_INT);
    if (!s || !z) return ERR(f, PDLKIT_INVALID_ARGUMENT, "needs w_scale (float) and w_zp (int)");
    if (z->i != 0) return ERR(f, PDLKIT_UNSUPPORTED, "weight zero points must be 0 (symmetric)");
    w_scale_pt = (float)s->f;
  } else {
    ns = pdlkit_numel(q.w_scale);
    if (!pdlkit_dtype_is(q.w_scale->dtype, kDLFloat, 32) || !(ns == n || ns == 1) ||
        !pdlkit_is_contiguous(q.w_scale))
      return ERR(f, PDLKIT_UNSUPPORTED, "w_scale must be %lld (or 1) contiguous float32 values", (long long)n);
    nz = pdlkit_numel(q.w_zp);
  }
  for (int64_t i = 0; i < nz; ++i) {
    int64_t z = pdlkit_dtype_is(q.w_zp->dtype, kDLInt, 64) ? ((const int64_t*)pdlkit_data(q.w_zp))[i]
                : pdlkit_dtype_is(q.w_zp->dtype, kDLInt, 32) ? ((const int32_t*)pdlkit_data(q.w_zp))[i] : 1;
    if (z != 0) return ERR(f, PDLKIT_UNSUPPORTED, "weight zero points must be 0 (symmetric)");
  }
  if (q.bias && (!pdlkit_dtype_is(q.bias->dtype, kDLFloat, 32) || pdlkit_numel(q.bias) != n ||
                 !pdlkit_is_contiguous(q.bias)))
    return ERR(f, PDLKIT_UNSUPPORTED, "bias must be %lld contiguous float32 values", (long long)n);
  qgemm_args g;
  memset(&g, 0, sizeof(g));
  g.m = m, g.n = n, g.k = k;
  g.x = (const int8_t*)pdlkit_data(x);
  g.x_unsigned = x_unsigned;
  g.w = h;
  g.w_scale = wpt ? &w_scale_pt : (const float*)pdlkit_data(q.w_scale);
  g.w_scale_n = ns;
  g.bias = q.bias ? (const float*)pdlkit_data(q.bias) : NULL;
  g.use_sdot = use_sdot;
  if (mode == OUT_DYNAMIC) {
    double xs;
    int64_t xz;
    if (pdlkit_scalar_f64(q.x_scale, &xs) != 0 || pdlkit_scalar_i64(q.x_zp, &xz) != 0)
      return ERR(f, PDLKIT_UNSUPPORTED, "x_scale / x_zp must hold one float / int (per-tensor)");
    g.x_scale = (float)xs;
    g.x_zp = (int32_t)xz;
  } else {
    const pdlkit_attribute* s = attr(f->attrs, f->num_attrs, "x_scale", PDLKIT_KIND_FLOAT);
    const pdlkit_attribute* z = attr(f->attrs, f->num_attrs, "x_zp", PDLKIT_KIND_INT);
    if (!s || !z) return ERR(f, PDLKIT_INVALID_ARGUMENT, "needs x_scale (float) and x_zp (int)");
    g.x_scale = (float)s->f;
    g.x_zp = (int32_t)z->i;
  }
  /* The int32 sums (MMLA / SDOT accumulators and the zero-point term, all modulo 2^32) end on
   * the exact sum_k (x - x_zp) w when it fits in int32: each term is at most A * 128 with
   * A = max |x - x_zp| over the activation's 8-bit range (weights symmetric, in [-128, 127]),
   * so K A 128 <= 2^31 - 1: K <= 65793 for any in-range x_zp (131071 for a centred one). */
  {
    const int64_t lo = x_unsigned ? 0 : -128, hi = x_unsigned ? 255 : 127;
    const int64_t a = g.x_zp - lo > hi - g.x_zp ? g.x_zp - lo : hi - g.x_zp;
    if (k > INT32_MAX / (a * 128)) /* a >= 127 */
      return ERR(f, PDLKIT_UNSUPPORTED,
                 "K = %lld with x_zp %d: int32 sums could overflow (exact for K * %lld * 128 < 2^31)",
                 (long long)k, (int)g.x_zp, (long long)a);
  }
  g.post = post_of(f->attrs, f->num_attrs, "post_op", "algorithm", NULL);
  if (g.post < 0) return ERR(f, PDLKIT_UNSUPPORTED, "post op not none / relu / gelu(none|tanh)");
  DLTensor* y = &f->outputs[0];
  g.y = (char*)y->data + y->byte_offset;
  if (mode == OUT_REQUANT) {
    const pdlkit_attribute* os = attr(f->attrs, f->num_attrs, "out_scale", PDLKIT_KIND_FLOAT);
    const pdlkit_attribute* oz = attr(f->attrs, f->num_attrs, "out_zp", PDLKIT_KIND_INT);
    const pdlkit_attribute* lo = attr(f->attrs, f->num_attrs, "out_qmin", PDLKIT_KIND_INT);
    const pdlkit_attribute* hi = attr(f->attrs, f->num_attrs, "out_qmax", PDLKIT_KIND_INT);
    if (!os || !oz || !lo || !hi)
      return ERR(f, PDLKIT_INVALID_ARGUMENT, "needs out_scale, out_zp, out_qmin, out_qmax");
    int sgn = lo->i < 0;
    if (lo->i > hi->i || lo->i < (sgn ? -128 : 0) || hi->i > (sgn ? 127 : 255))
      return ERR(f, PDLKIT_UNSUPPORTED, "output range [%lld, %lld]", (long long)lo->i, (long long)hi->i);
    g.out_kind = sgn ? 2 : 1;
    g.inv_out_scale = (float)(1.0 / os->f);
    g.out_zp = (int32_t)oz->i, g.out_qmin = (int32_t)lo->i, g.out_qmax = (int32_t)hi->i;
  }
  /* Finite epilogue terms, |x_scale w_scale| 2^31 + |bias| (times 1 / out_scale) within float
   * range: then no value the epilogue computes is NaN or inf (a NaN would requantize to the zero
   * point, where torch's quantize_per_tensor gives 0); else the reference runs. */
  {
    const double inv = g.out_kind ? fabs((double)g.inv_out_scale) : 1.0;
    int ok = isfinite(inv);
    for (int64_t i = 0; ok && i < n; ++i) {
      const double t = (fabs((double)g.x_scale * g.w_scale[g.w_scale_n == 1 ? 0 : i]) * 2147483648.0 +
                        (g.bias ? fabs((double)g.bias[i]) : 0.0)) * inv;
      ok = t <= 3.0e38;
    }
    if (!ok)
      return ERR(f, PDLKIT_UNSUPPORTED, "a scale or bias is not finite (or could overflow float32)");
  }
  if (m == 0 || n == 0) return PDLKIT_OK;
  qgemm(&g);
  return PDLKIT_OK;
}

/* Pre-pack a contiguous [N, K] weight of dtype (code, bits) into `kind`'s panels: the first call
 * (no buffer) asks the size, the second packs; `what` is the refusal's message. */
static int32_t prepack(pdlkit_prepack_frame* f, int kind, uint8_t code, uint8_t bits, const char* what) {
  const DLTensor* w = f->weight;
  if (!pdlkit_dtype_is(w->dtype, code, bits) || w->ndim != 2 || !pdlkit_is_contiguous(w))
    return ERR(f, PDLKIT_INVALID_ARGUMENT, "%s", what);
  size_t bytes = packed_bytes(kind, w->shape[0], w->shape[1]);
  if (f->packed == NULL) {
    f->packed_size = bytes;
    return PDLKIT_OK;
  }
  if (f->packed_size != bytes) return ERR(f, PDLKIT_INVALID_ARGUMENT, "packed buffer of %zu bytes, needs %zu", f->packed_size, bytes);
  if (kind == PACK_INT8)
    pack_int8((const int8_t*)pdlkit_data(w), w->shape[0], w->shape[1], f->packed);
  else
    pack_bf16((const uint16_t*)pdlkit_data(w), w->shape[0], w->shape[1], f->packed);
  return PDLKIT_OK;
}

static int32_t int8_prepack(pdlkit_prepack_frame* f) {
  return prepack(f, PACK_INT8, kDLInt, 8, "w_q must be a contiguous [N, K] int8 tensor");
}

/* ---- BF16 contract ---- */

static int32_t linear_meta(const pdlkit_meta_frame* f) {
  if (f->num_inputs != 3 || f->num_outputs != 1)
    return ERR(f, PDLKIT_INVALID_ARGUMENT, "expects x, weight, bias and one output");
  const DLTensor *x = &f->inputs[0], *w = &f->inputs[1];
  if (x->ndim < 1 || w->ndim != 2 || w->shape[1] != x->shape[x->ndim - 1] || f->max_ndim < x->ndim)
    return ERR(f, PDLKIT_INVALID_ARGUMENT, "weight must be [N, K] with K = x's last dim");
  DLTensor* y = &f->outputs[0];
  y->ndim = x->ndim;
  for (int32_t d = 0; d + 1 < x->ndim; ++d) y->shape[d] = x->shape[d];
  y->shape[x->ndim - 1] = w->shape[0];
  y->dtype = x->dtype;
  return PDLKIT_OK;
}

static int32_t linear_run(const pdlkit_call_frame* f, int post) {
  if (!has_hwcap(2, A64_HWCAP2_BF16)) return ERR(f, PDLKIT_UNSUPPORTED, "this CPU lacks bf16 (hwcaps)");
  if (f->num_inputs != 3) return ERR(f, PDLKIT_INVALID_ARGUMENT, "expects x, weight, bias");
  const DLTensor *x = &f->inputs[0], *w = &f->inputs[1], *b = &f->inputs[2];
  const pack_header* h = (const pack_header*)pdlkit_data(w);
  if (!pdlkit_dtype_is(w->dtype, kDLUInt, 8) || w->ndim != 1 ||
      (size_t)w->shape[0] < sizeof(pack_header) || h->magic != PACK_MAGIC ||
      h->kind != PACK_BF16 || (size_t)w->shape[0] != packed_bytes(PACK_BF16, h->n, h->k))
    return ERR(f, PDLKIT_UNSUPPORTED, "weight is not a bf16 weight packed by this library");
  if (!pdlkit_dtype_is(x->dtype, kDLBfloat, 16)) return ERR(f, PDLKIT_INVALID_ARGUMENT, "x must be bfloat16");
  if (!pdlkit_is_contiguous(x)) return ERR(f, PDLKIT_UNSUPPORTED, "x is not contiguous");
  int64_t k = x->shape[x->ndim - 1];
  if (h->k != k) return ERR(f, PDLKIT_INVALID_ARGUMENT, "x has K = %lld, weight %lld", (long long)k, (long long)h->k);
  bgemm_args g;
  memset(&g, 0, sizeof(g));
  g.m = rows_of(x), g.n = h->n, g.k = k;
  g.x = (const uint16_t*)pdlkit_data(x);
  g.w = h;
  g.post = post;
  if (!pdlkit_is_none(b)) {
    g.bias_f32 = pdlkit_dtype_is(b->dtype, kDLFloat, 32);
    if ((!g.bias_f32 && !pdlkit_dtype_is(b->dtype, kDLBfloat, 16)) || pdlkit_numel(b) != h->n ||
        !pdlkit_is_contiguous(b))
      return ERR(f, PDLKIT_UNSUPPORTED, "bias must be %lld contiguous bfloat16 or float32 values", (long long)h->n);
    g.bias = pdlkit_data(b);
  }
  g.y = (uint16_t*)((char*)f->outputs[0].data + f->outputs[0].byte_offset);
  if (g.m == 0 || g.n == 0) return PDLKIT_OK;
  bgemm(&g);
  return PDLKIT_OK;
}

static int32_t bf16_prepack(pdlkit_prepack_frame* f) {
  return prepack(f, PACK_BF16, kDLBfloat, 16, "weight must be a contiguous [N, K] bfloat16 tensor");
}

static int32_t linear_gelu_run(const pdlkit_call_frame* f) {
  int post = post_of(f->attrs, f->num_attrs, "", "approximate", "gelu");
  if (post < 0) return ERR(f, PDLKIT_UNSUPPORTED, "approximate must be none or tanh");
  return linear_run(f, post);
}
static int32_t linear_plain_run(const pdlkit_call_frame* f) { return linear_run(f, POST_NONE); }
static int32_t linear_relu_run(const pdlkit_call_frame* f) { return linear_run(f, POST_RELU); }

/* ---- descriptors ---- */

/* one meta / run per (output mode, SDOT or not, per-tensor weight qparams or not) */
#define QFUNCS(SUFFIX, MODE, WPT)                                                              \
  static int32_t meta_##SUFFIX(const pdlkit_meta_frame* f) { return qlinear_meta(f, MODE, WPT); } \
  static int32_t run_##SUFFIX##_i8mm(const pdlkit_call_frame* f) {                             \
    return qlinear_run(f, MODE, 0, WPT);                                                       \
  }                                                                                            \
  static int32_t run_##SUFFIX##_sdot(const pdlkit_call_frame* f) {                             \
    return qlinear_run(f, MODE, 1, WPT);                                                       \
  }
QFUNCS(f32, OUT_F32, 0)
QFUNCS(q, OUT_REQUANT, 0)
QFUNCS(dyn, OUT_DYNAMIC, 0)
QFUNCS(f32_pt, OUT_F32, 1)
QFUNCS(q_pt, OUT_REQUANT, 1)
QFUNCS(dyn_pt, OUT_DYNAMIC, 1)

static const DLDataType kU8S8[] = {{kDLUInt, 8, 1}, {kDLInt, 8, 1}};
static const DLDataType kS8[] = {{kDLInt, 8, 1}};
static const DLDataType kF32[] = {{kDLFloat, 32, 1}};
static const DLDataType kF32F64[] = {{kDLFloat, 32, 1}, {kDLFloat, 64, 1}};
static const DLDataType kI64I32[] = {{kDLInt, 64, 1}, {kDLInt, 32, 1}};
static const DLDataType kBF16[] = {{kDLBfloat, 16, 1}};
static const DLDataType kBF16F32[] = {{kDLBfloat, 16, 1}, {kDLFloat, 32, 1}};
static const int32_t kRank2[] = {2};

#define ARG(name, kind) {sizeof(pdlkit_arg_desc), name, kind, NULL, 0, NULL, 0, NULL, NULL, 0, 0, 0, 0}
#define TENSOR(name, dt, contiguous) \
  {sizeof(pdlkit_arg_desc), name, PDLKIT_KIND_TENSOR, dt, sizeof(dt) / sizeof(dt[0]), NULL, 0, NULL, NULL, 0, contiguous, 0, 0}
#define WEIGHT(name, dt) \
  {sizeof(pdlkit_arg_desc), name, PDLKIT_KIND_TENSOR, dt, 1, kRank2, 1, NULL, NULL, 0, 0, 0, 0}
#define BIAS(name, dt) \
  {sizeof(pdlkit_arg_desc), name, PDLKIT_KIND_TENSOR, dt, sizeof(dt) / sizeof(dt[0]), NULL, 0, NULL, NULL, 0, 0, 0, 1}

/* The schemas of the logical ops (kernels/reference/logical_ops.py). */
static const pdlkit_arg_desc kQlinearArgs[] = {
    TENSOR("x_q", kU8S8, 1), ARG("x_scale", PDLKIT_KIND_FLOAT), ARG("x_zp", PDLKIT_KIND_INT),
    WEIGHT("w_q", kS8), TENSOR("w_scale", kF32, 0), TENSOR("w_zp", kI64I32, 0),
    BIAS("bias", kF32), ARG("post_op", PDLKIT_KIND_STRING), ARG("algorithm", PDLKIT_KIND_STRING),
};
static const pdlkit_arg_desc kQlinearQArgs[] = {
    TENSOR("x_q", kU8S8, 1), ARG("x_scale", PDLKIT_KIND_FLOAT), ARG("x_zp", PDLKIT_KIND_INT),
    WEIGHT("w_q", kS8), TENSOR("w_scale", kF32, 0), TENSOR("w_zp", kI64I32, 0),
    BIAS("bias", kF32), ARG("out_scale", PDLKIT_KIND_FLOAT), ARG("out_zp", PDLKIT_KIND_INT),
    ARG("out_qmin", PDLKIT_KIND_INT), ARG("out_qmax", PDLKIT_KIND_INT),
    ARG("post_op", PDLKIT_KIND_STRING), ARG("algorithm", PDLKIT_KIND_STRING),
};
static const pdlkit_arg_desc kQlinearDynArgs[] = {
    TENSOR("x_q", kU8S8, 1), TENSOR("x_scale", kF32F64, 0), TENSOR("x_zp", kI64I32, 0),
    WEIGHT("w_q", kS8), TENSOR("w_scale", kF32, 0), TENSOR("w_zp", kI64I32, 0),
    BIAS("bias", kF32), ARG("post_op", PDLKIT_KIND_STRING), ARG("algorithm", PDLKIT_KIND_STRING),
};
/* The same with the weight quantized per tensor: its scale and zero point are numbers. */
static const pdlkit_arg_desc kQlinearPtArgs[] = {
    TENSOR("x_q", kU8S8, 1), ARG("x_scale", PDLKIT_KIND_FLOAT), ARG("x_zp", PDLKIT_KIND_INT),
    WEIGHT("w_q", kS8), ARG("w_scale", PDLKIT_KIND_FLOAT), ARG("w_zp", PDLKIT_KIND_INT),
    BIAS("bias", kF32), ARG("post_op", PDLKIT_KIND_STRING), ARG("algorithm", PDLKIT_KIND_STRING),
};
static const pdlkit_arg_desc kQlinearQPtArgs[] = {
    TENSOR("x_q", kU8S8, 1), ARG("x_scale", PDLKIT_KIND_FLOAT), ARG("x_zp", PDLKIT_KIND_INT),
    WEIGHT("w_q", kS8), ARG("w_scale", PDLKIT_KIND_FLOAT), ARG("w_zp", PDLKIT_KIND_INT),
    BIAS("bias", kF32), ARG("out_scale", PDLKIT_KIND_FLOAT), ARG("out_zp", PDLKIT_KIND_INT),
    ARG("out_qmin", PDLKIT_KIND_INT), ARG("out_qmax", PDLKIT_KIND_INT),
    ARG("post_op", PDLKIT_KIND_STRING), ARG("algorithm", PDLKIT_KIND_STRING),
};
static const pdlkit_arg_desc kQlinearDynPtArgs[] = {
    TENSOR("x_q", kU8S8, 1), TENSOR("x_scale", kF32F64, 0), TENSOR("x_zp", kI64I32, 0),
    WEIGHT("w_q", kS8), ARG("w_scale", PDLKIT_KIND_FLOAT), ARG("w_zp", PDLKIT_KIND_INT),
    BIAS("bias", kF32), ARG("post_op", PDLKIT_KIND_STRING), ARG("algorithm", PDLKIT_KIND_STRING),
};
static const pdlkit_arg_desc kLinearArgs[] = {
    TENSOR("x", kBF16, 1), WEIGHT("weight", kBF16), BIAS("bias", kBF16F32),
};
static const pdlkit_arg_desc kLinearGeluArgs[] = {
    TENSOR("x", kBF16, 1), WEIGHT("weight", kBF16), BIAS("bias", kBF16F32),
    ARG("approximate", PDLKIT_KIND_STRING),
};

static const char* const kIsaI8mm[] = {"i8mm"};
static const char* const kIsaDot[] = {"asimddp"};
static const char* const kIsaBf16[] = {"bf16"};

#define NARGS(a) (sizeof(a) / sizeof(a[0]))
#define DESC(name, op, prio, args, isa, meta, run, pack_arg, pack, doc)                         \
  {sizeof(pdlkit_kernel_desc), name, 1, op, kDLCPU, prio, args, NARGS(args), isa, 1, 0,        \
   PDLKIT_TRAIT_DETERMINISTIC, 1, meta, run, doc, pack_arg, pack}

static const pdlkit_kernel_desc kDescs[] = {
    DESC("a64_qlinear_i8mm", "qlinear", 20, kQlinearArgs, kIsaI8mm, meta_f32, run_f32_i8mm,
         "w_q", int8_prepack,
         "PT2E int8 linear, fp32 out: SMMLA / USMMLA (i8mm) 8x8 tiles, per-channel or "
         "per-tensor weight scales, bias, ReLU / GELU."),
    DESC("a64_qlinear_q_i8mm", "qlinear_q", 20, kQlinearQArgs, kIsaI8mm, meta_q, run_q_i8mm,
         "w_q", int8_prepack,
         "PT2E int8 linear requantized to u8 / s8: SMMLA / USMMLA (i8mm), fused epilogue."),
    DESC("a64_qlinear_dynamic_i8mm", "qlinear_dynamic", 20, kQlinearDynArgs, kIsaI8mm,
         meta_dyn, run_dyn_i8mm, "w_q", int8_prepack,
         "PT2E dynamic int8 linear (activation qparams as tensors): SMMLA / USMMLA (i8mm)."),
    DESC("a64_qlinear_sdot", "qlinear", 10, kQlinearArgs, kIsaDot, meta_f32, run_f32_sdot,
         "w_q", int8_prepack,
         "PT2E int8 linear, fp32 out, for AArch64 without i8mm: SDOT (asimddp)."),
    DESC("a64_qlinear_q_sdot", "qlinear_q", 10, kQlinearQArgs, kIsaDot, meta_q, run_q_sdot,
         "w_q", int8_prepack,
         "PT2E int8 linear requantized to u8 / s8, for AArch64 without i8mm: SDOT (asimddp)."),
    DESC("a64_qlinear_dynamic_sdot", "qlinear_dynamic", 10, kQlinearDynArgs, kIsaDot,
         meta_dyn, run_dyn_sdot, "w_q", int8_prepack,
         "PT2E dynamic int8 linear for AArch64 without i8mm: SDOT (asimddp)."),
    DESC("a64_qlinear_pt_i8mm", "qlinear_pt", 20, kQlinearPtArgs, kIsaI8mm, meta_f32_pt,
         run_f32_pt_i8mm, "w_q", int8_prepack,
         "int8 linear with a per-tensor weight scale (ArmInductorQuantizer graphs), fp32 out: "
         "SMMLA / USMMLA (i8mm)."),
    DESC("a64_qlinear_q_pt_i8mm", "qlinear_q_pt", 20, kQlinearQPtArgs, kIsaI8mm, meta_q_pt,
         run_q_pt_i8mm, "w_q", int8_prepack,
         "int8 linear, per-tensor weight scale, requantized to u8 / s8: SMMLA / USMMLA (i8mm)."),
    DESC("a64_qlinear_dynamic_pt_i8mm", "qlinear_dynamic_pt", 20, kQlinearDynPtArgs, kIsaI8mm,
         meta_dyn_pt, run_dyn_pt_i8mm, "w_q", int8_prepack,
         "dynamic int8 linear, per-tensor weight scale: SMMLA / USMMLA (i8mm)."),
    DESC("a64_qlinear_pt_sdot", "qlinear_pt", 10, kQlinearPtArgs, kIsaDot, meta_f32_pt,
         run_f32_pt_sdot, "w_q", int8_prepack,
         "int8 linear, per-tensor weight scale, fp32 out: SDOT (asimddp)."),
    DESC("a64_qlinear_q_pt_sdot", "qlinear_q_pt", 10, kQlinearQPtArgs, kIsaDot, meta_q_pt,
         run_q_pt_sdot, "w_q", int8_prepack,
         "int8 linear, per-tensor weight scale, requantized: SDOT (asimddp)."),
    DESC("a64_qlinear_dynamic_pt_sdot", "qlinear_dynamic_pt", 10, kQlinearDynPtArgs, kIsaDot,
         meta_dyn_pt, run_dyn_pt_sdot, "w_q", int8_prepack,
         "dynamic int8 linear, per-tensor weight scale: SDOT (asimddp)."),
    DESC("a64_linear_bf16", "linear", 20, kLinearArgs, kIsaBf16, linear_meta, linear_plain_run,
         "weight", bf16_prepack, "BF16 linear: BFMMLA 8x8 tiles, fp32 accumulation, bias."),
    DESC("a64_linear_relu_bf16", "linear_relu", 20, kLinearArgs, kIsaBf16, linear_meta,
         linear_relu_run, "weight", bf16_prepack, "BF16 linear + ReLU: BFMMLA, fused epilogue."),
    DESC("a64_linear_gelu_bf16", "linear_gelu", 20, kLinearGeluArgs, kIsaBf16, linear_meta,
         linear_gelu_run, "weight", bf16_prepack,
         "BF16 linear + GELU (erf or tanh): BFMMLA, fused epilogue."),
};

static const pdlkit_kernel_desc* const kKernels[] = {
    &kDescs[0], &kDescs[1], &kDescs[2],  &kDescs[3],  &kDescs[4],  &kDescs[5],  &kDescs[6],
    &kDescs[7], &kDescs[8], &kDescs[9], &kDescs[10], &kDescs[11], &kDescs[12], &kDescs[13],
    &kDescs[14],
};
_Static_assert(NARGS(kKernels) == NARGS(kDescs), "every descriptor is registered");

PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration* out, char* error,
                                      size_t error_size) {
  PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size);
  if (host_minor < 1)
    return pdlkit_error(error, error_size, PDLKIT_UNSUPPORTED,
                        "needs a host speaking pdlkit ABI >= 1.1 (optional bias, prepack), got 1.%u",
                        (unsigned)host_minor);
  out->kernels = kKernels;
  out->num_kernels = NARGS(kKernels);
  return PDLKIT_OK;
}
