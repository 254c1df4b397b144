/* amx_probe: before a library first uses the AMX tiles, it runs its own tile code once on known
 * data (amx_configure, TILEZERO, TILELOADD, TDPBUSD, TDPBF16PS where the CPU has AMX-BF16,
 * TILESTORED, amx_release) and compares the sums with plain C; a fault (SIGILL, SIGSEGV) or a
 * wrong sum means the tiles are not used by this library in this process: every *_amx kernel then
 * runs its VNNI / AVX512_BF16 path on the same packed weights, with the same results, and one
 * line on stderr says why.
 *
 * Why: GCC 12 compiled amx_configure so that every tile had 0 rows (its _tile_loadconfig names 8
 * bytes; qgemm_amx.h now loads a constant): the first TILEZERO faulted and killed the process
 * on every Xeon with AMX whose compiler was GCC 12. What a compiler does to inline assembly is
 * outside this code's control; a kernel that cannot run its tiles must decline them, not crash.
 *
 * The guard: SIGILL and SIGSEGV handlers installed for the probe alone (under a lock, the previous
 * handlers restored after it); a fault on the probing thread jumps back out of the probe, a fault
 * on any other thread meanwhile goes to the handler that was there before (the faulting
 * instruction runs again once it is restored).
 * -DPDLKIT_AMX_BROKEN_CONFIG (tests only) builds qgemm_amx.h's configuration as GCC 12 loaded it
 * (palette 1, every tile 0 x 0), so tests on a host with AMX see the probe fail and the kernels
 * still compute. */

#ifndef PDLKIT_AMX_SELFTEST_H
#define PDLKIT_AMX_SELFTEST_H

#if defined(PDLKIT_AMX_EMULATE)
static int amx_probe(void) { return 1; }
#else
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>

static __thread sigjmp_buf *amx_probe_jump; /* set on the probing thread while it probes */
static volatile sig_atomic_t amx_probe_signal; /* the signal that ended the probe, 0: none */
static struct sigaction amx_probe_old[2];      /* SIGILL's and SIGSEGV's handlers before it */

static void amx_probe_trap(int sig, siginfo_t *info, void *ctx) {
    (void)info, (void)ctx;
    if (amx_probe_jump != NULL) {
        amx_probe_signal = sig;
        siglongjmp(*amx_probe_jump, 1);
    }
    sigaction(sig, &amx_probe_old[sig == SIGSEGV], NULL); /* another thread's fault: theirs */
}

/* 16 x 64 bytes of A (rows of x) and B (a VNNI-4 / VNNI-2 tile): small values whose products
 * and sums are exact in int32 and in float32 (bf16 holds integers up to 256 exactly). */
static void amx_probe_data(uint8_t *a, uint8_t *b, int bf16) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 64; c += 1 + bf16) {
            const int va = (r * 7 + c) % 5, vb = (r * 3 + c * 5) % 7 - 3;
            if (!bf16) {
                a[r * 64 + c] = (uint8_t)va, b[r * 64 + c] = (uint8_t)(int8_t)vb;
                continue;
            }
            const float fa = (float)va, fb = (float)vb;
            uint32_t ua, ub;
            memcpy(&ua, &fa, 4), memcpy(&ub, &fb, 4);
            a[r * 64 + c] = (uint8_t)(ua >> 16), a[r * 64 + c + 1] = (uint8_t)(ua >> 24);
            b[r * 64 + c] = (uint8_t)(ub >> 16), b[r * 64 + c + 1] = (uint8_t)(ub >> 24);
        }
}

/* One element of the probe's data as a number: a u8 / s8 byte, or the bf16 at that byte. */
static float amx_probe_value(const uint8_t *p, int bf16, int is_signed) {
    if (!bf16) return is_signed ? (float)(int8_t)*p : (float)*p;
    const uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The sums the tiles must give, from the bytes they loaded: c[m][n] = sum over the 64 bytes of
 * row m of A against column n of B (4 u8 x s8 per group, or 2 bf16 per pair); exact either way. */
static int amx_probe_right(const uint8_t *a, const uint8_t *b, const void *c, int bf16) {
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float want = 0;
            for (int q = 0; q < 16; q++)
                for (int i = 0; i < 4; i += 1 + bf16)
                    want += amx_probe_value(a + m * 64 + 4 * q + i, bf16, 0) *
                            amx_probe_value(b + q * 64 + 4 * n + i, bf16, 1);
            const float got = bf16 ? ((const float *)c)[m * 16 + n]
                                   : (float)((const int32_t *)c)[m * 16 + n];
            if (got != want) return 0;
        }
    return 1;
}

AMX __attribute__((noinline)) static void amx_probe_run(const uint8_t *a, const uint8_t *b,
                                                        void *c, int bf16) {
    amx_configure();
    _tile_zero(0);
    _tile_loadd(4, a, 64);
    _tile_loadd(6, b, 64);
    if (bf16)
        _tile_dpbf16ps(0, 4, 6);
    else
        _tile_dpbusd(0, 4, 6);
    _tile_stored(0, c, 64);
    amx_release();
}

/* Runs the probe of one kind (0: int8, 1: bf16) under the guard: 1 right, 0 wrong sums, -1 a
 * fault (amx_probe_signal says which). */
static int amx_probe_kind(int bf16) {
    static uint8_t a[1024] __attribute__((aligned(64))), b[1024] __attribute__((aligned(64)));
    static int32_t c[256] __attribute__((aligned(64)));
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1) != 0) {
        amx_probe_jump = NULL;
        return -1;
    }
    amx_probe_jump = &jump;
    amx_probe_data(a, b, bf16);
    amx_probe_run(a, b, c, bf16);
    amx_probe_jump = NULL;
    return amx_probe_right(a, b, c, bf16);
}

/* 1 where this build's tile code ran right for int8 (and bf16, where the CPU has AMX-BF16). */
static int amx_probe(void) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    struct sigaction trap;
    memset(&trap, 0, sizeof trap);
    trap.sa_sigaction = amx_probe_trap;
    trap.sa_flags = SA_SIGINFO;
    sigemptyset(&trap.sa_mask);
    pthread_mutex_lock(&lock);
    sigaction(SIGILL, &trap, &amx_probe_old[0]);
    sigaction(SIGSEGV, &trap, &amx_probe_old[1]);
    int kind = 0, result = 1;
    for (; kind <= amx_cpu(22) && result == 1; kind++) result = amx_probe_kind(kind);
    sigaction(SIGILL, &amx_probe_old[0], NULL);
    sigaction(SIGSEGV, &amx_probe_old[1], NULL);
    pthread_mutex_unlock(&lock);
    if (result == 1) return 1;
    const char *what = result < 0 ? (amx_probe_signal == SIGILL ? "faulted (SIGILL)"
                                                                 : "faulted (SIGSEGV)")
                                  : "gave wrong sums";
    fprintf(stderr,
            "pdlkit: this kernel library's AMX %s tile code %s in its self-test; its AMX kernels "
            "run their AVX-512 path instead (kernels/x86/amx_selftest.h)\n",
            kind - 1 ? "bf16" : "int8", what);
    return 0;
}
#endif

#endif
