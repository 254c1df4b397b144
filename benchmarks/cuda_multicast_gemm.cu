// A decode GEMM for Hopper that shares the activation tile between the CTAs of a cluster
// (issue 23, item 3): C[M, N] (bf16) = (A[M, K] int8 . W[N, K]^T int8) * sa[M] * sw[N], M <= 64.
//
// Probe only (benchmarks/cuda_multicast_probe.py builds it with nvcc for sm_90a and launches it
// with CuPy). It asks whether a hand-written Hopper kernel (bulk copies into shared memory, a
// producer warp, wgmma) takes the 16-64-row o and down projections to 80% of the copy rate where
// the Triton loop does not (benchmarks/results/cuda_decode_probe_h200_047065e.md), and in
// particular whether sending each K step's activation tile once per cluster
// (cp.async.bulk ... .multicast::cluster) instead of once per CTA gets it there. Answers, with
// figures: benchmarks/results/cuda_multicast_probe_h200_dd95b4a.md.
//
// Layout (packed by the probe, as pdlkit packs weights ahead of time): every operand tile of
// R rows x BK bytes is stored as wgmma's K-major, unswizzled core matrices, 8 rows x 16 bytes
// each (128 contiguous bytes), row blocks outer: byte (r, k) of a tile sits at
// ((r / 8) * (BK / 16) + k / 16) * 128 + (r % 8) * 16 + k % 16. A K step's tile is then one
// contiguous run of bytes: one bulk copy, no tensor map. W: [N / BN][K / BK][BN x BK];
// A: [K / BK][MR x BK], MR = M rounded up to 8 (rows past M are never stored).
//
// One CTA (gemm): a consumer warpgroup (warps 0-3: wgmma m64nBNk32, int32 sums in registers, the
// epilogue) and a producer warp (warp 4, one thread: the bulk copies). STAGES buffers, each
// with a "full" barrier (the copies' bytes arrive there) and an "empty" barrier (every
// consumer warp of every CTA of the cluster arrives there once it has read the buffer, since
// each CTA's producer multicasts its share of the activation tile into all of them).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace cg = cooperative_groups;

// every kernel's parameters: A [M, K] and W [N, K] int8 packed (see the header), the scales per
// row of A and per row of W, C [M, N] bf16, and K's steps of BK bytes
#define GEMM_PARAMS                                                                                   \
    const int8_t *__restrict__ a, const int8_t *__restrict__ w, const float *__restrict__ sa,         \
        const float *__restrict__ sw, __nv_bfloat16 *__restrict__ c, int M, int N, int KT

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n\t.reg .pred P1;\n"
        "LAB_WAIT:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
        "@P1 bra DONE;\n\t"
        "bra LAB_WAIT;\n"
        "DONE:\n\t}" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

// arrive on the barrier at the same shared-memory offset in cluster CTA `cta` (RELEASE: with
// release semantics at cluster scope; else the default, release at CTA scope)
template <bool RELEASE>
__device__ __forceinline__ void mbar_arrive_in(uint64_t* bar, uint32_t cta) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(cta));
    if (RELEASE)
        asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote)
                     : "memory");
    else
        asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy, bool hint) {
    if (hint)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
            " [%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
            "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
            : "memory");
    else
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
            "l"(src), "r"(bytes), "r"(smem_u32(bar))
            : "memory");
}

// the same bytes into the same offset of every CTA in `mask`, each CTA's barrier at `bar`'s offset
__device__ __forceinline__ void bulk_multicast(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                               uint16_t mask) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar)), "h"(mask)
        : "memory");
}

__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// wgmma shared-memory descriptor: unswizzled, LBO between core matrices along K, SBO along M/N
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32);
}

__device__ __forceinline__ void fence_regs(int32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

template <int BN>  // BN columns: the variants below use 32
__device__ __forceinline__ void wgmma_s8(int32_t (&d)[BN / 2], uint64_t da, uint64_t db);

template <>
__device__ __forceinline__ void wgmma_s8<32>(int32_t (&d)[16], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, 1, 0;\n\t"
        "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p;\n\t}"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
          "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
          "+r"(d[14]), "+r"(d[15])
        : "l"(da), "l"(db));
}

// the m64nBN int32 fragment, scaled per row and column, as bf16: warp w holds rows 16w + lane/4
// (+8), columns 8j + 2(lane%4) (+1); rows from M on are not stored
template <int BN>
__device__ __forceinline__ void store_tile(const int32_t (&acc)[BN / 2], const float* __restrict__ sa,
                                           const float* __restrict__ sw, __nv_bfloat16* __restrict__ c,
                                           int M, int N, int n0) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = 16 * warp + lane / 4 + 8 * h, col = n0 + 8 * j + 2 * (lane % 4);
            if (row < M) {
                const float s = sa[row];
                __nv_bfloat162 v = __floats2bfloat162_rn(acc[4 * j + 2 * h] * s * sw[col],
                                                         acc[4 * j + 2 * h + 1] * s * sw[col + 1]);
                *reinterpret_cast<__nv_bfloat162*>(c + (size_t)row * N + col) = v;
            }
        }
}

// the bytes of one K step's activation tile: M rows rounded up to a core matrix's 8
__device__ __forceinline__ uint32_t act_tile_bytes(int M, int BK) { return (M + 7) / 8 * 8 * BK; }

// one K step (BK bytes) of wgmma m64nBNk32 on the buffers at a0 (activations) and b0 (weights)
template <int BN, int BK>
__device__ __forceinline__ void mma_step(int32_t (&acc)[BN / 2], uint32_t a0, uint32_t b0) {
    const uint32_t lbo = 128, sbo = BK * 8;  // PTX's reading, checked (swapped: wrong sums)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fence_regs(acc[i]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BK / 32; ++kk)  // 32 bytes of K: two core matrices along K
        wgmma_s8<BN>(acc, smem_desc(a0 + kk * 256, lbo, sbo), smem_desc(b0 + kk * 256, lbo, sbo));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) fence_regs(acc[i]);
}

template <int BN, int BK, int STAGES, int CLUSTER, bool LOAD_A, bool HINT, int ARRIVE, bool KOUTER, int PF>
__device__ __forceinline__ void gemm(GEMM_PARAMS) {
    extern __shared__ __align__(1024) uint8_t smem[];
    constexpr int A_TILE = 64 * BK, W_TILE = BN * BK;
    uint8_t* sa_tiles = smem;
    uint8_t* sw_tiles = smem + STAGES * A_TILE;
    uint64_t* full = reinterpret_cast<uint64_t*>(sw_tiles + STAGES * W_TILE);
    uint64_t* empty = full + STAGES;
    const int tid = threadIdx.x;
    const uint32_t a_bytes = LOAD_A ? act_tile_bytes(M, BK) : 0;
    const uint32_t rank = CLUSTER > 1 ? cg::this_cluster().block_rank() : 0;
    const int tile = blockIdx.x;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4 * CLUSTER);  // every consumer warp of the cluster
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (CLUSTER > 1)
        cg::this_cluster().sync();
    else
        __syncthreads();
    int32_t acc[BN / 2];
    if (tid >= 128) {  // the producer warp
        if (tid == 128) {
            const uint64_t policy = evict_first_policy();
            // KOUTER: W packed [K / BK][N / BN][tile], so that at one K step the CTAs read one run
            const size_t w_step = KOUTER ? (size_t)gridDim.x * W_TILE : W_TILE;
            const int8_t* wsrc = w + (KOUTER ? (size_t)tile * W_TILE : (size_t)tile * KT * W_TILE);
            const uint32_t piece = a_bytes / CLUSTER;
            for (int k = 0; k < KT; ++k) {
                const int s = k % STAGES;
                if (PF > 0 && k == 0)  // PF: the first weight steps past the ring into L2 ahead
                    for (int p = STAGES; p < STAGES + PF && p < KT; ++p) prefetch_l2(wsrc + p * w_step, W_TILE);
                if (PF > 0 && k >= STAGES && k + PF < KT) prefetch_l2(wsrc + (k + PF) * w_step, W_TILE);
                if (k >= STAGES) mbar_wait(&empty[s], ((k / STAGES) - 1) & 1);
                mbar_expect_tx(&full[s], W_TILE + a_bytes);
                bulk_copy(sw_tiles + s * W_TILE, wsrc + k * w_step, W_TILE, &full[s], policy, HINT);
                if (LOAD_A) {
                    const int8_t* asrc = a + (size_t)k * a_bytes + rank * piece;
                    if (CLUSTER == 1)
                        bulk_copy(sa_tiles + s * A_TILE, asrc, a_bytes, &full[s], policy, false);
                    else
                        bulk_multicast(sa_tiles + s * A_TILE + rank * piece, asrc, piece, &full[s],
                                       (uint16_t)((1u << CLUSTER) - 1));
                }
            }
        }
    } else {  // the consumer warpgroup
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
        for (int k = 0; k < KT; ++k) {
            const int s = k % STAGES;
            mbar_wait(&full[s], (k / STAGES) & 1);
            mma_step<BN, BK>(acc, smem_u32(sa_tiles + s * A_TILE), smem_u32(sw_tiles + s * W_TILE));
            if ((tid & 31) == 0)  // buffer s read by this warp
                for (int r = 0; r < CLUSTER; ++r) {
                    if (CLUSTER == 1)
                        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&empty[s]))
                                     : "memory");
                    else
                        mbar_arrive_in<ARRIVE == 0>(&empty[s], r);
                }
        }
    }
    if (tid < 128) {
        store_tile<BN>(acc, sa, sw, c, M, N, tile * BN);
    }
    if (CLUSTER > 1) cg::this_cluster().sync();  // no CTA leaves while others may still signal it
}

// The same GEMM, one CTA a column tile, without a cluster, but with two rings: the weights (from
// HBM) in WS buffers and the activations (from L2, read by every CTA) in AS, each with its own
// producer thread (warp 4: weights, warp 5: activations), so that the weights run further ahead
// than the shared memory of equal rings allows (AS < WS).
template <int BN, int BK, int WS, int AS, bool LOAD_A>
__device__ __forceinline__ void gemm_rings(GEMM_PARAMS) {
    extern __shared__ __align__(1024) uint8_t smem[];
    constexpr int A_TILE = 64 * BK, W_TILE = BN * BK;
    // shared memory: AS activation tiles, WS weight tiles, then the barriers, full before empty
    uint8_t *a_ring = smem, *w_ring = smem + AS * A_TILE;
    uint64_t* bars = reinterpret_cast<uint64_t*>(w_ring + WS * W_TILE);
    uint64_t *w_full = bars, *w_empty = bars + WS, *a_full = bars + 2 * WS, *a_empty = a_full + AS;
    const int tid = threadIdx.x;
    const uint32_t a_bytes = act_tile_bytes(M, BK);
    if (tid == 0) {
        for (int s = 0; s < WS; ++s) mbar_init(&w_full[s], 1), mbar_init(&w_empty[s], 4);
        for (int s = 0; s < AS; ++s) mbar_init(&a_full[s], 1), mbar_init(&a_empty[s], 4);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid == 128) {  // the weights' producer
        const uint64_t policy = evict_first_policy();
        const int8_t* src = w + (size_t)blockIdx.x * KT * W_TILE;
        for (int k = 0; k < KT; ++k) {
            const int s = k % WS;
            if (k >= WS) mbar_wait(&w_empty[s], ((k / WS) - 1) & 1);
            mbar_expect_tx(&w_full[s], W_TILE);
            bulk_copy(w_ring + s * W_TILE, src + (size_t)k * W_TILE, W_TILE, &w_full[s], policy, true);
        }
    } else if (tid == 160 && LOAD_A) {  // the activations' producer
        for (int k = 0; k < KT; ++k) {
            const int s = k % AS;
            if (k >= AS) mbar_wait(&a_empty[s], ((k / AS) - 1) & 1);
            mbar_expect_tx(&a_full[s], a_bytes);
            bulk_copy(a_ring + s * A_TILE, a + (size_t)k * a_bytes, a_bytes, &a_full[s], 0, false);
        }
    } else if (tid < 128) {  // the consumer warpgroup
        int32_t acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
        for (int k = 0; k < KT; ++k) {
            const int s = k % WS, t = k % AS;
            mbar_wait(&w_full[s], (k / WS) & 1);
            if (LOAD_A) mbar_wait(&a_full[t], (k / AS) & 1);
            mma_step<BN, BK>(acc, smem_u32(a_ring + t * A_TILE), smem_u32(w_ring + s * W_TILE));
            if ((tid & 31) == 0) {
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&w_empty[s])) : "memory");
                if (LOAD_A)
                    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(&a_empty[t]))
                                 : "memory");
            }
        }
        store_tile<BN>(acc, sa, sw, c, M, N, blockIdx.x * BN);
    }
}

// The same GEMM loaded Ampere-style: the four warps of the consumer warpgroup copy each K step's
// tiles themselves, 16 bytes a thread at a time (cp.async.cg, the weights with the evict-first
// hint where HINT), STAGES - 1 steps ahead, and wait for them with cp.async's groups: no producer
// warp, no mbarrier, no bulk copy engine (does the weights' stream go faster as many small
// copies, as the read floor's loads are?).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, uint64_t policy, bool hint) {
    if (hint)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)),
                     "l"(src), "l"(policy)
                     : "memory");
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}

template <int BN, int BK, int STAGES, bool HINT>
__device__ __forceinline__ void gemm_cpasync(GEMM_PARAMS) {
    extern __shared__ __align__(1024) uint8_t smem[];
    constexpr int A_TILE = 64 * BK, W_TILE = BN * BK;
    uint8_t *a_ring = smem, *w_ring = smem + STAGES * A_TILE;
    const int tid = threadIdx.x;
    const uint32_t a_bytes = act_tile_bytes(M, BK);
    const int8_t* wsrc = w + (size_t)blockIdx.x * KT * W_TILE;
    const uint64_t policy = evict_first_policy();
    auto load = [&](int k) {  // K step k into buffer k % STAGES, then one commit group
        if (k < KT) {
            const int s = k % STAGES;
            for (int i = tid; i < W_TILE / 16; i += 128)
                cp_async16(w_ring + s * W_TILE + 16 * i, wsrc + (size_t)k * W_TILE + 16 * i, policy, HINT);
            for (int i = tid; i < (int)a_bytes / 16; i += 128)
                cp_async16(a_ring + s * A_TILE + 16 * i, a + (size_t)k * a_bytes + 16 * i, 0, false);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    int32_t acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
    for (int k = 0; k < STAGES - 1; ++k) load(k);
    for (int k = 0; k < KT; ++k) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");  // step k is in
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to wgmma's reads
        __syncthreads();
        const int s = k % STAGES;
        mma_step<BN, BK>(acc, smem_u32(a_ring + s * A_TILE), smem_u32(w_ring + s * W_TILE));
        __syncthreads();  // buffer (k - 1) % STAGES read by every warp: refill it
        load(k + STAGES - 1);
    }
    store_tile<BN>(acc, sa, sw, c, M, N, blockIdx.x * BN);
}

// entry points, one per variant: mc_<BN>_<BK>_<STAGES>_<CLUSTER>_<LOAD_A>_<HINT>_<ARRIVE>_<KOUTER>
// _<PF>, rings_<BN>_<BK>_<WS>_<AS>_<LOAD_A> and cp_<BN>_<BK>_<STAGES>_<HINT>. ARRIVE: each
// consumer warp arrives on every cluster CTA's empty barrier, 0: with release semantics at
// cluster scope, 1: at CTA scope.
#define VARIANT(BN, BK, ST, CL, LA, H, AR, KO, PF)                                                    \
    extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(160)                      \
        mc_##BN##_##BK##_##ST##_##CL##_##LA##_##H##_##AR##_##KO##_##PF(GEMM_PARAMS) {                 \
        gemm<BN, BK, ST, CL, LA, H, AR, KO, PF>(a, w, sa, sw, c, M, N, KT);                           \
    }
#define RINGS(BN, BK, WS, AS, LA)                                                                     \
    extern "C" __global__ void __launch_bounds__(192) rings_##BN##_##BK##_##WS##_##AS##_##LA(         \
        GEMM_PARAMS) {                                                                                \
        gemm_rings<BN, BK, WS, AS, LA>(a, w, sa, sw, c, M, N, KT);                                    \
    }
#define CPASYNC(BN, BK, ST, H)                                                                        \
    extern "C" __global__ void __launch_bounds__(128) cp_##BN##_##BK##_##ST##_##H(GEMM_PARAMS) {      \
        gemm_cpasync<BN, BK, ST, H>(a, w, sa, sw, c, M, N, KT);                                       \
    }

VARIANT(32, 256, 6, 1, 1, 1, 0, 0, 0)
VARIANT(32, 256, 6, 1, 1, 0, 0, 0, 0)
VARIANT(32, 256, 6, 1, 0, 1, 0, 0, 0)
VARIANT(32, 256, 6, 1, 1, 1, 0, 0, 2)
VARIANT(32, 256, 6, 1, 1, 1, 0, 0, 4)
VARIANT(32, 256, 6, 1, 1, 1, 0, 0, 8)
VARIANT(32, 256, 6, 1, 1, 1, 0, 0, 16)
VARIANT(32, 256, 4, 1, 1, 1, 0, 0, 8)
VARIANT(32, 256, 6, 1, 1, 1, 0, 1, 0)
VARIANT(32, 256, 8, 1, 1, 1, 0, 0, 0)
VARIANT(32, 256, 6, 2, 1, 1, 1, 0, 0)
VARIANT(32, 256, 6, 4, 1, 1, 1, 0, 0)
VARIANT(32, 256, 6, 4, 1, 1, 0, 0, 0)
RINGS(32, 256, 6, 6, 1)
RINGS(32, 256, 16, 4, 1)
CPASYNC(32, 256, 4, 1)
CPASYNC(32, 256, 6, 1)
CPASYNC(32, 256, 6, 0)
CPASYNC(32, 128, 8, 1)
CPASYNC(32, 128, 12, 1)
