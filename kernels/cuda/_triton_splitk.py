"""Decode-shaped int8 GEMMs (M from 1 to a few hundred rows): stream the int8 weights once.

With few rows a GEMM is a pass over its weights: 64 x 4096 x 4096 moves 16 MB of int8
weights and does 2.1 GOP, 5.6 us at the H100's 3.0 TB/s against about 2 us of tensor-core
work. The tiled GEMM in ``_triton_gemm.py`` gives each program a 64 x 128 tile, so N = 4096
makes 32 programs for 132 SMs, and most of the memory system idles. Here a program owns BN
output columns (16 to 128) for BM rows (16 to 128), walking K in 256-wide steps with up to six
loads of weights in flight. Each program also re-reads its BM x K activation rows from L2, so
past 16 rows ``pick_split_config`` takes the widest BN that still leaves about 96 tiles.
Measured on an H100 as a decode step runs them (a CUDA graph of back-to-back calls over
weights L2 does not hold; benchmarks/results/cuda_decode.md), a call costs about 3 us over
its weights' bytes at the copy rate: the large GEMMs stream at 80-91% of the copy rate up to
64 rows, a 16 MB one (4096 x 4096) at 61-66%, and BF16 cuBLAS takes 1.6-2x as long.

K can also be split over programs (grid (M / BM, N / BN, SPLIT_K)) without losing
determinism: each slice stores its int32 partial sums in a block of its own in a workspace
and bumps the tile's counter; the slice that finds the counter at SPLIT_K - 1 adds the
blocks in slice order, resets the counter and runs the epilogue. The counters start zeroed
(``torch.zeros`` per call, one small fill that Inductor launches with the kernel).
``pick_split_config`` splits where the tiles are too few for an eighth of the SMs.

Both int8 logical ops use it: ``int8_linear`` (one weight) and ``int8_gated_silu`` (gate and
up weights share the activation tiles). The per-token quantization of the activations is
its own kernel (``quantize_per_token``, M x K bytes), except for one row (``quantize=``,
``QUANT_A``): then every program first quantizes the row itself (K floats read twice from L2,
K int8 codes stored, the same bytes by every program, read back by its K loop as usual): one
launch where there were two, for a decode step of one sequence, host-bound without CUDA
graphs. For more rows each program would quantize every row (2 x M x K bytes a program:
a 64-row activation is 512 KB at K = 4096, eight times the program's share of the weights);
a first version that quantized a [16, BK] tile in each K step took 0.94 ms of GPU time for
the Llama-3 decode step of one sequence on an H200, where the two launches took 0.20. Codes
made in registers from each K step's floats (row 0 of the dot's A tile, no row stored) cost
that step 20 us more than the two launches (215 against 195 us, H200, 2026-11-29); the stored
row, its two passes unrolled, 12 us more (208 against 196).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from pdlkit.kernels.cuda._common import INTERPRET, fit_stages
from pdlkit.kernels.cuda._triton_gemm import _RNE, _sms, quotient
from pdlkit.runtime_abi.triton_binding import launch, size_hint


@dataclass(frozen=True)
class SplitConfig:
    bm: int
    bn: int
    bk: int
    split_k: int
    warps: int
    stages: int
    swap: bool = False  # weight-only: the widened weight is the dot's first operand


_TILES = 96  # row x column tiles the widest BN must still leave (the sweep's winners)


def _tile(m: int, n: int, gated: bool) -> tuple[int, int]:
    """(BM, BN) for M rows and N output columns (a gated pair's N once; Q, K, V's summed).
    Up to 16 rows, 32 columns a program (64 for a gated pair wider than 12288). Above, the
    widest BN, with BM 128 past 64 rows, that leaves ``_TILES`` tiles: each program re-reads
    its BM x K activation rows from L2 (with BN 16 at M = 64, four times the weights' bytes),
    so wider tiles cut that traffic while enough programs keep HBM busy."""
    bm = min(64, max(16, triton.next_power_of_2(m)))
    if m <= 16:
        return bm, 64 if gated and n > 12288 else 32
    # (a gated pair's BM 128 or BN 128 needs more shared memory than an SM has)
    for tm in (128, bm) if m > 64 and not gated else (bm,):
        for bn in (64, 32) if gated else (128, 64, 32):
            if triton.cdiv(n, bn) * triton.cdiv(m, tm) >= _TILES:
                return tm, bn
    return bm, 16


def _config(bm: int, bn: int, split: int, gated: bool) -> SplitConfig:
    """Warps and pipeline depth by tile width, as measured: 32 columns (one weight) six
    K steps in flight, 128 columns eight warps and three stages (shared memory), else four.
    A gated pair's 64 x 64 tiles step K by 128 (96 KB of shared memory: two programs an SM,
    every program of Llama-3's 64-row pair resident at once; 33.4 against 35.5 us by 256 on
    an H200, benchmarks/results/cuda_decode_h200_m64_8d9c60b.md), other tiles by 256."""
    warps, stages = (8, 3) if bn >= 128 else (4, 6) if bn == 32 and not gated else (4, 4)
    bk = 128 if gated and bm >= 64 and bn == 64 else 256
    return SplitConfig(bm, bn, bk, split, warps, stages)


def pick_split_config(m: int, n: int, k: int, gated: bool, sms: int = 132) -> SplitConfig:
    """Tiles measured on an H100 (benchmarks/cuda_decode.py --sweep, M = 1, 16, 64, 256 at the
    Llama-2-7B and Llama-3 GQA shapes, benchmarks/results/cuda_decode.md) and at 64 rows on an
    H200: ``_tile``'s BM and BN, ``_config``'s BK; one K slice, since splitting K lost at every
    shape measured (with atomic partial sums by 1.1x to 5x; with stored ones, H200, 64 rows:
    Llama-3's down 21.4 against 20.4 us, o 10.4 against 7.9, gate/up 45 against 33), unless
    there are too few tiles to occupy an eighth of the SMs. Two slices do halve the activation
    bytes each program re-reads from L2 (1.4-2.7 us of a one-slice down projection), but
    adding the slices' sums costs 2.2-2.4 us at 64 rows, by a counter, flags or atomic adds
    alike (H200, benchmarks/results/cuda_decode_probe_h200_047065e.md)."""
    if INTERPRET:
        return SplitConfig(16, 16, 32, 2 if k >= 64 else 1, 1, 1)
    m = size_hint(m)  # a symbolic M by its hint: no guard on it
    bm, bn = _tile(m, n, gated)
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    split = 1
    while tiles * split < sms // 8 and k // (256 * split * 2) >= 4:
        split *= 2
    return _config(bm, bn, split, gated)


def pick_grouped_config(m: int, ns: list[int], k: int) -> SplitConfig:
    """Tiles for ``grouped_splitk_kernel`` (Q, K, V in one launch; one K slice a program):
    up to 64 rows, 64 x 64 tiles; where those reach 192 (Llama-2-7B's 3 x 4096 columns) K steps
    of 128 and six in flight, two programs an SM (16.6 us against 18.1 for 64 x 128 tiles,
    H200, cuda_decode_h200_m64_llama2_b90f71e.md), else five K steps of 256 in flight
    (Llama-3's 6144 columns: 9.8-9.9 us against 10.3-10.4 with four, two sweeps)."""
    if INTERPRET:
        return SplitConfig(16, 16, 32, 1, 1, 1)
    m = size_hint(m)  # a symbolic M by its hint: no guard on it
    cfg = _config(*_tile(m, sum(ns), False), 1, False)
    if m > 64 or cfg.bm != 64:
        return cfg
    if triton.cdiv(sum(ns), 64) >= 192:
        return SplitConfig(64, 64, 128, 1, 4, 6)
    return SplitConfig(64, 64, cfg.bk, 1, cfg.warps, 5) if cfg.bn == 64 else cfg


def w8_config(m: int, n: int, k: int, sms: int = 132) -> SplitConfig:
    """Tiles for weight-only calls (bf16 / fp16 activations, int8 weights widened in
    registers), as measured on an H200 (benchmarks/cuda_weight_only.py --sweep: the linears
    of Llama-2-7B and of a Llama-3 GQA layer at 1, 16, 64 and 256 rows,
    benchmarks/results/cuda_weight_only_h200_*.md). Up to 64 rows: 32 columns a program with
    K steps of 256, five in flight, for the 4096 x 4096 and (up to 16 rows) 11008 x 4096
    weights; 64 columns and K steps of 128 for wider or longer ones; K split in four where it
    is over 8192 (the down projections), and until a narrow weight's tiles make 128 programs.
    More rows, for weights 4096 wide or more: 128 x 128 tiles with K steps of 64 for the
    wide ones, 64 x 128 with K split in two for the long ones, else 128 x 64. Past 256 rows
    128-row tiles, 128 or 64 columns, one K slice: for direct calls only, since the weight-only
    kernel widens the weight whole there and calls cuBLAS, 1.3-2.2x faster than these tiles at
    512 and 2048 rows on an H200 (kernels/cuda/weight_only.py). The 128 x 64 tiles put the
    widened weight first in the dot (``swap``): 28.4-28.6 against 29.3-30.0 us for the 4096 x
    4096 weight at 128 and 256 rows; elsewhere swapping won 0-5%, within the runs' spread,
    so the mixed-input gap to BF16 cuBLAS (0.5-0.65x there) is not the dot's operand order
    (benchmarks/results/cuda_weight_only_h200_swap_7bc765e.md)."""
    if INTERPRET:
        return pick_split_config(m, n, k, False, sms)
    m = size_hint(m)  # a symbolic M by its hint: no guard on it
    narrow = SplitConfig(128, 64, 128, 1, 4, 4, swap=True)  # 4096 x 4096 at 128-256 rows: 3-5%
    if m > 256:
        return SplitConfig(128, 128, 64, 1, 4, 4) if n > 8192 else narrow
    if m > 64 and n >= 4096:
        if n > 8192:
            return SplitConfig(128, 128, 64, 1, 4, 4)
        return SplitConfig(64, 128, 64, 2, 4, 4) if k > 8192 else narrow
    bm = min(64, max(16, triton.next_power_of_2(m)))
    wide = n >= 12288 if m <= 16 else n > 4096
    bn = 64 if wide or k > 8192 else 32
    split = 4 if k > 8192 else 1
    while triton.cdiv(n, bn) * triton.cdiv(m, bm) * split < 128 and k // (128 * split * 2) >= 4:
        split *= 2
    if bn == 32 and split == 1:
        return SplitConfig(bm, 32, 256, 1, 4, 5)
    return SplitConfig(bm, bn, 128, split, 4, 6 if bn == 32 else 4)


def tile_stages(cfg: SplitConfig, a_size: int, gated: bool, kernel: str = "splitk_kernel") -> int:
    """``cfg``'s pipeline stages cut to this GPU's shared memory (``fit_stages``): a K step
    holds a BM x BK activation tile of ``a_size``-byte elements and BN x BK int8 weights
    (two such tiles for a gated pair)."""
    stage = cfg.bk * (cfg.bm * a_size + cfg.bn * (1 + gated))
    return fit_stages(cfg.stages, stage, kernel)


@triton.jit
def _epilogue(
    acc, acc_u, rm, rn, c_ptr, stride_cm, a_scale_ptr, b_scale_ptr, u_scale_ptr, bias_ptr, M, N,
    GATED: tl.constexpr, HAS_BIAS: tl.constexpr, res_ptr=None, HAS_RES: tl.constexpr = False,
):  # fmt: skip
    """:func:`_epilogue_sa` with the activation scales read from ``a_scale_ptr``."""
    sa = tl.load(a_scale_ptr + rm, mask=rm < M, other=0.0)
    _epilogue_sa(
        acc, acc_u, sa, rm, rn, c_ptr, stride_cm, b_scale_ptr, u_scale_ptr, bias_ptr, M, N,
        GATED, HAS_BIAS, res_ptr, HAS_RES,
    )  # fmt: skip


@triton.jit
def _epilogue_sa(
    acc, acc_u, sa, rm, rn, c_ptr, stride_cm, b_scale_ptr, u_scale_ptr, bias_ptr, M, N,
    GATED: tl.constexpr, HAS_BIAS: tl.constexpr, res_ptr, HAS_RES: tl.constexpr,
    ROUND_SB: tl.constexpr = False,
):  # fmt: skip
    """y = acc * sa * sb (+ bias), or silu(gate) * up for a gated pair, cast and stored;
    with a residual (same layout as C), residual + cast(y), added as the model adds two
    tensors of C's dtype (in fp32, rounded once). ``sa``: one float32 scale per row of rm.
    ``ROUND_SB``: the weight scales rounded to C's dtype first (weight-only linears)."""
    cm = rm < M
    cn = rn < N
    sa = sa[:, None]
    sb = tl.load(b_scale_ptr + rn, mask=cn, other=0.0)
    if ROUND_SB:
        sb = sb.to(c_ptr.dtype.element_ty)
    y = acc.to(tl.float32) * sa * sb.to(tl.float32)[None, :]
    if GATED:
        up = acc_u.to(tl.float32) * sa * tl.load(u_scale_ptr + rn, mask=cn, other=0.0)[None, :]
        y = y * tl.sigmoid(y) * up
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rn, mask=cn, other=0.0).to(tl.float32)[None, :]
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :]
    ok = cm[:, None] & cn[None, :]
    y = y.to(c_ptr.dtype.element_ty)
    if HAS_RES:
        res = tl.load(res_ptr + rm[:, None] * stride_cm + rn[None, :], mask=ok, other=0.0)
        y = (res.to(tl.float32) + y.to(tl.float32)).to(c_ptr.dtype.element_ty)
    tl.store(c_ptrs, y, mask=ok)


@triton.jit
def _row_scale(x_ptr, q_eps, q_max, K: tl.constexpr, RB: tl.constexpr):
    """The per-token scale of one float row x[K], as quant_rows_kernel computes it:
    max(amax |x|, q_eps) / q_max, correctly rounded. The row's RB-wide blocks are unrolled
    (K is a constexpr), so their loads go out together: one L2 latency, not one a block."""
    q_eps = tl.cast(q_eps, tl.float32)  # constexprs: the model's constants, rounded once
    q_max = tl.cast(q_max, tl.float32)
    cols = tl.arange(0, RB)
    amax = tl.zeros((RB,), dtype=tl.float32)
    for k0 in tl.static_range(0, K, RB):
        x = tl.load(x_ptr + k0 + cols, mask=k0 + cols < K, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    return tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), q_eps), q_max)


@triton.jit
def _quantize_row(x_ptr, q_ptr, q_eps, q_max, K: tl.constexpr, RB: tl.constexpr):
    """One float row x[K] to int8 codes q[K] (round-half-even of x / s, clamped:
    quant_rows_kernel's), its scale s returned. Every program of the GEMM runs it and stores
    the same bytes; both passes unrolled (their loads go out together, the second from L1)."""
    s = _row_scale(x_ptr, q_eps, q_max, K, RB)
    q_max = tl.cast(q_max, tl.float32)
    cols = tl.arange(0, RB)
    for k0 in tl.static_range(0, K, RB):
        ok = k0 + cols < K
        x = tl.load(x_ptr + k0 + cols, mask=ok, other=0.0).to(tl.float32)
        y = (quotient(x, s) + _RNE) - _RNE
        tl.store(q_ptr + k0 + cols, tl.minimum(tl.maximum(y, -q_max), q_max).to(tl.int8), mask=ok)
    tl.debug_barrier()  # this program's K loop reads the codes its own threads stored
    return s


@triton.jit
def _k_tile(ptrs, ok, kk, K: tl.constexpr, EVEN_K: tl.constexpr):
    """One K step's [rows, BK] int8 tile: ``ok`` masks the rows, ``kk`` the K positions."""
    if EVEN_K:
        return tl.load(ptrs, mask=ok, other=0)
    return tl.load(ptrs, mask=ok & (kk < K)[None, :], other=0)


@triton.jit
def _sums(
    a_ptr, b_ptr, u_ptr, rm, rn, rk, M, N, stride_am, stride_bn,
    K: tl.constexpr, K_SPLIT: tl.constexpr, EVEN_K: tl.constexpr, GATED: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, W8: tl.constexpr = False,
    UPCAST: tl.constexpr = False, SWAP: tl.constexpr = False,
):  # fmt: skip
    """The int32 sums of one K slice (positions rk + k0): A[rm] @ B[rn]^T, and U's for a
    gated pair; up to ``stages`` K steps of loads in flight. ``W8``: A is float (bf16 /
    fp16) and B's int8 tiles are widened to A's dtype in registers: float32 sums. ``UPCAST``
    (Triton's interpreter): both to float32 first, since the interpreter's bf16 dot is wrong
    (NumPy has no bf16; a bf16 weight-only call read 7e8 where 8 was right); their products
    are exact in float32 either way. ``SWAP`` (W8): B^T's sums, B @ A^T, so that the widened
    weight is the dot's first operand, which Hopper's wgmma takes from registers (its second
    must be in shared memory: B widened as the second operand goes back through it)."""
    ACC: tl.constexpr = tl.float32 if W8 else tl.int32
    m_ok = (rm < M)[:, None]
    n_ok = (rn < N)[:, None]
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + rn[:, None] * stride_bn + rk[None, :]
    if GATED:
        u_ptrs = u_ptr + rn[:, None] * stride_bn + rk[None, :]
    acc = tl.zeros((BM, BN), dtype=ACC)
    acc_u = tl.zeros((BM, BN), dtype=ACC)
    acc_t = tl.zeros((BN, BM), dtype=ACC)
    for k0 in range(0, K_SPLIT, BK):
        a = _k_tile(a_ptrs, m_ok, rk + k0, K, EVEN_K)
        b = _k_tile(b_ptrs, n_ok, rk + k0, K, EVEN_K)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        elif W8:
            b = b.to(a.dtype)
        if SWAP:
            acc_t = tl.dot(b, tl.trans(a), acc_t, out_dtype=ACC)
        else:
            acc = tl.dot(a, tl.trans(b), acc, out_dtype=ACC)
        if GATED:
            u = _k_tile(u_ptrs, n_ok, rk + k0, K, EVEN_K)
            acc_u = tl.dot(a, tl.trans(u), acc_u, out_dtype=tl.int32)
            u_ptrs += BK
        a_ptrs += BK
        b_ptrs += BK
    if SWAP:
        acc = tl.trans(acc_t)
    return acc, acc_u


@triton.jit
def _slices_epilogue(
    acc, acc_u, sa, rm, rn, pid_k, c_ptr, ws_ptr, count_ptr, stride_cm, b_scale_ptr,
    u_scale_ptr, bias_ptr, res_ptr, M, N, SPLIT_K: tl.constexpr, GATED: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    W8: tl.constexpr,
):  # fmt: skip
    """SPLIT_K > 1: K slice pid_k of this program's tile stores its sums in a block of its
    own in the workspace; the tile's last slice to count itself in adds the blocks in slice
    order (deterministic) and runs the epilogue. Plain stores and loads: the atomic adds of
    every partial sum they replace took a 64 x 14336 gate/up pair split in two from 36 to
    76 us (H200). ``W8``: float32 sums in a float32 workspace."""
    ACC: tl.constexpr = tl.float32 if W8 else tl.int32
    tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    block = BM * BN * (1 + GATED)
    tiles = tl.num_programs(0) * tl.num_programs(1)
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    part = ws_ptr + (pid_k * tiles + tile).to(tl.int64) * block + offs
    tl.store(part, acc)
    if GATED:
        tl.store(part + BM * BN, acc_u)
    tl.debug_barrier()  # every thread's sums are stored before the counter moves
    done = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    if done == SPLIT_K - 1:  # the last slice of this tile: every block is stored
        acc = tl.zeros((BM, BN), dtype=ACC)
        acc_u = tl.zeros((BM, BN), dtype=ACC)
        for s in tl.static_range(SPLIT_K):  # from L2 (.cg): other SMs wrote them
            blk = ws_ptr + (s * tiles + tile).to(tl.int64) * block + offs
            acc += tl.load(blk, cache_modifier=".cg")
            if GATED:
                acc_u += tl.load(blk + BM * BN, cache_modifier=".cg")
        tl.atomic_xchg(count_ptr + tile, 0)  # zero again for the next call
        _epilogue_sa(
            acc, acc_u, sa, rm, rn, c_ptr, stride_cm, b_scale_ptr, u_scale_ptr, bias_ptr,
            M, N, GATED, HAS_BIAS, res_ptr, HAS_RES, W8,
        )  # fmt: skip


@triton.jit
def splitk_kernel(
    a_ptr, b_ptr, u_ptr, c_ptr, ws_ptr, count_ptr, a_scale_ptr, b_scale_ptr, u_scale_ptr, bias_ptr,
    res_ptr, x_ptr, M, N: tl.constexpr, stride_am, stride_bn: tl.constexpr, stride_cm: tl.constexpr,
    q_eps: tl.constexpr, q_max: tl.constexpr,
    K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    GATED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, QUANT_A: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, RB: tl.constexpr, W8: tl.constexpr,
    UPCAST: tl.constexpr = False, SWAP: tl.constexpr = False,
):  # fmt: skip
    """C[M, N] = epilogue(A[M, K] @ B[N, K]^T) (and U for a gated pair), int8 in, int32
    sums; program (m, n, s) sums K slice s of tile (m, n). ``ws`` holds SPLIT_K > 1's
    partial sums (a BM x BN block per slice and tile, twice for a pair), ``count_ptr`` one
    counter per tile, zero between calls.
    ``QUANT_A`` (one row): A is first quantized from the float row ``x`` (int8, symmetric,
    per token) by every program into ``a`` (the same bytes each time), then read as usual.
    ``W8`` (weight-only): A is bf16 / fp16 activations, B's int8 weights are widened in
    registers, the sums are float32, no activation scale applies and the weight scales are
    rounded to C's dtype before they multiply (as torchao's weight-only linear).
    Pointers a call does not use (U without GATED, the workspace with one slice, ...) come as
    None, and the weights' sizes and strides as constexprs: a launch passes neither (Inductor's
    launcher takes about 0.4 us per argument on an H200's host)."""
    pid_m = tl.program_id(0)  # row tiles of one column tile run side by side: its weights
    pid_n = tl.program_id(1)  # come from HBM once and from L2 for the other row tiles
    pid_k = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = pid_k * K_SPLIT + tl.arange(0, BK)
    if QUANT_A:
        s = _quantize_row(x_ptr, a_ptr, q_eps, q_max, K, RB)
    acc, acc_u = _sums(
        a_ptr, b_ptr, u_ptr, rm, rn, rk, M, N, stride_am, stride_bn,
        K, K_SPLIT, EVEN_K, GATED, BM, BN, BK, W8, UPCAST, SWAP,
    )  # fmt: skip
    if QUANT_A:
        sa = tl.where(rm < M, s, 0.0)
    elif W8:
        sa = tl.full((BM,), 1.0, tl.float32)
    else:
        sa = tl.load(a_scale_ptr + rm, mask=rm < M, other=0.0)
    if SPLIT_K == 1:
        _epilogue_sa(
            acc, acc_u, sa, rm, rn, c_ptr, stride_cm, b_scale_ptr, u_scale_ptr, bias_ptr, M, N,
            GATED, HAS_BIAS, res_ptr, HAS_RES, W8,
        )  # fmt: skip
    else:
        _slices_epilogue(
            acc, acc_u, sa, rm, rn, pid_k, c_ptr, ws_ptr, count_ptr, stride_cm, b_scale_ptr,
            u_scale_ptr, bias_ptr, res_ptr, M, N, SPLIT_K, GATED, HAS_BIAS, HAS_RES, BM, BN, W8,
        )  # fmt: skip


def splitk(
    a: torch.Tensor,
    a_scale: torch.Tensor | None,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    out: torch.Tensor,
    *,
    u: torch.Tensor | None = None,
    u_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    quantize: tuple[float, float] | None = None,
    config: SplitConfig | None = None,
    counters: torch.Tensor | None = None,
    weight_only: bool = False,
) -> torch.Tensor:
    """out = (a @ b.T) * a_scale[:, None] * b_scale (+ bias), or silu(that) * (a @ u.T) * ...
    for a gated pair; a [M, K] and b, u [N, K] int8 with unit inner strides, scales float32;
    ``residual`` (laid out as ``out``) is added to the cast result. ``quantize`` = (eps, qmax),
    one row only: ``a`` is float, and each program quantizes it per token itself (into an
    int8 row every program writes with the same bytes; ``a_scale`` unused): one launch where
    quant_rows and this kernel were two. ``counters``: zeroed int32 tile counters the caller
    keeps (at least a tile's worth; every launch leaves them zero), for K split in slices:
    without them each call zeroes counters of its own (a fill launched before the kernel).
    ``weight_only``: ``a`` is bf16 / fp16 activations (``a_scale`` None), ``b`` int8 weights
    widened in registers: out = (a @ b.T) * b_scale.to(out.dtype) (+ bias), float32 sums,
    ``w8_config``'s tiles."""
    m, k = a.shape
    n = b.shape[0]
    x = a
    if quantize is not None:
        assert m == 1, "quantize= takes one row"
        a = torch.empty((1, k), dtype=torch.int8, device=x.device)
    sms = 0 if INTERPRET else _sms()
    if weight_only:
        assert u is None and quantize is None, "weight_only takes one float activation"
        cfg = config or w8_config(m, n, k, sms)
    else:
        cfg = config or pick_split_config(m, n, k, u is not None, sms)
    gated = u is not None
    stages = tile_stages(cfg, a.element_size(), gated)
    k_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.bk) * cfg.bk
    split = triton.cdiv(k, k_split)  # K slices that hold any of K
    grid_n, grid_m = triton.cdiv(n, cfg.bn), triton.cdiv(m, cfg.bm)
    ws = counts = None  # one K slice: no workspace
    if split > 1:  # a block of sums per slice and tile, and a zeroed counter per tile
        block = cfg.bm * cfg.bn * (1 + gated)
        acc = torch.float32 if weight_only else torch.int32
        ws = torch.empty(split * grid_m * grid_n * block, dtype=acc, device=a.device)
        counts = counters
        if counts is None:
            counts = torch.zeros(grid_m * grid_n, dtype=torch.int32, device=a.device)
    q_eps, q_max = quantize if quantize is not None else (0.0, 1.0)
    launch(splitk_kernel)[(grid_m, grid_n, split)](
        a, b, u, out, ws, counts, a_scale, b_scale, u_scale, bias, residual, x if quantize else None,
        m, n, a.stride(0), b.stride(0), out.stride(0), float(q_eps), float(q_max),
        K=k, K_SPLIT=k_split, SPLIT_K=split, EVEN_K=split * k_split == k,
        GATED=gated, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
        QUANT_A=quantize is not None, BM=cfg.bm, BN=cfg.bn, BK=cfg.bk,
        RB=min(triton.next_power_of_2(k), 32 if INTERPRET else 4096), W8=weight_only,
        UPCAST=INTERPRET and weight_only, SWAP=cfg.swap and weight_only and not gated,
        num_warps=cfg.warps, num_stages=stages,
    )  # fmt: skip
    return out
