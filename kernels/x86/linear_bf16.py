"""BF16 linear [+ ReLU | GELU] on x86 as one AVX512_BF16 GEMM with the epilogue fused
(``gemm_bf16.c``): the logical ops ``linear``, ``linear_relu`` and ``linear_gelu`` of
``patterns/cpu/`` when input, weight and bias are bfloat16 (a ``model.to(torch.bfloat16)``).

Per call: one C call multiplies the bf16 activations with the weight pre-packed into
64-column panels (``vdpbf16ps``, float32 accumulation) and finishes every 6 x 64 tile in
registers: bias, activation (GELU as polynomials accurate to 3e-7 in float32), one rounding to
bfloat16 (nearest even). Inference only (no backward): graphs that train keep the oneDNN /
addmm kernels, which declare one.

Measured on one Zen 4 core against oneDNN's BF16 matmul with a pre-packed weight
(``linear_onednn`` / ``linear_gelu_onednn``; ``benchmarks/x86_qlinear.py``, second table):
0.82-0.95x oneDNN's time on the bert-mini and BERT-base shapes, 200-224 GFLOP/s where the
single-core limit (2048^3 through oneDNN) is about 214; 0.23-0.33x at M <= 8.

Threads: built with ``-fopenmp`` where the compiler supports it, the library shares GEMMs of
2^20 multiply-adds or more over torch's own OpenMP threads (as ``qlinear_vnni.py`` does).
Built without, the GEMM is single-threaded and, with several torch threads, GEMMs of
``PARALLEL_MIN_MACS`` multiply-adds or more go to oneDNN's parallel GEMM (the kernel makes
oneDNN's call itself, weight packed by oneDNN on first need).

The library is built on first load with the host's C compiler
(:func:`pdlkit.runtime_abi.native_build.build_library`, cached by hash); on a host that is not
x86-64, or without a compiler, this file warns once and declares nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pdlkit.kernels.x86._native_gemm import load_gemm_library, rows, storage_alias
from torch import Tensor

import pdlkit

SOURCE = Path(__file__).resolve().with_name("gemm_bf16.c")
_ACT = {"none": 0, "relu": 1, "gelu:none": 2, "gelu:tanh": 3}
# built without OpenMP: GEMMs handed to oneDNN with several threads (half the int8 kernel's
# threshold: a BF16 multiply-add costs twice the time)
PARALLEL_MIN_MACS = 1 << 23


class _Params(ctypes.Structure):
    """``pdlkit_gbf16_params`` of gemm_bf16.c."""

    _fields_ = [
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("packed", ctypes.c_void_p),
        ("act", ctypes.c_int32),
        ("flags", ctypes.c_int32),  # GB_AMX: AMX tiles where the call allows (qgemm_amx.h)
    ]


GB_AMX = 1


def _load() -> ctypes.CDLL | None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    # x, m, ldx, out, ldo, bias, params
    return load_gemm_library(
        SOURCE, "the BF16 linear kernels", "pdlkit_gbf16", _Params, [p, i64, i64, p, i64, p, p]
    )


class _Packed:
    """One call site's weight in the GEMM's panel layout and the kernel's parameters; the
    weight's storage (aliased) for oneDNN's packed copy, made on first need."""

    __slots__ = ("__weakref__", "k", "n", "onednn", "packed", "params", "params_addr", "post", "w")

    def __init__(self, weight: Tensor, act: int, post: tuple[str, str], amx: bool = False):
        """``amx``: the GEMM runs on AMX-BF16 tiles where a call allows it (gemm_bf16.c,
        pdlkit_gbf16_uses_amx), else on the AVX512_BF16 path; the packed weight is the same."""
        assert _LIB is not None
        n, k = weight.shape
        self.w = storage_alias(weight)
        wc = weight.contiguous()
        self.packed = torch.empty(_LIB.pdlkit_gbf16_packed_size(n, k) // 2, dtype=torch.bfloat16)
        _LIB.pdlkit_gbf16_pack(wc.data_ptr(), k, n, k, self.packed.data_ptr())
        self.n, self.k, self.post = n, k, post
        self.onednn: Tensor | None = None
        self.params = _Params(
            n=n, k=k, packed=self.packed.data_ptr(), act=act, flags=GB_AMX if amx else 0
        )
        self.params_addr = ctypes.addressof(self.params)

    def onednn_weight(self) -> Tensor:
        if self.onednn is None:
            self.onednn = torch.ops.mkldnn._reorder_linear_weight(self.w, None)
        return self.onednn

    def __sizeof__(self) -> int:
        own = self.packed.nbytes
        if self.onednn is not None:
            own += self.onednn.element_size() * self.onednn.numel()
        return own


def _packer(act_of: Any, amx: bool = False) -> Any:
    def pack(weight: Tensor, attrs: Mapping[str, Any]) -> _Packed:
        if weight.shape[1] == 0:
            raise pdlkit.KernelUnsupported("K = 0")
        act, post = act_of(attrs)
        return _Packed(weight, act, post, amx)

    return pack


def _gelu_act(attrs: Mapping[str, Any]) -> tuple[int, tuple[str, str]]:
    approximate = str(attrs["approximate"])
    if approximate not in ("none", "tanh"):
        raise pdlkit.KernelUnsupported(f"approximate={approximate!r}")
    return _ACT[f"gelu:{approximate}"], ("gelu", approximate)


_LIB = _load()

if _LIB is not None:
    _run = _LIB.pdlkit_gbf16_run
    _empty = torch.empty
    _bf16 = torch.bfloat16
    _threads = torch.get_num_threads
    _onednn = torch.ops.mkldnn._linear_pointwise.default
    _parallel = bool(_LIB.pdlkit_gbf16_parallel())  # the GEMM runs on torch's OpenMP threads

    def _gemm(x: Tensor, p: _Packed, bias: Tensor | None) -> Tensor:
        k, n = p.k, p.n
        m = x.numel() // k
        if not _parallel and m * n * k >= PARALLEL_MIN_MACS and _threads() > 1:
            y = _onednn(x.reshape(-1, k), p.onednn_weight(), bias, p.post[0], [], p.post[1])
            return y.reshape(*x.shape[:-1], n)
        x, ldx = rows(x, k)
        out = _empty((*x.shape[:-1], n), dtype=_bf16)
        if m == 0:
            return out
        if bias is not None and not bias.is_contiguous():
            bias = bias.contiguous()
        rc = _run(
            x.data_ptr(), m, ldx, out.data_ptr(), n,
            None if bias is None else bias.data_ptr(), p.params_addr,
        )  # fmt: skip
        if rc:
            raise pdlkit.KernelUnsupported("this CPU has no AVX512_BF16")
        return out

    _DECL: dict[str, Any] = {
        "device": "cpu",
        "dtypes": {"x": [torch.bfloat16], "weight": [torch.bfloat16], "bias": [torch.bfloat16]},
        "shapes": {"weight": {"rank": 2}},
        "requires": ["avx512f", "avx512_bf16"],
        "priority": 10,  # before oneDNN's (1) and addmm's (0)
        "prepack_arg": "weight",
        "traits": ["deterministic"],
    }

    @pdlkit.kernel(implements="linear", prepack=_packer(lambda a: (0, ("none", ""))), **_DECL)
    def linear_bf16(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """x @ weight.T + bias in bf16 (float32 accumulation), one fused AVX512_BF16 GEMM."""
        return _gemm(x, weight, bias)  # type: ignore[arg-type]

    @pdlkit.kernel(implements="linear_relu", prepack=_packer(lambda a: (1, ("relu", ""))), **_DECL)
    def linear_relu_bf16(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """relu(x @ weight.T + bias) in bf16, one fused AVX512_BF16 GEMM."""
        return _gemm(x, weight, bias)  # type: ignore[arg-type]

    @pdlkit.kernel(implements="linear_gelu", prepack=_packer(_gelu_act), **_DECL)
    def linear_gelu_bf16(
        x: Tensor, weight: Tensor, bias: Tensor | None, approximate: str
    ) -> Tensor:
        """gelu(x @ weight.T + bias, approximate) in bf16, one fused AVX512_BF16 GEMM."""
        return _gemm(x, weight, bias)  # type: ignore[arg-type]
