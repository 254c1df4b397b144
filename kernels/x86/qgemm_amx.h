/* The AMX compute path of qgemm_vnni.c and gemm_bf16.c (included by each: one library, one
 * packing, one epilogue per family; only the multiply differs).
 *
 * Tiles. TDPBUSD (u8 x s8) / TDPBSSD (s8 x s8) multiply a 16 x 64-byte A tile (16 rows, 64 k)
 * by a 16 x 64-byte B tile holding 16 groups of 4 k for 16 columns, the "VNNI-4" layout, into
 * a 16 x 16 int32 C tile. That B layout is the VNNI kernels' packed panel as it is:
 * panel[q][c][i] = w[n0 + c, 4 q + i], 64 columns (256 bytes) per group q, so the B tile of
 * columns c0 .. c0 + 15 and groups q0 .. q0 + 15 is the 64 bytes at panel + q0 * 256 + 4 c0,
 * 16 rows 256 bytes apart: the AMX path reads the VNNI pre-pack, no second packed copy.
 * The unit of work: 32 rows x 32 columns (a "half" of a 64-column panel) as 2 x 2 C tiles
 * (tmm0-3), two A tiles (tmm4-5, rows i .. i + 15 and i + 16 .. i + 31) and two B tiles
 * (tmm6-7), four tile loads per four dot-product instructions, K in steps of 64 bytes, the sums
 * stored as rows 256 bytes apart into the caller's L1 scratch. Both families run such halves
 * as one stream, each half's epilogue between the next one's K steps: the engine in
 * qgemm_amx_gemm.h, shared by qgemm_vnni.c (int32 sums) and gemm_bf16.c (float32 sums), which
 * differ only in the dot product (AMX_DP_*), the epilogue and the rows past the last block.
 * BF16 (TDPBF16PS, gemm_bf16.c): the same with pairs of bf16 for groups of four bytes: the A
 * tile is 16 rows x 32 k, the B tile 16 pairs x 16 columns (VNNI-2), which is gemm_bf16.c's
 * panel layout (64 columns x 2 bf16 = 256 bytes per pair) read the same way; float32 sums.
 * Per instruction both do 16 x 16 x 64 bytes (16384 int8 or 8192 bf16 multiply-adds), so at the
 * same tile throughput BF16's peak is half int8's in operations, and its tile loads (the same
 * bytes per instruction) weigh the same against it.
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

enum { AMX_MR = 32, AMX_KSTEP = 64 }; /* rows per AMX block; K per tile step (int8) */
/* the tile dot product of a GEMM (qgemm_amx_gemm.h's dp): TDPBUSD, TDPBSSD, TDPBF16PS */
enum { AMX_DP_U8 = 0, AMX_DP_S8 = 1, AMX_DP_BF16 = 2 };

/* A 32 x 32 half whose sums are complete and whose epilogue is still to run: 32 rows x nc
 * (<= 32) int32 or float32 sums at acc (rows 64 values apart), for output rows row .. row + 31
 * and columns col .. col + nc - 1; acc NULL: none. What the engine (qgemm_amx_gemm.h) hands to
 * its includer's epilogue, amx_epi_rows. */
typedef struct {
    const void *acc;
    int64_t row, col, nc;
} amx_pend;

/* One GEMM as the engine (qgemm_amx_gemm.h) sees it, in bytes, not elements: output rows
 * 0 .. m - 1 x columns 0 .. n - 1 from x (rows ldx bytes apart, k4 groups of 4 bytes each) and
 * the packed panels (NR columns x k4 groups, 256 bytes a group). */
typedef struct {
    const char *x;
    int64_t m, ldx;
    const char *packed;
    int64_t n, k4; /* k4: groups of 4 bytes along K, a multiple of 16 (one tile step) */
} amx_gemm_t;

#if PDLKIT_X86
#include <cpuid.h>
#include <ctype.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* avx512bf16 too: gemm_bf16.c's epilogue (vcvtneps2bf16) is inlined into the shared engine */
#define AMX                                                                                      \
    __attribute__((target(                                                                    \
        "amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")))

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

static int amx_probe(void); /* amx_selftest.h: this library's tile code runs and is right */

/* Whether the comma-separated list s has the entry name (given in lower case; the list's entries
 * in any case, with spaces around them). */
__attribute__((unused)) static int amx_named_off(const char *s, const char *name) {
    for (;;) {
        while (*s == ' ' || *s == ',') s++;
        if (*s == '\0') return 0;
        const char *n = name;
        while (*n != '\0' && tolower((unsigned char)*s) == *n) s++, n++;
        while (*s == ' ') s++;
        if (*n == '\0' && (*s == ',' || *s == '\0')) return 1;
        while (*s != ',' && *s != '\0') s++;
    }
}

/* Whether PDLKIT_FEATURES_OFF (runtime_abi/capability.py, which checks its spelling) turns this
 * family's tiles off, as on a CPU without them: an entry "amx" or "amx_tile" (every family), or
 * "amx_bf16" (bf16 = 1) / "amx_int8" (bf16 = 0). Read once. */
__attribute__((unused)) static int amx_turned_off(int bf16) {
    static int state[2] = {-1, -1}; /* -1: not read yet */
    int s = __atomic_load_n(&state[bf16], __ATOMIC_ACQUIRE);
    if (s < 0) {
        const char *v = getenv("PDLKIT_FEATURES_OFF");
        s = v != NULL && (amx_named_off(v, "amx") || amx_named_off(v, "amx_tile") ||
                          amx_named_off(v, bf16 ? "amx_bf16" : "amx_int8"));
        __atomic_store_n(&state[bf16], s, __ATOMIC_RELEASE);
    }
    return s;
}

/* 1 once this process may use the AMX tiles (asked once; later calls read the answer): the CPU
 * has them, Linux grants the tile state, and this build's tile code passes its self-test. */
__attribute__((unused)) static int amx_permitted(void) {
    static int state = -1; /* -1: not asked yet; 0: no; 1: yes */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s >= 0) return s;
    s = amx_cpu(24) && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 &&
        amx_probe();
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
/* GCC 12's tile intrinsics (Debian 12's, the compiler of this project's machines and CI) tell
 * the compiler too little about memory: _tile_loadconfig's operand is 8 bytes, so the stores of
 * a 64-byte configuration past its palette byte were removed as dead (every tile 0 rows:
 * TILEZERO faulted, SIGILL, on a Xeon with AMX), and _tile_loadd names no memory at all, so
 * stores to a buffer it reads (a packed P or V block) could move past it. These two say what
 * they read; GCC 13 and later and clang need no help, and take the same definitions. */
#undef _tile_loadconfig
#undef _tile_loadd
#define _tile_loadconfig(cfg)                                                                  \
    __asm__ volatile("ldtilecfg %0" ::"m"(*(const struct { char b[64]; } *)(cfg)))
#define _tile_loadd(t, base, stride)                                                           \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"((const void *)(base)),              \
                     "r"((long)(stride))                                                       \
                     : "memory")
/* AMX-INT8 (bf16 = 0) or AMX-BF16 (bf16 = 1) may run in this process */
__attribute__((unused)) static int amx_ready_for(int bf16) {
    return amx_cpu(bf16 ? 22 : 25) && !amx_turned_off(bf16) && amx_permitted();
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

/* Palette 1, tiles 0-7 of 16 rows x 64 bytes: what every block of this file uses. A constant,
 * so no compiler can drop its bytes as dead stores (see _tile_loadconfig above). */
#if defined(PDLKIT_AMX_BROKEN_CONFIG) /* tests: what GCC 12 made of it (amx_selftest.h) */
static const amx_cfg_t amx_cfg = {.palette = 1};
#else
static const amx_cfg_t amx_cfg = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};
#endif
AMX __attribute__((noinline)) static void amx_configure(void) { _tile_loadconfig(&amx_cfg); }

AMX __attribute__((noinline)) static void amx_release(void) { _tile_release(); }

#include "amx_selftest.h" /* amx_probe: the tile code of this build, run once under a guard */

/* Emulated builds count the halves run on (emulated) tiles, so that tests see which path ran:
 * pdlkit_amx_gemm_halves(), exported by the library (qgemm_vnni.c's and gemm_bf16.c's each
 * their own). */
#if defined(PDLKIT_AMX_EMULATE)
static int64_t amx_half_count;
__attribute__((visibility("default"), used)) int64_t pdlkit_amx_gemm_halves(void) {
    return __atomic_load_n(&amx_half_count, __ATOMIC_RELAXED);
}
#define AMX_COUNT_HALF() __atomic_fetch_add(&amx_half_count, 1, __ATOMIC_RELAXED)
#else
#define AMX_COUNT_HALF() (void)0
#endif

#else
__attribute__((unused)) static int amx_ready_for(int bf16) { return 0 * bf16; }
__attribute__((unused)) static int amx_ready(void) { return 0; }
#endif

/* Tests and benchmarks: whether this library runs its AMX kernels on tiles in this process (bf16
 * 0: AMX-INT8, 1: AMX-BF16): the CPU has them, Linux granted the tile state and the library's
 * tile code passed its self-test (amx_selftest.h). */
__attribute__((visibility("default"), used)) int pdlkit_amx_tiles(int bf16) {
    return amx_ready_for(bf16);
}

#endif
