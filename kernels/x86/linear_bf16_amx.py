"""BF16 linear [+ ReLU | GELU] on Intel AMX tiles (TDPBF16PS): ``linear_bf16.py``'s kernels
with the AMX engine, not a second implementation. Same library (``gemm_bf16.c``, whose AMX
path is ``qgemm_amx.h``, shared with the int8 kernels), same packed weight (the panels' pairs
of bf16 are the VNNI-2 B-tile layout as they are), same epilogue (bias, activation, one
rounding to bfloat16) applied to each 32 x 64 block of float32 sums from an L1 scratch.

A call runs on the tiles where ``pdlkit_gbf16_uses_amx`` says so: K a multiple of 32, at
least 32 rows (rows past the last whole block go through the AVX512_BF16 micro-kernel), and
the process granted the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``,
asked once); every other call (M = 1, odd K, a kernel that refuses the tile state) runs the
AVX512_BF16 path on the same packed weight. Declared with ``requires=["amx_tile",
"amx_bf16"]`` at priority 20, before the AVX512_BF16 kernels (10) and oneDNN's.
"""

from __future__ import annotations

import ctypes
from typing import Any

from pdlkit.kernels.x86 import linear_bf16 as _b

import pdlkit

AMX_REQUIRES = ["avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]


def uses_amx(packed: Any, m: int) -> bool:
    """Whether a call of ``m`` rows with this pre-pack runs on AMX tiles (tests, benchmarks)."""
    assert _b._LIB is not None
    return bool(_b._LIB.pdlkit_gbf16_uses_amx(packed.params_addr, m))


if _b._LIB is not None:
    _b._LIB.pdlkit_gbf16_uses_amx.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    _b._LIB.pdlkit_gbf16_uses_amx.restype = ctypes.c_int
    _AMX: dict[str, Any] = {**_b._DECL, "requires": AMX_REQUIRES, "priority": 20}

    linear_bf16_amx = pdlkit.kernel(
        implements="linear",
        name="linear_bf16_amx",
        prepack=_b._packer(lambda a: (0, ("none", "")), amx=True),
        **_AMX,
    )(_b.linear_bf16.fn)
    linear_relu_bf16_amx = pdlkit.kernel(
        implements="linear_relu",
        name="linear_relu_bf16_amx",
        prepack=_b._packer(lambda a: (1, ("relu", "")), amx=True),
        **_AMX,
    )(_b.linear_relu_bf16.fn)
    linear_gelu_bf16_amx = pdlkit.kernel(
        implements="linear_gelu",
        name="linear_gelu_bf16_amx",
        prepack=_b._packer(_b._gelu_act, amx=True),
        **_AMX,
    )(_b.linear_gelu_bf16.fn)
