/* The AMX GEMM engine of qgemm_vnni.c (int8: TDPBUSD / TDPBSSD, int32 sums) and gemm_bf16.c
 * (BF16: TDPBF16PS, float32 sums); the tile instructions themselves are in qgemm_amx.h. Tasks
 * of 32 rows x a group of panels with K in chunks (amx_group), each task as 32 x 32 halves of
 * 2 x 2 C tiles whose epilogue runs while the next half's tile instructions do (amx_half,
 * amx_range), one parallel region per (dot product, activation, output kind) (AMX_PARALLEL);
 * the int8 add + LayerNorm entry runs amx_range on a view of its rows (qgemm_vnni.c).
 *
 * Both families' packed weights are panels of NR = 64 columns x k4 groups of 4 bytes along K
 * (VNNI-4: 4 int8 of k per column; VNNI-2: 2 bf16), 256 bytes a group, which are the AMX B-tile
 * layouts as they are; x is rows of bytes (4 per group). So the engine counts K in groups of 4
 * bytes and never looks at the element type: only three things differ, which the includer
 * supplies before including this header:
 *   - amx_dst: a struct with what its epilogue and tail need (output, scales, bias, ...);
 *   - amx_epi_rows(pd, r0, r1, d, act, kind): rows r0 .. r1 - 1 of a pending half (amx_pend,
 *     qgemm_amx.h) through its epilogue (always_inline; act, kind: constants after inlining);
 *   - amx_tail_rows(acc, g, d, i, rows, n0, act, kind): rows i .. i + rows - 1 (fewer than
 *     AMX_MR, the last of a call) of panel column n0 through its vector micro-kernel and
 *     epilogue (acc: scratch of AMX_MR x NR 4-byte values);
 * and the dot product as dp (AMX_DP_*; a constant for BF16, the s8 flag for int8), plus NR and
 * PARALLEL_MIN_MACS. */

#ifndef PDLKIT_QGEMM_AMX_GEMM_H
#define PDLKIT_QGEMM_AMX_GEMM_H

/* The AMX GEMM's blocking (what a brgemm does): a task is one block of AMX_MR rows times a
 * group of panels whose weight (k4 x 256 G bytes, about AMX_GROUP_BYTES) stays in L2 across the
 * row blocks that follow it on the same thread; K goes in chunks of AMX_KC bytes of a row (768
 * int8 or 384 bf16 values), and per chunk the rows' chunk of x (AMX_MR x AMX_KC bytes, 24 KB)
 * stays in L1 while every panel of the group multiplies it, the partial sums of each panel
 * parked in acc (8 KB a panel) between chunks: 4 tile stores and 4 loads per half per chunk of
 * 12 K steps (48 tile loads and 48 dot products). A chunk's round trip through L1 is exact for
 * both int32 and float32 sums, so the chunk size does not change any result.
 * Measured first (int8) with K whole and one panel per task (the rows of x and the half panel
 * both streamed from L2 for every 32 x 32 block): 0.7-0.9 TOP/s at K = 3072 where oneDNN's
 * qlinear reached 1.5. PDLKIT_AMX_KC: a build-time override for benchmarks/x86_amx.py's variants
 * (int8: 384 measured within noise of 768, better at some shapes and worse at others). */
#ifndef PDLKIT_AMX_KC
#define PDLKIT_AMX_KC 768
#endif
/* Bytes of a panel plus a block's rows below which a task is one panel (amx_group). */
#ifndef PDLKIT_AMX_L1
#define PDLKIT_AMX_L1 (32 << 10)
#endif
enum { AMX_KC = PDLKIT_AMX_KC, AMX_GROUP_MAX = 16 };
#define AMX_GROUP_BYTES ((int64_t)768 << 10)

/* panels per group: the weight of a group about AMX_GROUP_BYTES, at most AMX_GROUP_MAX panels,
 * fewer where the tasks would not keep twice the threads busy; one where a panel and a block of
 * rows fit in L1 together (PDLKIT_AMX_L1; int8 K <= 341, bf16 K <= 170): then one panel per
 * task, panel-major, keeps the panel in L1 across the row blocks, which was faster at int8
 * K = 256 (bert-mini: 0.60-0.81 of oneDNN's time with one panel per task, 0.80-1.02 with
 * groups, in two runs on the GPU machine's Xeon). A bf16 panel at K = 256 is 32 KB, 48 KB with
 * its rows: groups by default, one panel with PDLKIT_AMX_L1=49152 (benchmarks/x86_amx.py's
 * variant: not measured yet). */
static int64_t amx_group(const amx_gemm_t *g, int64_t blocks) {
    const int64_t panels = (g->n + NR - 1) / NR, bytes = g->k4 * NR * 4;
    if (bytes + AMX_MR * 4 * g->k4 <= PDLKIT_AMX_L1) return 1;
    int64_t gr = AMX_GROUP_BYTES / bytes;
    gr = gr < 1 ? 1 : gr > AMX_GROUP_MAX ? AMX_GROUP_MAX : gr;
    gr = gr > panels ? panels : gr;
#if defined(_OPENMP)
    const int64_t threads = omp_get_max_threads();
    while (gr > 1 && ((panels + gr - 1) / gr) * blocks < 2 * threads) gr = (gr + 1) / 2;
#endif
    /* groups of equal size, as many as before: BF16 at K = 768 put 12 panels in groups of 8
     * and 4, which gave one of two threads two thirds of the work (BERT-base's N = 768: 8 x 4
     * row blocks against 4 x 4); 6 and 6 split it evenly (add_ln_rows in qgemm_vnni.c splits
     * its rows the same way, measured) */
    const int64_t groups = (panels + gr - 1) / gr;
    return (panels + groups - 1) / groups;
}

/* the tile dot product: dp is a literal for BF16 (folds away) and the s8 flag for int8 (one
 * predictable branch per 16-cycle instruction) */
#define AMX_DP(c, a, b)                                                                          \
    do {                                                                                         \
        if (dp == AMX_DP_BF16)                                                                   \
            _tile_dpbf16ps(c, a, b);                                                             \
        else if (dp == AMX_DP_S8)                                                                \
            _tile_dpbssd(c, a, b);                                                               \
        else                                                                                     \
            _tile_dpbusd(c, a, b);                                                               \
    } while (0)

/* One half: sums[r, c] (+)= x[r, 4 q0 .. 4 q1) . w[col + c, same] for 32 rows (ldx bytes
 * apart) and the 32 columns of the panel half b (= panel + 4 x its first column) as tmm0-3
 * (rows 0-15 / 16-31 x columns 0-15 / 16-31), A tiles tmm4-5, B tiles tmm6-7: four tile loads
 * per four dot products. first: the sums start at zero, else at c (rows NR apart), where they
 * are stored at the end. Between the K steps, pd's epilogue, a slice of its rows per step: the
 * vector units finish the last half while the tile unit runs this one (oneDNN's brgemm
 * interleaves its tile stores and post-ops likewise). PDLKIT_AMX_PIPE=0 builds the epilogue
 * after the half instead (benchmarks/x86_amx.py's comparison; on the GPU machine's Xeon, one
 * thread, int8 time / oneDNN's: 512x256x1024 0.79 without, 0.64 with; 1024x768x768 1.20, 1.03).
 * Also measured there (int8) and left out: software prefetch of the next K step's B rows or the
 * next block's rows of x (better at K = 3072 by up to 7%, worse at K = 256 by up to 28%), and
 * the step's loads each just before its first use (no better). */
#ifndef PDLKIT_AMX_PIPE
#define PDLKIT_AMX_PIPE 1
#endif
AMX static inline __attribute__((always_inline)) void amx_half(
    const char *x, int64_t ldx, int64_t q0, int64_t q1, const char *b, void *acc, int first,
    const amx_pend *pd, const amx_dst *d, int dp, int act, int kind) {
    const char *xa = x, *xb = xa + 16 * ldx;
    char *c = (char *)acc;
    AMX_COUNT_HALF();
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c, NR * 4);
        _tile_loadd(1, c + 64, NR * 4);
        _tile_loadd(2, c + 16 * NR * 4, NR * 4);
        _tile_loadd(3, c + 16 * NR * 4 + 64, NR * 4);
    }
    const int64_t steps = (q1 - q0) / 16;
    int done = 0;
    for (int64_t t = 0; t < steps; t++) {
        const int64_t q = q0 + 16 * t;
        _tile_loadd(4, xa + 4 * q, ldx);
        _tile_loadd(6, b + q * 256, 256);
        _tile_loadd(7, b + q * 256 + 64, 256);
        AMX_DP(0, 4, 6);
        AMX_DP(1, 4, 7);
        _tile_loadd(5, xb + 4 * q, ldx);
        AMX_DP(2, 5, 6);
        AMX_DP(3, 5, 7);
        if (PDLKIT_AMX_PIPE && pd->acc) {
            const int to = (int)(AMX_MR * (t + 1) / steps);
            amx_epi_rows(pd, done, to, d, act, kind);
            done = to;
        }
    }
    if (!PDLKIT_AMX_PIPE && pd->acc) amx_epi_rows(pd, 0, AMX_MR, d, act, kind);
    _tile_stored(0, c, NR * 4);
    _tile_stored(1, c + 64, NR * 4);
    _tile_stored(2, c + 16 * NR * 4, NR * 4);
    _tile_stored(3, c + 16 * NR * 4 + 64, NR * 4);
}

/* Tasks t0 .. t1 - 1 of a call (task t: rows (t % blocks) x AMX_MR, panels of group t / blocks)
 * on this thread, as one stream of halves, each one's epilogue run during the next one's tiles,
 * the last one's at the end. Per task: K in chunks, per chunk every panel of the group (its
 * partial sums parked in acc, AMX_MR x NR 4-byte values a panel); the half of a panel past its
 * last column is skipped. Rows past the last whole block of AMX_MR go through the includer's
 * vector micro-kernel (amx_tail_rows). */
AMX static inline __attribute__((always_inline)) void amx_range(
    void *acc, int64_t t0, int64_t t1, int64_t blocks, int64_t group, const amx_gemm_t *g,
    const amx_dst *d, int dp, int act, int kind) {
    const int64_t n = g->n, k4 = g->k4, kc4 = AMX_KC / 4, panels = (n + NR - 1) / NR;
    amx_pend pd = {NULL, 0, 0, 0};
    for (int64_t t = t0; t < t1; t++) {
        const int64_t i = (t % blocks) * AMX_MR, p0 = (t / blocks) * group;
        const int64_t p1 = p0 + group < panels ? p0 + group : panels;
        if (g->m - i < AMX_MR) { /* the last rows: vector path, after the pending epilogue */
            if (pd.acc) amx_epi_rows(&pd, 0, AMX_MR, d, act, kind);
            pd.acc = NULL;
            for (int64_t pi = p0; pi < p1; pi++)
                amx_tail_rows(acc, g, d, i, g->m - i, pi * NR, act, kind);
            continue;
        }
        for (int64_t q0 = 0; q0 < k4; q0 += kc4) {
            const int64_t q1 = k4 - q0 < kc4 ? k4 : q0 + kc4;
            for (int64_t pi = p0; pi < p1; pi++) {
                char *a = (char *)acc + (pi - p0) * AMX_MR * NR * 4;
                const int64_t nc = n - pi * NR < NR ? n - pi * NR : NR;
                for (int64_t h = 0; h < (nc > 32 ? 2 : 1); h++) {
                    amx_half(g->x + i * g->ldx, g->ldx, q0, q1, g->packed + pi * k4 * NR * 4 + 128 * h,
                             a + 128 * h, q0 == 0, &pd, d, dp, act, kind);
                    pd.acc = NULL;
                    if (q1 == k4) {
                        pd.acc = a + 128 * h;
                        pd.row = i;
                        pd.col = pi * NR + 32 * h;
                        pd.nc = nc - 32 * h < 32 ? nc - 32 * h : 32;
                    }
                }
            }
        }
    }
    if (pd.acc) amx_epi_rows(&pd, 0, AMX_MR, d, act, kind);
}

/* A call's tasks for amx_range: blocks of AMX_MR rows, panels per group (amx_group), and how
 * many tasks (groups x blocks, group-major) */
typedef struct {
    int64_t blocks, group, count;
} amx_tasks_t;

static inline amx_tasks_t amx_tasks(const amx_gemm_t *g) {
    const int64_t blocks = (g->m + AMX_MR - 1) / AMX_MR, panels = (g->n + NR - 1) / NR;
    const int64_t group = amx_group(g, blocks);
    return (amx_tasks_t){blocks, group, ((panels + group - 1) / group) * blocks};
}

/* This thread's contiguous share [*t0, *t1) of tasks 0 .. tasks - 1 (all of them outside a
 * parallel region) */
static inline void amx_thread_share(int64_t tasks, int64_t *t0, int64_t *t1) {
#if defined(_OPENMP)
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    *t0 = tasks * me / threads;
    *t1 = tasks * (me + 1) / threads;
#else
    *t0 = 0;
    *t1 = tasks;
#endif
}

/* The body of a family's AMX variant (a function per activation and output kind, in which
 * DP, ACT and KIND are literals: GCC outlines an OpenMP region before it inlines, so only a
 * region whose body passes them as literals gets a specialised epilogue; see qgemm_vnni.c's
 * GEMM_VARIANT): the tasks (panel group, block of AMX_MR rows), in that order, split into one
 * contiguous run per thread (in parallel where PAR); each thread configures the tiles once for
 * its run and releases them at its end. G: const amx_gemm_t *, D: const amx_dst *. */
#if defined(_OPENMP)
#define AMX_OMP_REGION _Pragma("omp parallel if (par)") /* par: AMX_PARALLEL's local */
#else
#define AMX_OMP_REGION
#endif
#define AMX_PARALLEL(G, D, PAR, DP, ACT, KIND)                                                   \
    do {                                                                                         \
        const amx_tasks_t tasks = amx_tasks(G);                                                  \
        const int par = (PAR);                                                                   \
        (void)par; /* read by the OpenMP region only */                                          \
        AMX_OMP_REGION                                                                           \
        {                                                                                        \
            int32_t acc[AMX_GROUP_MAX * AMX_MR * NR] __attribute__((aligned(64))); /* 128 KB */  \
            int64_t t0 = 0, t1 = tasks.count;                                                    \
            amx_thread_share(tasks.count, &t0, &t1);                                             \
            if (t0 < t1) {                                                                       \
                amx_configure();                                                                 \
                amx_range(acc, t0, t1, tasks.blocks, tasks.group, G, D, DP, ACT, KIND);          \
                amx_release();                                                                   \
            }                                                                                    \
        }                                                                                        \
    } while (0)

#endif
