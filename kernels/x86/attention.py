"""The x86 attention kernel of ``attention.c`` (logical op ``attention_q``), on x86-64 hosts.

``attention_q(q, k, v, attn_mask, is_causal, scale, out_scale, out_zp, out_qmin, out_qmax)``
is ``quantize_per_tensor(scaled_dot_product_attention(q, k, v, attn_mask, is_causal=...,
scale=...), out_scale, out_zp, out_qmin, out_qmax)``: what PT2E int8 graphs compute for
every attention (``patterns/x86/attention.pdl.mlir`` routes them here). ``scale <= 0``
stands for ``scale=None`` (``1 / sqrt(D)``).

The kernel is C against pdlkit's C ABI 1.1 (AVX512_BF16 dot products, fp32 softmax,
quantization fused into the store; see the header comment of ``attention.c``). This file is
what the registry loads from this folder: on an x86-64 host it builds the library with the
documented command (``cc -O3``, cached by hash, see :mod:`pdlkit.runtime_abi.native_build`)
and declares the library's own descriptors (priority 10, trait ``deterministic``, requires
``avx512f`` and ``avx512_bf16``; ``avx512bw``, which every AVX512_BF16 CPU has but pdlkit has
no feature name for, is checked by ``run()``). Built with ``-fopenmp`` where the compiler has
it: large calls share their heads over torch's OpenMP threads. On other hosts it declares
nothing; without a C compiler it warns once and declares nothing (the pattern's sites then
keep eager SDPA).
"""

from __future__ import annotations

from pathlib import Path

from pdlkit.runtime_abi.kernel import KernelDecl
from pdlkit.runtime_abi.native_build import host_arch

SOURCE = Path(__file__).resolve().with_suffix(".c")


def _load() -> dict[str, KernelDecl]:
    if host_arch() != "x86_64":
        return {}
    from pdlkit.runtime_abi.native_build import build_and_load

    # -fopenmp: heads shared over torch's OpenMP threads (a single-threaded build otherwise)
    return build_and_load(SOURCE, "x86_64", "the x86 attention kernel", extra=("-fopenmp",))


globals().update(_load())
