"""int8 linear for PT2E graphs on x86 as one AVX-512 VNNI GEMM with the epilogue fused, and
the same on Intel AMX tiles (``qgemm_vnni.c``, pdlkit C ABI 1.2): ``qlinear_q`` (requantized
uint8 / int8 output) and ``qlinear`` (float32); ``qlinear_q_pt`` / ``qlinear_pt`` (the weight
quantized per tensor: symmetric quantizers such as XNNPACKQuantizer's, often with int8
activations); ``qlinear_dynamic`` / ``qlinear_dynamic_pt`` (the activation's scale and zero
point tensors of each call, from ``choose_qparams``: PT2E's dynamic quantization, per-channel or
per-tensor weights); ``qlinear_add_layer_norm_q`` /
``qlinear_add_layer_norm``, a transformer block's
output projection with its residual add, LayerNorm and (optionally) the quantize of the next
GEMM's input in the epilogue (``patterns/x86/qlinear_add_layer_norm.pdl.mlir``);
``qkv_attention_q_merged``, a self-attention block's Q, K and V projections as one GEMM
followed, batch by batch, by ``attention.c``'s attention (``patterns/x86/qkv_attention.pdl.mlir``;
the three weights are packed as one, ABI 1.2's ``prepack_with``).

Per call: one C call reads the uint8 activations as they are (``vpdpbusd`` multiplies
unsigned by signed bytes; int8 ones as their u8 view ``x + 128``), multiplies them with the
weight pre-packed (the ABI's prepack hook) into 64-column panels, and finishes every 6 x 64
tile in registers: zero-point correction, ``x_scale * w_scale[n]``, bias, ReLU / GELU (erf or
tanh), and the requantization (round half to even, like ``quantize_per_tensor``) or the
float32 store. No [M, N] int32 intermediate, no pass over the activations, no oneDNN
primitive lookup per call.

Kernels (the library's descriptors): ``<name>_vnni`` at priority 10 (requires ``avx512f``,
``avx512_vnni``), before the oneDNN kernels (0), and ``<name>_amx`` at priority 20 (also
``amx_tile`` and ``amx_int8``, which ``capability.host`` keeps only where Linux grants the
tile state). The AMX kernels are the VNNI ones with another engine: the same packed weight
(the VNNI panel layout is AMX's B-tile layout as it is), the same epilogue applied to each
32 x 64 block of int32 sums. A call runs on the tiles where :func:`uses_amx` says so: K a
multiple of 64, at least 32 rows (rows past the last whole block go through the VNNI
micro-kernel) and the tiles granted; every other call runs the VNNI path on the same packed
weight.

Measured on one Zen 4 core against oneDNN's ``qlinear_pointwise`` with a pre-packed weight
(``benchmarks/x86_qlinear.py``, interleaved medians): 0.80-0.89x oneDNN's time on
bert-mini's GEMMs (427-442 GOP/s against a single-core limit of about 435), 0.15x at M = 8
(the pooler), where oneDNN's per-call cost (~25 us) dominates.

Threads: the library is built with ``-fopenmp`` where the compiler supports it and then
splits GEMMs of 2^21 multiply-adds or more over torch's own OpenMP threads (it links
``libgomp.so.1``, the runtime torch has loaded: ``torch.set_num_threads`` applies, no second
pool). Built without OpenMP, the GEMM is single-threaded.

The library is built on first load with the host's C compiler
(:func:`pdlkit.runtime_abi.native_build.build_and_load`, cached by hash); on a host that is
not x86-64 this file declares nothing, and without a compiler it warns once and declares
nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pdlkit.kernels.x86._native_gemm import packed_uses_amx
from pdlkit.runtime_abi.kernel import KernelDecl
from pdlkit.runtime_abi.native_build import host_arch

SOURCE = Path(__file__).resolve().with_name("qgemm_vnni.c")
AMX_KSTEP = 64  # K per TDPBUSD step (qgemm_amx.h)


def uses_amx(packed: Any, m: int, x_dtype: torch.dtype = torch.uint8) -> bool:
    """Whether a call of ``m`` rows of ``x_dtype`` activations with this pre-pack runs on AMX
    tiles (tests, benchmarks): a pre-pack of an ``*_amx`` kernel, K % 64 == 0, m >= 32, the
    tiles granted and the library's tile self-test passed (uint8 and int8 activations alike)."""
    return packed_uses_amx(packed, m, AMX_KSTEP, "amx_int8", globals().get("qlinear_q_amx"))


def _load() -> dict[str, KernelDecl]:
    if host_arch() != "x86_64":
        return {}
    from pdlkit.runtime_abi.native_build import build_and_load

    # -fopenmp: on torch's OpenMP threads where the compiler has OpenMP, else single-threaded
    return build_and_load(SOURCE, "x86_64", "the int8 linear kernels", extra=("-fopenmp",))


globals().update(_load())
