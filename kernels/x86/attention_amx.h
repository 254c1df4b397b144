/* The attention's two products on AMX-BF16 tiles (TDPBF16PS), included by attention_core.h
 * (so by attention.c and qgemm_vnni.c alike).
 *
 * What runs on tiles: per head, blocks of ATT_TR = 16 query rows; S = Q K^T (A: the 16 rows of
 * q as bf16 pair words, qb; B: pack_k_bf16's kp, whose row d2 holds the pair
 * (k[j, 2 d2], k[j, 2 d2 + 1]) of every key j: the B-tile layout as it is) and O = P V (A: the
 * 16 rows of bf16 softmax weights, pb; B: pack_v's vp, row j2 = the pairs (v[2 j2, d],
 * v[2 j2 + 1, d]): again the B-tile layout), both with float32 sums. Everything else is the
 * vector path's code: the per-4-row precision rule (a group of 4 rows where a logit could exceed
 * QK_BF16_MAX gets float32 Q K^T from qk_rows, on the vector units, written over the tiles'
 * scores; a block where all groups need float32 skips the Q K^T tiles), masking, softmax,
 * NaN / inf checks, the quantized store (store_codes) and the threads (each thread loads the tile
 * configuration before its heads and releases it after them: att_amx_begin / att_amx_end).
 *
 * When: execute asks att_uses_amx once per call: the CPU has AMX-BF16 and Linux granted this
 * process the tile state (qgemm_amx.h's amx_ready_for(1)), D % 32 == 0 (Q K^T steps of 32 d,
 * whole 16-column output tiles) and Sq >= 16 (a whole block of query rows; fewer, as in
 * decoding, stay on the vector path). Any Sk: scores are computed in 16-key tiles (SkP, Sk
 * rounded up to 16, as the vector path pads); P V steps over 32 keys, so P rows are SkT (Sk
 * rounded up to 32) long with zeros past Sk, and V's pair rows past Sk are zeroed. Sq not a
 * multiple of 16: the last block's padding rows are zeros and their codes are not stored.
 * Otherwise the vector (AVX512_BF16) path runs as before. Test builds: -DPDLKIT_AMX_EMULATE
 * runs the tile instructions in plain C (qgemm_amx.h); it and -DPDLKIT_ATTENTION_COUNT_TILES
 * export pdlkit_attention_amx_gemms(), the number of tile products run so far;
 * -DPDLKIT_ATTENTION_NO_AMX never uses the tiles (the vector path on any host). */
#ifndef PDLKIT_ATTENTION_AMX_H
#define PDLKIT_ATTENTION_AMX_H

#ifndef PDLKIT_X86
#define PDLKIT_X86 1 /* attention_core.h is x86-64 only */
#endif
#include "qgemm_amx.h" /* amx_ready_for, amx_configure / amx_release, the AMX target, emulation */

#if defined(PDLKIT_AMX_EMULATE) || defined(PDLKIT_ATTENTION_COUNT_TILES)
static int64_t att_amx_gemm_count;
/* Tests: how many tile products (att_amx_gemm calls) this library has run. */
__attribute__((visibility("default"), used)) int64_t pdlkit_attention_amx_gemms(void) {
  return __atomic_load_n(&att_amx_gemm_count, __ATOMIC_RELAXED);
}
#define ATT_AMX_COUNT() __atomic_fetch_add(&att_amx_gemm_count, 1, __ATOMIC_RELAXED)
#else
#define ATT_AMX_COUNT() (void)0
#endif
#if defined(PDLKIT_AMX_EMULATE)
/* Tests: the scratch filled with NaN bytes before each call (bf16 and float32 NaN), so that a
 * tile reading bytes no step wrote (P or V past Sk, say) gives NaN codes. */
#define att_poison(ws, n) memset((ws), 0xFF, (n))
#else
#define att_poison(ws, n) (void)0
#endif

/* Whether this call's heads run on tiles (see the top of this file). */
static int att_uses_amx(const attn_params* p) {
#if defined(PDLKIT_ATTENTION_NO_AMX)
  (void)p;
  return 0;
#else
  return p->D % 32 == 0 && p->Sq >= ATT_TR && amx_ready_for(1);
#endif
}

static void att_amx_begin(void) { amx_configure(); } /* palette 1, 8 tiles of 16 x 64 bytes */
static void att_amx_end(void) { amx_release(); }

/* One pass of nt (1 to 4) 16-column C tiles (tmm0 .. tmm nt-1): c[16][0 .. 16 nt) = sum over
 * kw pair words (a multiple of 16) of a[16][w] . b[w][0 .. 16 nt); A in tmm4, B in tmm5-7
 * (tmm5 again for the fourth); rows lda / ldb / ldc bytes apart. Tile numbers are literals
 * (GCC's tile macros paste them into the instruction), nt a constant after inlining. */
AMX static inline __attribute__((always_inline)) void att_amx_pass(
    const int nt, const char* a, int64_t lda, int64_t kw, const char* b, int64_t ldb, char* c,
    int64_t ldc) {
  _tile_zero(0);
  if (nt > 1) _tile_zero(1);
  if (nt > 2) _tile_zero(2);
  if (nt > 3) _tile_zero(3);
  for (int64_t w = 0; w < kw; w += 16) {
    const char* bw = b + w * ldb;
    _tile_loadd(4, a + 4 * w, lda);
    _tile_loadd(5, bw, ldb);
    if (nt > 1) _tile_loadd(6, bw + 64, ldb);
    if (nt > 2) _tile_loadd(7, bw + 128, ldb);
    _tile_dpbf16ps(0, 4, 5);
    if (nt > 1) _tile_dpbf16ps(1, 4, 6);
    if (nt > 2) _tile_dpbf16ps(2, 4, 7);
    if (nt > 3) {
      _tile_loadd(5, bw + 192, ldb);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, c, ldc);
  if (nt > 1) _tile_stored(1, c + 64, ldc);
  if (nt > 2) _tile_stored(2, c + 128, ldc);
  if (nt > 3) _tile_stored(3, c + 192, ldc);
}

/* c[16][0 .. n) = a[16][0 .. kw) . b[0 .. kw)[0 .. n) over bf16 pair words, float32 sums: a
 * rows lda bytes apart, b rows (one pair word per column: the B-tile layout) ldb bytes apart, c
 * rows ldc bytes apart; kw a multiple of 16, n of 16. Columns in passes of 64, then the rest. */
AMX __attribute__((noinline)) static void att_amx_gemm(const void* a, int64_t lda, int64_t kw,
                                                       const void* b, int64_t ldb, int64_t n,
                                                       float* c, int64_t ldc) {
  const char *A = (const char*)a, *B = (const char*)b;
  char* C = (char*)c;
  int64_t c0 = 0;
  for (; c0 + 64 <= n; c0 += 64) att_amx_pass(4, A, lda, kw, B + 4 * c0, ldb, C + 4 * c0, ldc);
  switch ((n - c0) / 16) {
    case 1: att_amx_pass(1, A, lda, kw, B + 4 * c0, ldb, C + 4 * c0, ldc); break;
    case 2: att_amx_pass(2, A, lda, kw, B + 4 * c0, ldb, C + 4 * c0, ldc); break;
    case 3: att_amx_pass(3, A, lda, kw, B + 4 * c0, ldb, C + 4 * c0, ldc); break;
    default: break;
  }
  ATT_AMX_COUNT();
}

/* Codes of the rows r < nb of the block from i0 from the P V sums ob (rows DP apart). */
static BF16_TARGET void store_rows(const att_head* h, int64_t i0, int nb, const float* inv) {
  const int64_t DP = h->L->DP, D = h->p->D, ldo = h->p->os[2];
  for (int r = 0; r < nb; ++r)
    for (int64_t d0 = 0; d0 < D; d0 += 16)
      store_codes(_mm512_loadu_ps(h->ob + r * DP + d0), _mm512_set1_ps(inv[r]),
                  h->out + (i0 + r) * ldo + d0, first_n(D - d0), h->p);
}

/* The ATT_TR query rows from i0 (those below Sq) of one head, Q K^T and P V on tiles; 1 where a
 * value is not finite (see attention_head). */
static BF16_TARGET int block_amx(att_head* h, int64_t i0) {
  const attn_layout* L = h->L;
  const int64_t SkP = L->SkP, SkT = L->SkT, D2P = L->D2P;
  const int nb = h->p->Sq - i0 < ATT_TR ? (int)(h->p->Sq - i0) : ATT_TR;
  enum { G = ATT_TR / ATT_MR }; /* groups of ATT_MR rows: the vector path's precision blocks */
  int mr[G], bf16[G], any = 0, bad = 0;
  float inv[ATT_TR];
  for (int g = 0; g < G; ++g) {
    mr[g] = nb - g * ATT_MR < 0 ? 0 : nb - g * ATT_MR > ATT_MR ? ATT_MR : nb - g * ATT_MR;
    const float qn = q_rows(h, i0 + g * ATT_MR, mr[g], h->qb + g * ATT_MR * D2P);
    bad |= !(qn <= FLT_MAX);
    bf16[g] = qk_bf16_ok(h, qn);
    any |= mr[g] > 0 && bf16[g];
  }
  if (any) att_amx_gemm(h->qb, D2P * 4, L->D2, h->kp, SkP * 4, SkP, h->sb, SkP * 4);
  for (int g = 0; g < G; ++g) {
    const int64_t r0 = g * ATT_MR;
    if (mr[g] > 0 && !bf16[g]) qk_rows(h, i0 + r0, mr[g], h->qb + r0 * D2P, 0, h->sb + r0 * SkP);
    if (mr[g] > 0) /* (P rows of groups past Sq only give rows of sums that are not stored) */
      bad |= softmax_rows(h, i0 + r0, mr[g], h->sb + r0 * SkP, h->pb + r0 * SkT, SkT, inv + r0);
  }
  if (SkT > SkP) /* the keys SkP .. SkT of P V's last step of 32 */
    for (int r = 0; r < ATT_TR; ++r) memset(h->pb + r * SkT + SkP, 0, (size_t)(SkT - SkP) * 2);
  att_amx_gemm(h->pb, SkT * 2, SkT / 2, h->vp, L->DP * 4, L->DP, h->ob, L->DP * 4);
  store_rows(h, i0, nb, inv);
  return bad;
}

/* head_rows on tiles (L->tiles: att_uses_amx said so; the thread has configured them). */
static BF16_TARGET int head_rows_amx(att_head* h) {
  const attn_layout* L = h->L;
  /* V's pair rows Sk2 .. SkT / 2, read by P V's last step of 32 keys, are zero */
  memset((uint32_t*)h->vp + L->Sk2 * L->DP, 0, (size_t)((L->SkT / 2 - L->Sk2) * L->DP) * 4);
  int bad = 0;
  for (int64_t i0 = 0; i0 < h->p->Sq; i0 += ATT_TR) bad |= block_amx(h, i0);
  return bad;
}

#endif
