"""BF16 linear [+ ReLU | GELU] on x86 as one AVX512_BF16 GEMM with the epilogue fused, and the
same on Intel AMX tiles (``gemm_bf16.c``, pdlkit C ABI 1.2): the logical ops ``linear``,
``linear_relu`` and ``linear_gelu`` of ``patterns/cpu/`` when input, weight and bias are
bfloat16 (a ``model.to(torch.bfloat16)``).

Per call: one C call multiplies the bf16 activations with the weight pre-packed (the ABI's
prepack hook) into 64-column panels (``vdpbf16ps``, float32 accumulation) and finishes every
6 x 64 tile in registers: bias, activation (GELU as polynomials accurate to 3e-7 in float32),
one rounding to bfloat16 (nearest even). Inference only (no backward): graphs that train keep
the oneDNN / addmm kernels, which declare one.

Kernels (the library's descriptors): ``linear_bf16``, ``linear_relu_bf16``,
``linear_gelu_bf16`` (priority 10, requires ``avx512f`` and ``avx512_bf16``) and their
``*_amx`` engines (priority 20, also ``amx_tile`` and ``amx_bf16``; ``capability.host`` keeps
those flags only where Linux grants the tile state). The AMX kernels are the same GEMM with
another multiply, not a second implementation: the same packed weight (its pairs of bf16 are
the VNNI-2 B-tile layout as they are), the same epilogue applied to each 32 x 32 half of
float32 sums while the tiles compute the next (the AMX engine of ``qgemm_amx_gemm.h``, shared
with the int8 kernels). A call runs on the tiles where :func:`uses_amx` says so: K a multiple of 32, at
least 32 rows (rows past the last whole block go through the AVX512_BF16 micro-kernel), and
the tile state granted; every other call runs the AVX512_BF16 path on the same packed weight.

Measured on one Zen 4 core against oneDNN's BF16 matmul with a pre-packed weight
(``linear_onednn`` / ``linear_gelu_onednn``; ``benchmarks/x86_qlinear.py``, second table):
0.82-0.95x oneDNN's time on the bert-mini and BERT-base shapes, 200-224 GFLOP/s where the
single-core limit (2048^3 through oneDNN) is about 214; 0.23-0.33x at M <= 8.

Threads: built with ``-fopenmp`` where the compiler supports it, the library shares GEMMs of
2^20 multiply-adds or more over torch's own OpenMP threads (it links ``libgomp.so.1``, the
runtime torch has loaded: ``torch.set_num_threads`` applies). Without OpenMP it is
single-threaded.

The library is built on first load with the host's C compiler
(:func:`pdlkit.runtime_abi.native_build.build_and_load`, cached by hash); on a host that is
not x86-64 this file declares nothing, and without a compiler it warns once and declares
nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdlkit.kernels.x86._native_gemm import packed_uses_amx
from pdlkit.runtime_abi.kernel import KernelDecl
from pdlkit.runtime_abi.native_build import host_arch

SOURCE = Path(__file__).resolve().with_name("gemm_bf16.c")
AMX_KSTEP = 32  # K per TDPBF16PS step (qgemm_amx.h)


def uses_amx(packed: Any, m: int) -> bool:
    """Whether a call of ``m`` rows with this pre-pack runs on AMX-BF16 tiles (tests,
    benchmarks): a pre-pack of an ``*_amx`` kernel, K % 32 == 0, m >= 32, tiles granted and
    the library's tile self-test passed."""
    return packed_uses_amx(packed, m, AMX_KSTEP, "amx_bf16", globals().get("linear_bf16_amx"))


def _load() -> dict[str, KernelDecl]:
    if host_arch() != "x86_64":
        return {}
    from pdlkit.runtime_abi.native_build import build_and_load

    # -fopenmp: on torch's OpenMP threads where the compiler has OpenMP, else single-threaded
    return build_and_load(SOURCE, "x86_64", "the BF16 linear kernels", extra=("-fopenmp",))


globals().update(_load())
