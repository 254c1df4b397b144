"""Triton kernel behind ``kernels/cuda/attention.py``: attention of one query token per sequence
over a key/value cache (a decode step), grouped-query attention included.

``decode_attention_kernel``: one program per (sequence, key/value head, slice of the cache).
Its GROUP query heads (Hq / Hkv of them, padded to the 16 rows a tensor-core dot needs) are
loaded once; the program streams its slice of that head's keys and values in BLOCK_N-token
tiles, once each, and keeps an online softmax (running maximum and sum, in fp32, base-2
exponentials with the scale folded in). With one slice it writes the output; with SPLIT
slices (flash-decoding: more programs in flight than sequences x heads, for a cache read at
the memory's rate) each writes its unnormalized sums, maximum and denominator to a float32
workspace and ``combine_kernel`` merges the slices, one program per query head. The cache is read once for all the query heads that share it, as the GQA layout intends:
a decode step is a read of the cache, about 64 x 8 x 129 x 128 x 2 x 2 bytes = 34 MB a layer
for Llama-3's decode of 64 sequences.

The cache's length L is a run-time argument, not a compile-time constant (nor specialized by
Triton), and SPLIT, the slices a launch may use (a grid dimension), is the rule's count for the
next power of two of the cache's tiles: each slice takes ``cdiv(cdiv(L, SPLIT), BLOCK_N)``
tiles, computed in the kernel, and the slices past the cache's end read and write nothing and
are left out of the merge. A growing cache (transformers' ``DynamicCache``: a new length every
decode step) so compiles a kernel per bucket, not per length (at most log2 of the rule's slices
plus one: 7 for one sequence of Llama-3, 1 for 64). Where L is symbolic (a graph compiled for
dynamic shapes) the launch takes it as a run-time value and never branches on it, which would
guard the graph on it (Dynamo would compile it again for each length): SPLIT is then the most
slices the rule gives that batch, as vLLM's decode attention fixes its number of splits and
leaves the ones a short sequence does not need empty.

Masks: none, bool (False = masked) or additive float, of shape [B or 1, Hq or 1, 1, L] (read
through their strides: a mask shared by the heads costs one row per sequence). A row whose
every position is masked gives zeros, as ``torch.nn.functional.scaled_dot_product_attention``
does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from pdlkit.kernels.cuda._common import INTERPRET
from pdlkit.runtime_abi.triton_binding import launch

_LOG2E = 1.4426950408889634
NO_MASK, BOOL_MASK, ADD_MASK = 0, 1, 2


@triton.jit
def _scores(q, k, qk_scale, IEEE: tl.constexpr):
    """q [G, D] . k [N, D]^T, times scale * log2(e): the logits in base 2, fp32."""
    if IEEE:  # float32 inputs: no TF32 rounding of the products
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    return s * qk_scale


@triton.jit
def _masked(s, mask_ptr, heads, cols, ok, sm_h, sm_l, MASK: tl.constexpr):
    """The logits with the mask applied (base 2), and -inf past the cache's end."""
    if MASK == 1:
        keep = tl.load(mask_ptr + heads[:, None] * sm_h + cols[None, :] * sm_l, mask=ok, other=0)
        s = tl.where(keep != 0, s, float("-inf"))
    elif MASK == 2:
        bias = tl.load(mask_ptr + heads[:, None] * sm_h + cols[None, :] * sm_l, mask=ok, other=0)
        s = s + bias.to(tl.float32) * 1.4426950408889634
    return tl.where(ok, s, float("-inf"))


@triton.jit
def _slice_tokens(L, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tokens a slice of the cache takes: L over SPLIT slices, in whole BLOCK_N-token tiles
    (the last slices are shorter, or empty, where L is short)."""
    return tl.cdiv(tl.cdiv(L, SPLIT), BLOCK_N) * BLOCK_N


@triton.jit
def _attend(
    q, k_base, v_base, mask_base, heads, g_ok, d, d_ok, start0, lo, hi, span, L,
    sk_l, sv_l, sm_h, sm_l, QK_SCALE: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, MASK: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    """The online softmax of q [G_PAD, D_PAD] over the cache's positions [lo, hi), in the
    BLOCK_N-token tiles of [start0, start0 + span) (positions outside [lo, hi) masked):
    running maximum m and sum l of the base-2 exponentials, and the unnormalized output acc
    (fp32)."""
    m_i = tl.full((G_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((G_PAD,), dtype=tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), dtype=tl.float32)
    for start in range(0, span, BLOCK_N):  # none where span <= 0
        cols = start0 + start + tl.arange(0, BLOCK_N)
        live = (cols >= lo) & (cols < hi)
        n_ok = live[:, None]
        k = tl.load(k_base + cols[:, None] * sk_l + d[None, :], mask=n_ok & d_ok, other=0.0)
        v = tl.load(v_base + cols[:, None] * sv_l + d[None, :], mask=n_ok & d_ok, other=0.0)
        s = _scores(q, k, tl.cast(QK_SCALE, tl.float32), IEEE)
        s = _masked(s, mask_base, heads, cols, g_ok & live[None, :], sm_h, sm_l, MASK)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row masked so far: no NaN
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["L"])
def decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, acc_ptr, ml_ptr,
    sq_b, sq_h, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, sm_b, sm_h, sm_l, L,
    QK_SCALE: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
    D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    MASK: tl.constexpr, IEEE: tl.constexpr, INTERPRETED_CHUNK: tl.constexpr,
    TAIL_FIRST: tl.constexpr = True,
):  # fmt: skip
    """softmax(q[b, h] . k[b, h // GROUP]^T * scale + mask) . v[b, h // GROUP] over the cache's
    tokens [c * s, min(c * (s + 1), L)) (c: ``_slice_tokens``) for the GROUP query heads h of
    key/value head ``pid % HKV`` of sequence ``pid // HKV``, slice s = program_id(1). L, the
    cache's length, is a run-time value (not specialized: one kernel for every length).
    INTERPRETED_CHUNK: 0 on a GPU; under Triton's interpreter, whose loops take no run-time
    bound (it converts a 1-element array to an int, which NumPy 2 refuses), c itself."""
    pid = tl.program_id(0)
    b = (pid // HKV).to(tl.int64)
    kh = (pid % HKV).to(tl.int64)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    heads = kh * GROUP + g
    g_ok = (g < GROUP)[:, None]
    d_ok = (d < D)[None, :]
    q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=g_ok & d_ok, other=0.0)
    chunk = _slice_tokens(L, SPLIT, BLOCK_N)
    first = tl.program_id(1) * chunk
    live = first < L  # a slice past a short cache's end reads and writes nothing
    tokens = tl.minimum(chunk, L - first)
    # the partial tile first (its tile starts before ``first``, masked), its load out with the
    # first full tiles' (Llama-3's 64 x 129-token step: 11.8 us against 12.5-13.6 with it
    # last; Llama-2-7B's 36.4 against 37.5, H200)
    pad = (BLOCK_N - tokens % BLOCK_N) % BLOCK_N if TAIL_FIRST else 0
    args = (q, k_ptr + b * sk_b + kh * sk_h, v_ptr + b * sv_b + kh * sv_h, mask_ptr + b * sm_b)
    if INTERPRETED_CHUNK == 0:
        m_i, l_i, acc = _attend(
            *args, heads, g_ok, d, d_ok, first - pad, first, first + tokens, tokens + pad, L,
            sk_l, sv_l, sm_h, sm_l, QK_SCALE, G_PAD, D_PAD, BLOCK_N, MASK, IEEE,
        )  # fmt: skip
    else:  # a constant loop bound, one tile longer than the slice (masked); in two calls:
        # chosen into one variable before one call, the interpreter's loop failed on it
        m_i, l_i, acc = _attend(
            *args, heads, g_ok, d, d_ok, first - pad, first, first + tokens,
            INTERPRETED_CHUNK + BLOCK_N, L,
            sk_l, sv_l, sm_h, sm_l, QK_SCALE, G_PAD, D_PAD, BLOCK_N, MASK, IEEE,
        )  # fmt: skip
    rows = pid * GROUP + g  # the query head's row of [B * Hq]
    if SPLIT == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a fully masked row: acc is 0
        tl.store(
            o_ptr + rows[:, None] * D + d[None, :], out.to(o_ptr.dtype.element_ty), mask=g_ok & d_ok
        )
    else:  # an empty slice writes nothing: the merge leaves it out
        slot = rows * SPLIT + tl.program_id(1)
        tl.store(acc_ptr + slot[:, None] * D + d[None, :], acc, mask=g_ok & d_ok & live)
        tl.store(ml_ptr + slot * 2, m_i, mask=(g < GROUP) & live)
        tl.store(ml_ptr + slot * 2 + 1, l_i, mask=(g < GROUP) & live)


@triton.jit(do_not_specialize=["L"])
def combine_kernel(
    acc_ptr, ml_ptr, o_ptr, L,
    D: tl.constexpr, D_PAD: tl.constexpr, SPLIT: tl.constexpr, S_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """o[r] = sum_s w_s acc[r, s] / sum_s w_s l[r, s], w_s = 2^(m[r, s] - max_s m[r, s]): the
    slices of query head r (one of B * Hq) that hold tokens of the L-token cache, merged."""
    r = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    s_ok = s < tl.cdiv(L, _slice_tokens(L, SPLIT, BLOCK_N))  # the slices not empty
    m = tl.load(ml_ptr + (r * SPLIT + s) * 2, mask=s_ok, other=float("-inf"))
    den = tl.load(ml_ptr + (r * SPLIT + s) * 2 + 1, mask=s_ok, other=0.0)
    top = tl.max(m, axis=0)
    w = tl.math.exp2(m - tl.where(top == float("-inf"), 0.0, top))
    total = tl.sum(w * den, axis=0)
    ok = s_ok[:, None] & (d < D)[None, :]
    acc = tl.load(acc_ptr + (r * SPLIT + s[:, None]) * D + d[None, :], mask=ok, other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(o_ptr + r * D + d, out.to(o_ptr.dtype.element_ty), mask=d < D)


@dataclass(frozen=True)
class Tile:
    """A launch: tokens a tile, slices of the cache a launch may use (programs per sequence and
    head; those past the cache's end stay empty), warps, pipeline stages, and whether a slice's
    partial tile comes first (False: last, for comparison in benchmarks/cuda_attention.py)."""

    block_n: int
    split: int
    warps: int = 4
    stages: int = 3
    tail_first: bool = True


@dataclass(frozen=True)
class Rule:
    """How a tile is picked: ``block_n`` tokens a tile, and slices of the cache for about
    ``programs`` programs in all (at least a tile a slice, at most 128 slices); where the
    (sequence, key/value head) pairs alone fill the GPU (one slice), ``full_warps`` warps a
    program and, where each key/value head serves one query head (MHA), ``full_block_n_mha``
    tokens a tile (None: as ``warps``, ``block_n``).

    The default, measured on an H200 (benchmarks/cuda_attention.py --sweep, 129 cached
    tokens, bfloat16; ``cuda_attention_h200_*.md`` in benchmarks/results): 64 sequences of
    Llama-3's heads (512 pairs) take one slice, 13.4 us against 18.4 for two slices and 18.0
    for cuDNN's SDPA (the combine launch and the workspace cost more than the parallelism
    gains); one sequence (8 pairs) takes five slices of 32 tokens, 4.2 us against cuDNN's 5.6.
    With one slice a program's time goes by its tiles' chain of dependent steps (a 64 x 129
    MHA cache: 35.5 us at 128 tokens, 39.0 at 129, 39.3 at 136), not by its bytes, and one
    warp a program runs more of those chains an SM: Llama-2-7B's MHA at 64 sequences 35.9 us
    with one warp and 16-token tiles against 39.0 with four warps and 32; Llama-3's 11.6
    against 11.8 (one warp, 32 tokens), H200, 2026-11-29.

    The slices a launch may use come from the next power of two of the cache's tiles, so that
    caches of 129 and 160 tokens share a kernel (8 slices, 5 of them used); a length not known
    until run time (None) takes the most the rule gives any length, ``programs / pairs``."""

    block_n: int = 32
    programs: int = 512
    warps: int = 4
    stages: int = 3
    full_warps: int | None = None
    full_block_n_mha: int | None = None

    def tile(self, pairs: int, length: int | None, group: int = 1) -> Tile:
        """The tile for ``pairs`` (sequence, key/value head) pairs over ``length`` tokens, each
        key/value head serving ``group`` query heads."""
        split = min(triton.cdiv(self.programs, pairs), 128)
        if length is not None:
            split = min(split, triton.next_power_of_2(triton.cdiv(length, self.block_n)))
        if split > 1:  # the partial tile last (one sequence of MHA: 4.9-5.0 us against
            # 5.0-5.4 with it first, three runs on an H200)
            return Tile(self.block_n, split, self.warps, self.stages, tail_first=False)
        bn = self.full_block_n_mha if group == 1 and self.full_block_n_mha else self.block_n
        return Tile(bn, 1, self.full_warps or self.warps, self.stages)


# A rule for every launch, "BLOCK_N,PROGRAMS,WARPS,STAGES": for measuring rules inside a
# model (benchmarks/cuda_attention.py measures them on the kernel alone)
RULE_ENV = "PDLKIT_DECODE_ATTENTION_RULE"


def pick_tile(pairs: int, length: int | None, d_pad: int, group: int = 1) -> Tile:
    """The default rule's tile (8-token tiles under the interpreter: small, fast tests;
    16 for head dims above 128, whose tiles are twice the bytes, and four warps there, as
    measured for none of them: one warp's registers would hold 16 x 256 fp32 sums alone), or
    ``RULE_ENV``'s."""
    env = os.environ.get(RULE_ENV)
    if env:
        return Rule(*(int(x) for x in env.split(","))).tile(pairs, length, group)
    if INTERPRET:
        return Rule(block_n=8).tile(pairs, length, group)
    bn, warps = (32, 1) if d_pad <= 128 else (16, None)
    return Rule(block_n=bn, full_warps=warps, full_block_n_mha=16).tile(pairs, length, group)


def _known(n: int | torch.SymInt) -> int | None:
    """``n`` where it is a number; None for a size symbolic in a graph being compiled for
    dynamic shapes (a growing cache), which the launch must not branch on: a comparison would
    guard the graph on it, and Dynamo would compile it again for the next length."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    return int(n) if is_concrete_int(n) else None


def _interpreted_chunk(length: int, t: Tile) -> int:
    """``_slice_tokens`` on the host: the interpreter's constant loop bound."""
    return triton.cdiv(triton.cdiv(length, t.split), t.block_n) * t.block_n


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    tile: Tile | None = None,
) -> torch.Tensor:
    """Attention of q [B, Hq, 1, D] over k, v [B, Hkv, L, D] (unit inner strides, Hq a multiple
    of Hkv), ``mask`` None or [B, Hq, 1, L] (a broadcast view: strides 0 allowed), bool or
    float; the result [B, Hq, 1, D], contiguous, in q's dtype. ``scale`` is the softmax scale
    itself (not 0 for None). L and B may be symbolic (dynamic shapes): they reach the kernels
    as run-time values; the slices are then those of the longest cache (of one sequence)."""
    if INTERPRET and q.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong (NumPy
        # has no bf16; 8e8 for a softmax of unit values): float32 there, bf16 out
        m32 = mask if mask is None or mask.dtype == torch.bool else mask.float()
        return decode_attention(q.float(), k.float(), v.float(), m32, scale, tile).bfloat16()
    b, hq, _, d = q.shape
    hkv, length = k.shape[1], k.shape[2]
    d_pad = max(16, triton.next_power_of_2(d))
    t = tile or pick_tile((_known(b) or 1) * hkv, _known(length), d_pad, hq // hkv)
    split = t.split  # slices past the cache's end stay empty (the kernels compute which)
    out = torch.empty((b, hq, 1, d), dtype=q.dtype, device=q.device)
    acc = ml = out  # one slice: no workspace
    if split > 1:
        acc = torch.empty((b * hq * split, d), dtype=torch.float32, device=q.device)
        ml = torch.empty((b * hq * split, 2), dtype=torch.float32, device=q.device)
    kind = NO_MASK if mask is None else BOOL_MASK if mask.dtype == torch.bool else ADD_MASK
    m = q if mask is None else mask  # no mask: a pointer that is never read
    sm = (0, 0, 0) if mask is None else (mask.stride(0), mask.stride(1), mask.stride(3))
    launch(decode_attention_kernel)[(b * hkv, split)](
        q, k, v, m, out, acc, ml,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), *sm, length,
        QK_SCALE=float(scale) * _LOG2E, HKV=hkv, GROUP=hq // hkv,
        G_PAD=max(16, triton.next_power_of_2(hq // hkv)), D=d, D_PAD=d_pad,
        BLOCK_N=t.block_n, SPLIT=split, MASK=kind, IEEE=q.dtype == torch.float32,
        INTERPRETED_CHUNK=_interpreted_chunk(length, t) if INTERPRET else 0,
        TAIL_FIRST=t.tail_first,
        num_warps=1 if INTERPRET else t.warps, num_stages=1 if INTERPRET else t.stages,
    )  # fmt: skip
    if split > 1:
        launch(combine_kernel)[(b * hq,)](
            acc, ml, out, length, D=d, D_PAD=d_pad, SPLIT=split,
            S_PAD=triton.next_power_of_2(split), BLOCK_N=t.block_n,
            num_warps=1 if INTERPRET else 4,
        )  # fmt: skip
    return out
