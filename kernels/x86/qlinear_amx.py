"""int8 linear on Intel AMX tiles (TDPBUSD for uint8 activations, TDPBSSD for int8 ones), and
the per-tensor-weight ops (``qlinear_pt`` / ``qlinear_q_pt``: symmetric quantizers such as
XNNPACKQuantizer's, often with int8 activations) on AMX and AVX-512 VNNI.

These are ``qlinear_vnni.py``'s kernels with another engine, not a second implementation: the
same library (``qgemm_vnni.c``, whose AMX path is ``qgemm_amx.h``), the same packed weight (the
VNNI panel layout is AMX's B-tile layout as it is), the same epilogue (zero-point correction,
scales, bias, ReLU / GELU, requantization or float32 store, residual add + LayerNorm + codes),
applied to each 32 x 64 block of int32 sums from an 8 KB L1 scratch. A pre-pack made for an
``*_amx`` kernel asks for the AMX path (``QG_AMX``); the library takes it per call where
``pdlkit_qgemm_uses_amx`` says so: K a multiple of 64, at least 32 rows (the rows past the last
whole block of 32 go through the VNNI micro-kernel), and the process granted the tile state
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, asked once). Every other call (M = 1,
odd K, a kernel that refuses the tile state) runs the VNNI path on the same packed weight:
the next candidate, without a second pre-pack or a fallback through the reference.

Declared with ``requires=["amx_tile", "amx_int8"]`` (``capability.host`` keeps those flags only
where Linux grants the tile state) at priority 20, before the VNNI kernels (10) and oneDNN's (0); the
measured choice (``PDLKIT_AUTOTUNE``) times them like the others.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import torch
from pdlkit.kernels.x86 import qlinear_vnni as _v
from torch import Tensor

import pdlkit

AMX_REQUIRES = ["avx512f", "avx512_vnni", "amx_tile", "amx_int8"]


def _pack_q_amx(w_q: Tensor, attrs: Mapping[str, Any]) -> Any:
    return _v._pack_q(w_q, attrs, amx=True)


def _pack_f32_amx(w_q: Tensor, attrs: Mapping[str, Any]) -> Any:
    return _v._pack_f32(w_q, attrs, amx=True)


def _pack_ln_amx(w_q: Tensor, attrs: Mapping[str, Any]) -> Any:
    return _v._pack_ln(w_q, attrs, amx=True)


def uses_amx(packed: Any, m: int, x_dtype: torch.dtype = torch.uint8) -> bool:
    """Whether a call of ``m`` rows of ``x_dtype`` activations with this pre-pack runs on AMX
    tiles (tests, benchmarks)."""
    assert _v._LIB is not None
    return bool(_v._LIB.pdlkit_qgemm_uses_amx(packed.addr(torch.empty(0, dtype=x_dtype)), m))


def amx_ready() -> bool:
    """Whether this process may use the AMX tiles (asks Linux for them on the first call)."""
    return _v._LIB is not None and bool(_v._LIB.pdlkit_qgemm_amx_ready())


def _gemm_pt(
    x_q: Tensor, x_scale: float, x_zp: int, p: Any, w_scale: float, w_zp: int,
    bias: Tensor | None, out_scale: float, out_zp: int,
) -> Tensor:  # fmt: skip
    """One call of a per-tensor-weight op: the weight scale and zero point are numbers, made
    [N] vectors once per value (``_Packed.pointers``)."""
    return _v._gemm(x_q, x_scale, x_zp, p, w_scale, w_zp, bias, out_scale, out_zp)


def _pack_q_pt(w_q: Tensor, attrs: Mapping[str, Any], amx: bool = False) -> Any:
    return _v._pack_q(w_q, attrs, amx)


def _pack_f32_pt(w_q: Tensor, attrs: Mapping[str, Any], amx: bool = False) -> Any:
    return _v._pack_f32(w_q, attrs, amx)


def _pt_kernels(engine: str, requires: list[str], priority: int, amx: bool) -> list[Any]:
    """``qlinear_q_pt_<engine>`` and ``qlinear_pt_<engine>``."""
    decl: dict[str, Any] = {
        "device": "cpu",
        "dtypes": {k: v for k, v in _v._DTYPES.items() if k not in ("w_scale", "w_zp")},
        "shapes": {"w_q": {"rank": 2}},
        "requires": requires,
        "priority": priority,
        "prepack_arg": "w_q",
        "traits": ["deterministic"],
    }

    def qlinear_q_pt(
        x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: float, w_zp: int,
        bias: Tensor | None, out_scale: float, out_zp: int, out_qmin: int, out_qmax: int,
        post_op: str, algorithm: str,
    ) -> Tensor:  # fmt: skip
        """quantize(act(dequantize(x_q) @ dequantize(w_q).T + bias)), per-tensor weight."""
        return _gemm_pt(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, out_scale, out_zp)

    def qlinear_pt(
        x_q: Tensor, x_scale: float, x_zp: int, w_q: Tensor, w_scale: float, w_zp: int,
        bias: Tensor | None, post_op: str, algorithm: str,
    ) -> Tensor:  # fmt: skip
        """act(dequantize(x_q) @ dequantize(w_q).T + bias) in float32, per-tensor weight."""
        return _gemm_pt(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, 1.0, 0)

    def pack_q(w: Tensor, attrs: Mapping[str, Any]) -> Any:
        return _pack_q_pt(w, attrs, amx)

    def pack_f32(w: Tensor, attrs: Mapping[str, Any]) -> Any:
        return _pack_f32_pt(w, attrs, amx)

    return [
        pdlkit.kernel(
            implements="qlinear_q_pt", name=f"qlinear_q_pt_{engine}", prepack=pack_q, **decl,
        )(qlinear_q_pt),
        pdlkit.kernel(
            implements="qlinear_pt", name=f"qlinear_pt_{engine}", prepack=pack_f32,
            **decl,
        )(qlinear_pt),
    ]  # fmt: skip


if _v._LIB is not None:
    _v._LIB.pdlkit_qgemm_uses_amx.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    _v._LIB.pdlkit_qgemm_uses_amx.restype = ctypes.c_int
    _v._LIB.pdlkit_qgemm_amx_ready.restype = ctypes.c_int
    _AMX: dict[str, Any] = {**_v._DECL, "requires": AMX_REQUIRES, "priority": 20}

    # the VNNI kernels' bodies: what differs is the pre-pack's engine flag
    qlinear_q_amx = pdlkit.kernel(
        implements="qlinear_q",
        name="qlinear_q_amx",
        dtypes=_v._DTYPES,
        prepack=_pack_q_amx,
        **_AMX,
    )(_v.qlinear_q_vnni.fn)
    qlinear_amx = pdlkit.kernel(
        implements="qlinear",
        name="qlinear_amx",
        dtypes=_v._DTYPES,
        prepack=_pack_f32_amx,
        **_AMX,
    )(_v.qlinear_vnni.fn)
    qlinear_add_layer_norm_q_amx = pdlkit.kernel(
        implements="qlinear_add_layer_norm_q",
        name="qlinear_add_layer_norm_q_amx",
        dtypes=_v._LN_DTYPES,
        prepack=_pack_ln_amx,
        **_AMX,
    )(_v.qlinear_add_layer_norm_q_vnni.fn)
    qlinear_add_layer_norm_amx = pdlkit.kernel(
        implements="qlinear_add_layer_norm",
        name="qlinear_add_layer_norm_amx",
        dtypes=_v._LN_DTYPES,
        prepack=_pack_ln_amx,
        **_AMX,
    )(_v.qlinear_add_layer_norm_vnni.fn)
    qlinear_q_pt_amx, qlinear_pt_amx = _pt_kernels("amx", AMX_REQUIRES, 20, True)
    qlinear_q_pt_vnni, qlinear_pt_vnni = _pt_kernels("vnni", _v._DECL["requires"], 10, False)
