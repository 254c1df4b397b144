/* The AMX GEMM of qgemm_vnni.c (included by it after the VNNI micro-kernel and the epilogue;
 * the tile instructions themselves are in qgemm_amx.h): tasks of 32 rows x a group of panels
 * with K in chunks (amx_group), each task as 32 x 32 halves of 2 x 2 C tiles whose epilogue runs
 * while the next half's tile instructions do (amx_half, amx_epi_rows, amx_range), one parallel
 * function per (activation, output kind) (AMX_VARIANT), the add + LayerNorm entry's GEMM
 * (amx_add_rows); the rows past the last whole block of 32 through the VNNI micro-kernel
 * (amx_tail_rows). */

#ifndef PDLKIT_QGEMM_AMX_GEMM_H
#define PDLKIT_QGEMM_AMX_GEMM_H

/* Rows i .. i + rows - 1 (rows < AMX_MR: the last of a call, fewer than a block) of panel
 * column n0 through the VNNI micro-kernel, 6 at a time, and tile_out (acc: 6 x NR int32 of
 * scratch). res: as in tile_out. */
VNNI static inline __attribute__((always_inline)) void amx_tail_rows(
    int32_t *acc, const uint8_t *x, int64_t i, int64_t rows, int64_t ldx, int64_t n0,
    const pdlkit_qgemm_params *p, const epi_t *e, void *out, int64_t ldo, int act, int kind,
    const float *res, int64_t ldr) {
    const int64_t n = p->n, k = p->k, k4 = (k + 3) / 4, esize = kind == OUT_F32 ? 4 : 1;
    const int8_t *panel = p->packed + (n0 / NR) * k4 * NR * 4;
    const int64_t nc = n - n0 < NR ? n - n0 : NR;
    for (int64_t r = i; r < i + rows; r += MR) {
        const int mr = i + rows - r < MR ? (int)(i + rows - r) : MR;
        kloop(mr, (p->flags & QG_S8) != 0, x + r * ldx, ldx, k, panel, acc);
        tile_out(acc, mr, nc, p->colcorr, e, n0, r, (char *)out + r * ldo * esize, ldo, act, kind,
                 res ? res + r * ldr : NULL, ldr);
    }
}

/* The AMX GEMM's blocking (what a brgemm does): a task is one block of AMX_MR rows times a
 * group of panels whose weight (K x 64 G bytes, about AMX_GROUP_BYTES) stays in L2 across the
 * row blocks that follow it on the same thread; K goes in chunks of AMX_KC, and per chunk the
 * rows' chunk of x (AMX_MR x AMX_KC bytes) stays in L1 while every panel of the group
 * multiplies it, the partial sums of each panel parked in acc (8 KB a panel) between chunks.
 * Measured first with K whole and one panel per task (the rows of x and the half panel both
 * streamed from L2 for every 32 x 32 block): 0.7-0.9 TOP/s at K = 3072 where oneDNN's qlinear
 * reached 1.5. PDLKIT_AMX_KC: a build-time override for benchmarks/x86_amx.py's variants (384
 * measured within noise of 768, better at some shapes and worse at others). */
#ifndef PDLKIT_AMX_KC
#define PDLKIT_AMX_KC 768
#endif
enum { AMX_KC = PDLKIT_AMX_KC, AMX_GROUP_MAX = 16 };
#define AMX_GROUP_BYTES ((int64_t)768 << 10)

/* panels per group: the weight of a group about AMX_GROUP_BYTES, at most AMX_GROUP_MAX panels,
 * fewer where the tasks would not keep twice the threads busy; one where a panel and a block of
 * rows fit in L1 together (K <= 341): then one panel per task, panel-major, keeps the panel in
 * L1 across the row blocks, which was faster at K = 256 (bert-mini: 0.60-0.81 of oneDNN's time
 * with one panel per task, 0.80-1.02 with groups, in two runs on the GPU machine's Xeon). */
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

/* A half whose sums are complete and whose epilogue is still to run: 32 rows x nc (<= 32)
 * int32 sums at acc (rows NR apart), for output rows row .. row + 31 and columns col ..
 * col + nc - 1; acc NULL: none. */
typedef struct {
    const int32_t *acc;
    int64_t row, col, nc;
} amx_pend;

/* Where the epilogue of a call writes: out (rows ldo apart, row 0 of the call), from sums
 * corrected by cc; res (float32 output only; rows ldr apart, or NULL): added as it stores. */
typedef struct {
    const int32_t *cc;
    const epi_t *e;
    void *out;
    int64_t ldo;
    const float *res;
    int64_t ldr;
} amx_dst;

/* Rows r0 .. r1 - 1 of a pending half through the epilogue (what tile_out does for a VNNI
 * block; act and kind are constants after inlining): zero-point correction, scales, bias,
 * activation, then the float32 store or the codes, 32 per row (pack64 of two vectors). */
VNNI static inline __attribute__((always_inline)) void amx_epi_rows(const amx_pend *pd, int r0,
                                                                   int r1, const amx_dst *d,
                                                                   int act, int kind) {
    const int32_t *cc = d->cc;
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
            __m512i a = _mm512_load_si512(pd->acc + r * NR + 16 * j);
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

#define AMX_DP(c, a, b)                                                                          \
    do {                                                                                         \
        if (s8)                                                                                  \
            _tile_dpbssd(c, a, b);                                                               \
        else                                                                                     \
            _tile_dpbusd(c, a, b);                                                               \
    } while (0)

/* One half: sums[r, c] (+)= x[r, 4 q0 .. 4 q1) . w[col + c, same] for 32 rows (ldx bytes
 * apart) and the 32 columns of the panel half b (= panel + 4 x its first column) as tmm0-3
 * (rows 0-15 / 16-31 x columns 0-15 / 16-31), A tiles tmm4-5, B tiles tmm6-7: four tile loads
 * per four TDPBUSD / TDPBSSD. first: the sums start at zero, else at c (rows NR apart), where
 * they are stored at the end. Between the K steps, pd's epilogue, a slice of its rows per step:
 * the vector units finish the last half while the tile unit runs this one (oneDNN's brgemm
 * interleaves its tile stores and post-ops likewise). PDLKIT_AMX_PIPE=0 builds the epilogue
 * after the half instead (benchmarks/x86_amx.py's comparison; on the GPU machine's Xeon, one
 * thread, time / oneDNN's: 512x256x1024 0.79 without, 0.64 with; 1024x768x768 1.20, 1.03).
 * Also measured there and left out: software prefetch of the next K step's B rows or the next
 * block's rows of x (better at K = 3072 by up to 7%, worse at K = 256 by up to 28%), and the
 * step's loads each just before its first use (no better). */
#ifndef PDLKIT_AMX_PIPE
#define PDLKIT_AMX_PIPE 1
#endif
AMX static inline __attribute__((always_inline)) void amx_half(
    const uint8_t *x, int64_t ldx, int64_t q0, int64_t q1, const int8_t *b, int32_t *c, int first,
    int s8, const amx_pend *pd, const amx_dst *d, int act, int kind) {
    const char *xa = (const char *)x, *xb = xa + 16 * ldx, *bb = (const char *)b;
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c, NR * 4);
        _tile_loadd(1, c + 16, NR * 4);
        _tile_loadd(2, c + 16 * NR, NR * 4);
        _tile_loadd(3, c + 16 * NR + 16, NR * 4);
    }
    const int64_t steps = (q1 - q0) / 16;
    int done = 0;
    for (int64_t t = 0; t < steps; t++) {
        const int64_t q = q0 + 16 * t;
        _tile_loadd(4, xa + 4 * q, ldx);
        _tile_loadd(6, bb + q * 256, 256);
        _tile_loadd(7, bb + q * 256 + 64, 256);
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
    _tile_stored(1, c + 16, NR * 4);
    _tile_stored(2, c + 16 * NR, NR * 4);
    _tile_stored(3, c + 16 * NR + 16, NR * 4);
}

/* Tasks t0 .. t1 - 1 of a call (task t: rows (t % blocks) x AMX_MR, panels of group t / blocks)
 * on this thread, as one stream of halves, each one's epilogue run during the next one's tiles,
 * the last one's at the end. Per task: K in chunks, per chunk every panel of the group (its
 * partial sums parked in acc, AMX_MR x NR int32 a panel); the half of a panel past its last
 * column is skipped. Rows past the last whole block of AMX_MR go through the VNNI micro-kernel
 * (amx_tail_rows). */
AMX static inline __attribute__((always_inline)) void amx_range(
    int32_t *acc, int64_t t0, int64_t t1, int64_t blocks, int64_t group, const uint8_t *x,
    int64_t m, int64_t ldx, void *out, int64_t ldo, const pdlkit_qgemm_params *p, const epi_t *e,
    int act, int kind) {
    const int64_t n = p->n, k4 = (p->k + 3) / 4, kc4 = AMX_KC / 4, panels = (n + NR - 1) / NR;
    const int s8 = (p->flags & QG_S8) != 0;
    const amx_dst d = {s8 ? p->colcorr_ss : p->colcorr, e, out, ldo, NULL, 0};
    amx_pend pd = {NULL, 0, 0, 0};
    for (int64_t t = t0; t < t1; t++) {
        const int64_t i = (t % blocks) * AMX_MR, g0 = (t / blocks) * group;
        const int64_t g1 = g0 + group < panels ? g0 + group : panels;
        if (m - i < AMX_MR) { /* the last rows: VNNI, after the pending epilogue */
            if (pd.acc) amx_epi_rows(&pd, 0, AMX_MR, &d, act, kind);
            pd.acc = NULL;
            for (int64_t g = g0; g < g1; g++)
                amx_tail_rows(acc, x, i, m - i, ldx, g * NR, p, e, out, ldo, act, kind, NULL, 0);
            continue;
        }
        for (int64_t q0 = 0; q0 < k4; q0 += kc4) {
            const int64_t q1 = k4 - q0 < kc4 ? k4 : q0 + kc4;
            for (int64_t g = g0; g < g1; g++) {
                int32_t *a = acc + (g - g0) * AMX_MR * NR;
                const int64_t nc = n - g * NR < NR ? n - g * NR : NR;
                for (int64_t h = 0; h < (nc > 32 ? 2 : 1); h++) {
                    amx_half(x + i * ldx, ldx, q0, q1, p->packed + g * k4 * NR * 4 + 128 * h,
                             a + 32 * h, q0 == 0, s8, &pd, &d, act, kind);
                    pd.acc = NULL;
                    if (q1 == k4) {
                        pd.acc = a + 32 * h;
                        pd.row = i;
                        pd.col = g * NR + 32 * h;
                        pd.nc = nc - 32 * h < 32 ? nc - 32 * h : 32;
                    }
                }
            }
        }
    }
    if (pd.acc) amx_epi_rows(&pd, 0, AMX_MR, &d, act, kind);
}

/* The GEMM of the add + LayerNorm entry on AMX (add_ln_group's): rows i0 .. i1 - 1 x every
 * panel into out (float32, res added), panels outside and blocks of AMX_MR rows inside, K whole,
 * as one stream of halves like amx_range (acc: one panel, AMX_MR x NR int32); the rows past the
 * last whole block through the VNNI micro-kernel (amx_tail_rows). */
AMX __attribute__((noinline)) static void amx_add_rows(
    int32_t *acc, const uint8_t *x, int64_t i0, int64_t i1, int64_t ldx,
    const pdlkit_qgemm_params *p, const epi_t *e, float *out, int64_t ldo, const float *res,
    int64_t ldr) {
    const int64_t n = p->n, k4 = (p->k + 3) / 4, whole = i0 + (i1 - i0) / AMX_MR * AMX_MR;
    const int s8 = (p->flags & QG_S8) != 0;
    const amx_dst d = {s8 ? p->colcorr_ss : p->colcorr, e, out, ldo, res, ldr};
    amx_pend pd = {NULL, 0, 0, 0};
    for (int64_t n0 = 0; n0 < n; n0 += NR) {
        const int64_t nc = n - n0 < NR ? n - n0 : NR, halves = nc > 32 ? 2 : 1;
        for (int64_t i = i0; i < whole; i += AMX_MR)
            for (int64_t h = 0; h < halves; h++) {
                amx_half(x + i * ldx, ldx, 0, k4, p->packed + n0 * k4 * 4 + 128 * h, acc + 32 * h,
                         1, s8, &pd, &d, ACT_NONE, OUT_F32);
                pd.acc = acc + 32 * h;
                pd.row = i;
                pd.col = n0 + 32 * h;
                pd.nc = nc - 32 * h < 32 ? nc - 32 * h : 32;
            }
    }
    if (pd.acc) amx_epi_rows(&pd, 0, AMX_MR, &d, ACT_NONE, OUT_F32);
    for (int64_t n0 = 0; whole < i1 && n0 < n; n0 += NR)
        amx_tail_rows(acc, x, whole, i1 - whole, ldx, n0, p, e, out, ldo, ACT_NONE, OUT_F32, res, ldr);
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

/* The AMX variant: the tasks (panel group, block of AMX_MR rows), in that order, split into
 * one contiguous run per thread; each thread configures the tiles once for its run and
 * releases them at its end. */
#if defined(_OPENMP)
#define OMP_REGION _Pragma("omp parallel if (m * p->n * p->k >= PARALLEL_MIN_MACS)")
#else
#define OMP_REGION
#endif
#define AMX_VARIANT(ACT, KIND)                                                                   \
    AMX static void amx_##ACT##_##KIND(const uint8_t *x, int64_t m, int64_t ldx, void *out,      \
                                       int64_t ldo, const pdlkit_qgemm_params *p,                  \
                                       const epi_t *e) {                                           \
        const int64_t blocks = (m + AMX_MR - 1) / AMX_MR, panels = (p->n + NR - 1) / NR;          \
        const int64_t group = amx_group(p, blocks), tasks = ((panels + group - 1) / group) * blocks; \
        OMP_REGION                                                                                \
        {                                                                                         \
            int32_t acc[AMX_GROUP_MAX * AMX_MR * NR] __attribute__((aligned(64))); /* 128 KB */   \
            int64_t t0 = 0, t1 = tasks;                                                           \
            amx_thread_share(tasks, &t0, &t1);                                                    \
            if (t0 < t1) {                                                                        \
                amx_configure();                                                                  \
                amx_range(acc, t0, t1, blocks, group, x, m, ldx, out, ldo, p, e, ACT, KIND);      \
                amx_release();                                                                    \
            }                                                                                     \
        }                                                                                         \
    }

#endif
