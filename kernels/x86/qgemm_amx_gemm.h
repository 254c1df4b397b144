/* The AMX GEMM of qgemm_vnni.c (included by it after the VNNI micro-kernel and the epilogue;
 * the tile instructions themselves are in qgemm_amx.h): a block of 32 rows x one panel
 * (amx_rows, also the add + LayerNorm entry's), the blocking of a whole GEMM into tasks of 32
 * rows x a group of panels with K in chunks (amx_group, amx_task) and one parallel function per
 * (activation, output kind) (AMX_VARIANT). */

#ifndef PDLKIT_QGEMM_AMX_GEMM_H
#define PDLKIT_QGEMM_AMX_GEMM_H

/* Rows i .. i + rows - 1 (rows <= AMX_MR) of panel column n0 into acc (rows NR apart), then
 * the epilogue: AMX tiles for a whole block of AMX_MR rows, the VNNI micro-kernel (6 rows at a
 * time) for the rows past the last whole block. res: as in tile_out. */
VNNI static inline __attribute__((always_inline)) void amx_rows(
    int32_t *acc, const uint8_t *x, int64_t i, int64_t rows, int64_t ldx, int64_t n0,
    const pdlkit_qgemm_params *p, const epi_t *e, void *out, int64_t ldo, int act, int kind,
    const float *res, int64_t ldr) {
    const int64_t n = p->n, k = p->k, k4 = (k + 3) / 4, esize = kind == OUT_F32 ? 4 : 1;
    const int8_t *panel = p->packed + (n0 / NR) * k4 * NR * 4;
    const int64_t nc = n - n0 < NR ? n - n0 : NR;
    const int s8 = (p->flags & QG_S8) != 0;
    if (rows == AMX_MR) {
        (s8 ? amx_block_s8 : amx_block_u8)(x + i * ldx, ldx, 0, k4, panel, acc, 1);
        tile_out(acc, AMX_MR, nc, s8 ? p->colcorr_ss : p->colcorr, e, n0, i,
                 (char *)out + i * ldo * esize, ldo, act, kind, res ? res + i * ldr : NULL, ldr);
        return;
    }
    for (int64_t r = i; r < i + rows; r += MR) {
        const int mr = i + rows - r < MR ? (int)(i + rows - r) : MR;
        kloop(mr, s8, x + r * ldx, ldx, k, panel, acc);
        tile_out(acc, mr, nc, p->colcorr, e, n0, r, (char *)out + r * ldo * esize, ldo, act, kind,
                 res ? res + r * ldr : NULL, ldr);
    }
}

/* The AMX GEMM's blocking (what a brgemm does): a task is one block of AMX_MR rows times a
 * group of panels whose weight (K x 64 G bytes, about AMX_GROUP_BYTES) stays in L2 across the
 * row blocks that follow it on the same thread; K goes in chunks of AMX_KC, and per chunk the
 * rows' chunk of x (AMX_MR x AMX_KC bytes, 24 KB) stays in L1 while every panel of the group
 * multiplies it, the partial sums of each panel parked in acc (8 KB a panel) between chunks.
 * Measured first with K whole and one panel per task (the rows of x and the half panel both
 * streamed from L2 for every 32 x 32 block): 0.7-0.9 TOP/s at K = 3072 where oneDNN's qlinear
 * reached 1.5. */
enum { AMX_KC = 768, AMX_GROUP_MAX = 16 };
#define AMX_GROUP_BYTES ((int64_t)768 << 10)

/* panels per group: the weight of a group about AMX_GROUP_BYTES, at most AMX_GROUP_MAX panels,
 * fewer where the tasks would not keep twice the threads busy; one where a panel and a block of
 * rows fit in L1 together (K <= 341): then one panel per task, panel-major, keeps the panel in
 * L1 across the row blocks, which was faster at K = 256 (bert-mini: 0.60-0.81 of oneDNN's time
 * with one panel per task, 0.80-1.02 with groups, in two runs on the GPU machine's Xeon; this
 * rule itself was not measured there) */
static int64_t amx_group(const pdlkit_qgemm_params *p, int64_t blocks) {
    const int64_t panels = (p->n + NR - 1) / NR, bytes = ((p->k + 3) / 4) * NR * 4;
    if (bytes + AMX_MR * p->k <= (32 << 10)) return 1;
    int64_t g = AMX_GROUP_BYTES / bytes;
    g = g < 1 ? 1 : g > AMX_GROUP_MAX ? AMX_GROUP_MAX : g;
    g = g > panels ? panels : g;
#if defined(_OPENMP)
    const int64_t threads = omp_get_max_threads();
    while (g > 1 && ((panels + g - 1) / g) * blocks < 2 * threads) g = (g + 1) / 2;
#endif
    return g;
}

/* Rows i .. i + rows - 1 times panels g0 .. g1 - 1: AMX tiles in K chunks for a whole block of
 * AMX_MR rows, each panel's epilogue right after its last chunk; the VNNI path for fewer rows.
 * acc: (g1 - g0) x AMX_MR x NR int32. */
VNNI static inline __attribute__((always_inline)) void amx_task(
    int32_t *acc, const uint8_t *x, int64_t i, int64_t rows, int64_t ldx, int64_t g0, int64_t g1,
    const pdlkit_qgemm_params *p, const epi_t *e, void *out, int64_t ldo, int act, int kind) {
    if (rows < AMX_MR) {
        for (int64_t g = g0; g < g1; g++)
            amx_rows(acc, x, i, rows, ldx, g * NR, p, e, out, ldo, act, kind, NULL, 0);
        return;
    }
    const int64_t n = p->n, k4 = (p->k + 3) / 4, kc4 = AMX_KC / 4, esize = kind == OUT_F32 ? 4 : 1;
    const int s8 = (p->flags & QG_S8) != 0;
    for (int64_t q0 = 0; q0 < k4; q0 += kc4) {
        const int64_t q1 = k4 - q0 < kc4 ? k4 : q0 + kc4;
        for (int64_t g = g0; g < g1; g++) {
            int32_t *a = acc + (g - g0) * AMX_MR * NR;
            (s8 ? amx_block_s8 : amx_block_u8)(x + i * ldx, ldx, q0, q1, p->packed + g * k4 * NR * 4,
                                                a, q0 == 0);
            if (q1 == k4)
                tile_out(a, AMX_MR, n - g * NR < NR ? n - g * NR : NR,
                         s8 ? p->colcorr_ss : p->colcorr, e, g * NR, i,
                         (char *)out + i * ldo * esize, ldo, act, kind, NULL, 0);
        }
    }
}

/* The AMX variant: tasks (panel group, block of AMX_MR rows) in that order; each thread
 * configures the tiles for its share and releases them at its end. */
#if defined(_OPENMP)
#define OMP_REGION _Pragma("omp parallel if (m * p->n * p->k >= PARALLEL_MIN_MACS)")
#define OMP_FOR _Pragma("omp for schedule(static)")
#else
#define OMP_REGION
#define OMP_FOR
#endif
#define AMX_VARIANT(ACT, KIND)                                                                   \
    VNNI static void amx_##ACT##_##KIND(const uint8_t *x, int64_t m, int64_t ldx, void *out,      \
                                        int64_t ldo, const pdlkit_qgemm_params *p,                 \
                                        const epi_t *e) {                                          \
        const int64_t blocks = (m + AMX_MR - 1) / AMX_MR, panels = (p->n + NR - 1) / NR;          \
        const int64_t group = amx_group(p, blocks), tasks = ((panels + group - 1) / group) * blocks; \
        OMP_REGION                                                                                \
        {                                                                                         \
            int32_t acc[AMX_GROUP_MAX * AMX_MR * NR] __attribute__((aligned(64))); /* 128 KB */   \
            amx_configure();                                                                      \
            OMP_FOR                                                                               \
            for (int64_t t = 0; t < tasks; t++) {                                                 \
                const int64_t i = (t % blocks) * AMX_MR, g0 = (t / blocks) * group;               \
                amx_task(acc, x, i, m - i < AMX_MR ? m - i : AMX_MR, ldx, g0,                     \
                         g0 + group < panels ? g0 + group : panels, p, e, out, ldo, ACT, KIND);   \
            }                                                                                     \
            amx_release();                                                                        \
        }                                                                                         \
    }
#endif
