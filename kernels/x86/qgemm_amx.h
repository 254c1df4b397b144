/* The AMX compute path of qgemm_vnni.c and gemm_bf16.c (included by each: one library, one
 * packing, one epilogue per family; only the multiply differs).
 *
 * Tiles. TDPBUSD (u8 x s8) / TDPBSSD (s8 x s8) multiply a 16 x 64-byte A tile (16 rows, 64 k)
 * by a 16 x 64-byte B tile holding 16 groups of 4 k for 16 columns, the "VNNI-4" layout, into
 * a 16 x 16 int32 C tile. That B layout is the VNNI kernels' packed panel as it is:
 * panel[q][c][i] = w[n0 + c, 4 q + i], 64 columns (256 bytes) per group q, so the B tile of
 * columns c0 .. c0 + 15 and groups q0 .. q0 + 15 is the 64 bytes at panel + q0 * 256 + 4 c0,
 * 16 rows 256 bytes apart: the AMX path reads the VNNI pre-pack, no second packed copy.
 * The block: 32 rows x 32 columns as 2 x 2 C tiles (tmm0-3), two A tiles (tmm4-5, rows
 * i .. i + 15 and i + 16 .. i + 31) and two B tiles (tmm6-7), four tile loads per four
 * dot-product instructions (16384 multiply-adds each), K in steps of 64, the sums stored as
 * int32 rows 64 apart into the caller's L1 scratch. The int8 GEMMs run such halves as a stream,
 * each half's epilogue between the next one's K steps (qgemm_amx_gemm.h); the BF16 kernel runs
 * a 32 x 64 block (one panel: two halves) at a time (AMX_BLOCK below) and then its epilogue.
 * BF16 (TDPBF16PS, gemm_bf16.c): the same with pairs of bf16 for groups of four bytes: the A
 * tile is 16 rows x 32 k, the B tile 16 pairs x 16 columns (VNNI-2), which is gemm_bf16.c's
 * panel layout (64 columns x 2 bf16 = 256 bytes per pair) read the same way; float32 sums.
 *
 * The OS. Linux hands out the AMX tile state only to processes that ask for it:
 * arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18), asked once per process
 * (amx_ready); where the CPU lacks AMX (cpuid) or the kernel refuses, amx_ready is 0 and every
 * call runs the VNNI path instead (same packed weight, same results). Each thread loads the
 * tile configuration (palette 1, eight 16 x 64-byte tiles) at the start of its share of a call
 * and releases the tiles at its end (other code, oneDNN's, may configure them differently
 * between calls).
 *
 * Portability: the functions carry target("amx-tile,amx-int8") attributes (GCC emits the tile
 * instructions as inline assembly), so the library builds and loads on any x86-64 host and runs
 * them only where amx_ready said so. */

#ifndef PDLKIT_QGEMM_AMX_H
#define PDLKIT_QGEMM_AMX_H

enum { AMX_MR = 32, AMX_KSTEP = 64 }; /* rows per AMX block; K per tile step */

#if PDLKIT_X86
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX                                                                                      \
    __attribute__((target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512vnni")))

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* cpuid leaf 7, EDX: bit 24 AMX-TILE, 25 AMX-INT8, 22 AMX-BF16. cpuid is asked once per process
 * and its EDX kept: it is a serializing instruction (~100+ cycles, far more under a hypervisor
 * that traps it), and amx_ready runs on every GEMM call. */
static int amx_cpu(int bit) {
    static int64_t edx = -1; /* -1: not asked yet */
    int64_t d = __atomic_load_n(&edx, __ATOMIC_ACQUIRE);
    if (d < 0) {
        unsigned a, b, c, e = 0;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &e)) e = 0;
        d = (int64_t)e;
        __atomic_store_n(&edx, d, __ATOMIC_RELEASE);
    }
    return (d >> 24 & 1) && (d >> bit & 1);
}

/* 1 once this process may use the AMX tiles (asked once; later calls read the answer) */
__attribute__((unused)) static int amx_permitted(void) {
    static int state = -1; /* -1: not asked yet; 0: no; 1: yes */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s >= 0) return s;
    s = amx_cpu(24) && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    return s;
}

#if defined(PDLKIT_AMX_EMULATE)
/* Tests only (tests/test_x86_amx.py builds the library with -DPDLKIT_AMX_EMULATE): the tile
 * instructions in plain C on per-thread arrays, so that a host without AMX runs everything the
 * AMX path does around them (blocking, K chunks, panel groups, tails, threads, epilogue). */
static __thread union {
    uint8_t b[64];
    int32_t i[16];
    float f[16];
} emu_tile[8][16];
static void emu_load(int t, const char *base, int64_t stride) {
    for (int r = 0; r < 16; r++) memcpy(emu_tile[t][r].b, base + r * stride, 64);
}
static void emu_store(int t, char *base, int64_t stride) {
    for (int r = 0; r < 16; r++) memcpy(base + r * stride, emu_tile[t][r].b, 64);
}
static float emu_bf16(const uint8_t *p) {
    uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* kind 0: u8 x s8, 1: s8 x s8, 2: bf16 pairs into float32 */
static void emu_dp(int c, int a, int b, int kind) {
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++)
            for (int q = 0; q < 16; q++) {
                const uint8_t *x = emu_tile[a][m].b + 4 * q, *w = emu_tile[b][q].b + 4 * n;
                if (kind == 2) {
                    emu_tile[c][m].f[n] += emu_bf16(x) * emu_bf16(w) + emu_bf16(x + 2) * emu_bf16(w + 2);
                    continue;
                }
                int32_t s = 0;
                for (int i = 0; i < 4; i++) s += (kind ? (int8_t)x[i] : x[i]) * (int8_t)w[i];
                emu_tile[c][m].i[n] = (int32_t)((uint32_t)emu_tile[c][m].i[n] + (uint32_t)s);
            }
}
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbusd
#undef _tile_dpbssd
#undef _tile_dpbf16ps
#define _tile_zero(t) memset(emu_tile[t], 0, sizeof emu_tile[t])
#define _tile_loadd(t, base, stride) emu_load(t, (const char *)(base), stride)
#define _tile_stored(t, base, stride) emu_store(t, (char *)(base), stride)
#define _tile_dpbusd(c, a, b) emu_dp(c, a, b, 0)
#define _tile_dpbssd(c, a, b) emu_dp(c, a, b, 1)
#define _tile_dpbf16ps(c, a, b) emu_dp(c, a, b, 2)
#define _tile_loadconfig(cfg) (void)(cfg)
#define _tile_release() (void)0
__attribute__((unused)) static int amx_ready_for(int bf16) { return 1 + 0 * bf16; }
#else
/* AMX-INT8 (bf16 = 0) or AMX-BF16 (bf16 = 1) may run in this process */
__attribute__((unused)) static int amx_ready_for(int bf16) {
    return amx_cpu(bf16 ? 22 : 25) && amx_permitted();
}
#endif
__attribute__((unused)) static int amx_ready(void) { return amx_ready_for(0); }

typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) amx_cfg_t;

/* Palette 1, tiles 0-7 of 16 rows x 64 bytes: what every block of this file uses. */
AMX __attribute__((noinline)) static void amx_configure(void) {
    amx_cfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}

AMX __attribute__((noinline)) static void amx_release(void) { _tile_release(); }

/* acc[r * 64 + c] (r < 32, c < 64; int32, or float32 for bf16) (+)= sum_k x[r, k] w[n0 + c, k]
 * over groups q0 .. q1 - 1 of 4 bytes of one packed panel (q1 - q0 a multiple of 16), x rows
 * ldx bytes apart: first = 1 starts from zero, else adds to acc (a chunk of K after another);
 * DP: the tile dot product (_tile_dpbf16ps: gemm_bf16.c's). */
#define AMX_BLOCK(NAME, DP)                                                                    \
    AMX __attribute__((noinline, unused)) static void NAME(                                     \
        const void *x, int64_t ldx, int64_t q0, int64_t q1, const void *panel, void *acc,       \
        int first) {                                                                            \
        const char *xa = (const char *)x, *xb = xa + 16 * ldx;                                   \
        for (int h = 0; h < 2; h++) {                                                            \
            const char *b = (const char *)panel + h * 32 * 4;                                    \
            char *c = (char *)acc + h * 32 * 4;                                                  \
            if (first) {                                                                         \
                _tile_zero(0);                                                                   \
                _tile_zero(1);                                                                   \
                _tile_zero(2);                                                                   \
                _tile_zero(3);                                                                   \
            } else {                                                                             \
                _tile_loadd(0, c, 256);                                                          \
                _tile_loadd(1, c + 64, 256);                                                     \
                _tile_loadd(2, c + 16 * 256, 256);                                               \
                _tile_loadd(3, c + 16 * 256 + 64, 256);                                          \
            }                                                                                    \
            for (int64_t q = q0; q < q1; q += 16) {                                              \
                _tile_loadd(4, xa + 4 * q, ldx);                                                 \
                _tile_loadd(6, b + q * 256, 256);                                                \
                _tile_loadd(7, b + q * 256 + 64, 256);                                           \
                DP(0, 4, 6);                                                                     \
                DP(1, 4, 7);                                                                     \
                _tile_loadd(5, xb + 4 * q, ldx);                                                 \
                DP(2, 5, 6);                                                                     \
                DP(3, 5, 7);                                                                     \
            }                                                                                    \
            _tile_stored(0, c, 256);                                                             \
            _tile_stored(1, c + 64, 256);                                                        \
            _tile_stored(2, c + 16 * 256, 256);                                                  \
            _tile_stored(3, c + 16 * 256 + 64, 256);                                             \
        }                                                                                        \
    }
AMX_BLOCK(amx_block_bf16, _tile_dpbf16ps)

#else
__attribute__((unused)) static int amx_ready_for(int bf16) { return 0 * bf16; }
__attribute__((unused)) static int amx_ready(void) { return 0; }
#endif

#endif
