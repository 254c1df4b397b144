"""int8 linear for PT2E graphs on x86 as one AVX-512 VNNI GEMM with the epilogue fused
(``qgemm_vnni.c``): ``qlinear_q`` (requantized uint8 / int8 output) and ``qlinear`` (float32);
``qlinear_add_layer_norm_q`` / ``qlinear_add_layer_norm``, a transformer block's output
projection with its residual add, LayerNorm and (optionally) the quantize of the next GEMM's
input in the epilogue (``patterns/x86/qlinear_add_layer_norm.pdl.mlir``);
``qkv_attention_q_merged``, a self-attention block's Q, K and V projections as one GEMM
followed, batch by batch, by attention.c's attention (``patterns/x86/qkv_attention.pdl.mlir``).

Per call: one C call reads the uint8 activations as they are (``vpdpbusd`` multiplies
unsigned by signed bytes), multiplies them with the weight pre-packed into 64-column panels,
and finishes every 6 x 64 tile in registers: zero-point correction, ``x_scale * w_scale[n]``,
bias, ReLU / GELU (erf or tanh), and the requantization (round half to even, like
``quantize_per_tensor``) or the float32 store. No [M, N] int32 intermediate, no pass over the
activations, no oneDNN primitive lookup per call.

Measured on one Zen 4 core against oneDNN's ``qlinear_pointwise`` with a pre-packed weight
(``benchmarks/x86_qlinear.py``, interleaved medians): 0.80-0.89x oneDNN's time on
bert-mini's GEMMs (427-442 GOP/s against a single-core limit of about 435), 0.15x at M = 8
(the pooler), where oneDNN's per-call cost (~25 us) dominates.

Threads: the library is built with ``-fopenmp`` where the compiler supports it and then
splits GEMMs of 2^21 multiply-adds or more over torch's own OpenMP threads (it links
``libgomp.so.1``, the runtime torch has loaded: ``torch.set_num_threads`` applies, no second
pool). Built without OpenMP, the GEMM is single-threaded and, when torch runs several
threads, GEMMs of ``PARALLEL_MIN_MACS`` multiply-adds or more go to oneDNN's parallel GEMM
instead (the kernel makes oneDNN's call itself, from a oneDNN-packed weight made on first
need: a declaration's shape rules cannot say "M * N * K at most" at compile time).

The library is built on first load with the host's C compiler
(:func:`pdlkit.runtime_abi.native_build.build_library`, cached by hash); on a host that is not
x86-64, or without a compiler, this file warns once and declares nothing.
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from pdlkit.kernels.x86._native_gemm import (
    int32_exact_k,
    load_gemm_library,
    rows,
    storage_alias,
)
from pdlkit.runtime_abi.dtypes import quantized_dtype
from torch import Tensor

import pdlkit

SOURCE = Path(__file__).resolve().with_name("qgemm_vnni.c")
_ACTS = {("none", ""): 0, ("none", "none"): 0, ("relu", ""): 1, ("relu", "none"): 1}
_ACTS.update({("gelu", "none"): 2, ("gelu", ""): 2, ("gelu", "tanh"): 3})
_POSTS = (("none", ""), ("relu", ""), ("gelu", "none"), ("gelu", "tanh"))  # by act code
_OUT_KIND = {torch.uint8: 0, torch.int8: 1, torch.float32: 2}

# Where the library was built without OpenMP and torch runs several threads, GEMMs of this many
# multiply-adds or more go to oneDNN's parallel GEMM: one core here takes M N K / 2.2e11 s,
# oneDNN on two about 25 us + M N K / 3.5e11 s, even at about 1.4e7 (bert-mini's
# 512 x 256 x 256 is 3.4e7).
PARALLEL_MIN_MACS = 1 << 24


class _Params(ctypes.Structure):
    """``pdlkit_qgemm_params`` of qgemm_vnni.c."""

    _fields_ = [
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("packed", ctypes.c_void_p),
        ("colcorr", ctypes.c_void_p),
        ("x_scale", ctypes.c_double),
        ("inv_out_scale", ctypes.c_float),
        ("x_zp", ctypes.c_int32),
        ("out_zp", ctypes.c_int32),
        ("qmin", ctypes.c_int32),
        ("qmax", ctypes.c_int32),
        ("act", ctypes.c_int32),
        ("out_kind", ctypes.c_int32),
        ("flags", ctypes.c_int32),  # QG_AMX | QG_S8
        ("colcorr_ss", ctypes.c_void_p),
    ]


QG_AMX, QG_S8 = 1, 2  # qgemm_vnni.c's flags: AMX tiles where the call allows; int8 activations


class _LnArgs(ctypes.Structure):
    """``pdlkit_qgemm_ln_args`` of qgemm_vnni.c: one call site's LayerNorm and codes."""

    _fields_ = [
        ("gamma", ctypes.c_void_p),
        ("beta", ctypes.c_void_p),
        ("eps", ctypes.c_double),
        ("inv_scale", ctypes.c_float),
        ("zp", ctypes.c_int32),
        ("qmin", ctypes.c_int32),
        ("qmax", ctypes.c_int32),
    ]


def _load() -> ctypes.CDLL | None:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    # x, m, ldx, out, ldo, w_scale, bias, w_zp, params
    lib = load_gemm_library(
        SOURCE,
        "qlinear_q_vnni / qlinear_vnni",
        "pdlkit_qgemm",
        _Params,
        [p, i64, i64, p, i64, p, p, p, p],
    )
    if lib is not None:
        if lib.pdlkit_qgemm_ln_args_size() != ctypes.sizeof(_LnArgs):
            warnings.warn(f"pdlkit: {SOURCE.name}: LayerNorm struct size mismatch", stacklevel=2)
            return None
        # x, m, ldx, out, ldo, w_scale, bias, w_zp, params, ln_args, res, ldr, codes, ldc
        run_ln = lib.pdlkit_qgemm_run_add_ln
        run_ln.argtypes, run_ln.restype = (
            [p, i64, i64, p, i64, p, p, p, p, p, p, i64, p, i64],
            ctypes.c_int,
        )
    return lib


class _Packed:
    """The pre-packed weight of one call site: the weight in the GEMM's panel layout, its
    column correction and the epilogue's constant parameters (one C struct); the weight's
    storage (aliased, not copied) for oneDNN's packed weight, made on first need."""

    __slots__ = (
        "__weakref__", "colcorr", "colsum", "n", "k", "onednn", "out_dtype", "packed", "params",
        "params_addr", "post", "s8", "w", "vectors",
    )  # fmt: skip

    def __init__(
        self, w_q: Tensor, attrs: Mapping[str, Any], out_dtype: torch.dtype, amx: bool = False
    ):
        """``amx``: the GEMM runs on AMX tiles where a call allows it (qgemm_amx.h), else on
        the VNNI path; the packed weight is the same."""
        assert _LIB is not None
        n, k = w_q.shape
        x_zp = int(attrs["x_zp"])
        # too long even for symmetric weights, with u8 or s8 activations (x_zp + 128 is the
        # zero point of s8 ones' u8 view); per call the C checks the one that applies and w_zp
        exact = max(int32_exact_k(x_zp), int32_exact_k(x_zp + 128))
        if k > exact:
            raise pdlkit.KernelUnsupported(
                f"K = {k}: sums of 8-bit products could overflow the int32 accumulator "
                f"(exact up to K = {exact} with x_zp {x_zp} and symmetric weights)"
            )
        self.w = storage_alias(w_q)
        wc = w_q.contiguous()
        self.packed = torch.empty(_LIB.pdlkit_qgemm_packed_size(n, k), dtype=torch.int8)
        _LIB.pdlkit_qgemm_pack(wc.data_ptr(), k, n, k, self.packed.data_ptr())
        self.colsum = wc.sum(dim=1, dtype=torch.int32)
        self.colcorr = (self.colsum * -x_zp).to(torch.int32).contiguous()
        self.n, self.k, self.out_dtype = n, k, out_dtype
        act = _ACTS[(str(attrs["post_op"]), str(attrs["algorithm"]))]
        self.post = _POSTS[act]
        self.onednn: Tensor | None = None
        out_scale = float(attrs.get("out_scale", 1.0))
        self.params = _Params(
            n=n,
            k=k,
            packed=self.packed.data_ptr(),
            colcorr=self.colcorr.data_ptr(),
            x_scale=float(attrs["x_scale"]),
            inv_out_scale=1.0 / out_scale,  # ctypes rounds to float, as quantize_per_tensor does
            x_zp=x_zp,
            out_zp=int(attrs.get("out_zp", 0)),
            qmin=int(attrs.get("out_qmin", 0)),
            qmax=int(attrs.get("out_qmax", 0)),
            act=act,
            out_kind=_OUT_KIND[out_dtype],
            flags=QG_AMX if amx else 0,
        )
        self.params_addr = ctypes.addressof(self.params)
        self.s8: tuple[Any, ...] | None = None  # the params for int8 activations, made on need
        # the last (w_scale, bias, w_zp) seen with their data pointers, as one tuple (threads
        # replace it whole): a compiled graph passes the same constant tensors in every call,
        # and three .contiguous().data_ptr() cost about 2.5 us per call
        self.vectors: tuple[Any, ...] = (None, None, None, ())

    def addr(self, x_q: Tensor) -> int:
        """The address of the C params for activations of ``x_q``'s dtype: uint8 as packed;
        int8 (symmetric quantizers' activations) with the correction of their u8 view
        ``x + 128`` (zero point ``x_zp + 128``) that the VNNI path multiplies, and TDPBSSD's
        own for the AMX path (made once per site)."""
        if x_q.dtype is torch.uint8:
            return self.params_addr
        if x_q.dtype is not torch.int8:
            raise pdlkit.KernelUnsupported(f"activations of dtype {x_q.dtype}")
        if self.s8 is None:
            x_zp = self.params.x_zp
            if self.k > int32_exact_k(x_zp + 128):
                raise pdlkit.KernelUnsupported(
                    f"K = {self.k}: sums of s8 x s8 products could overflow the int32 "
                    f"accumulator (exact up to K = {int32_exact_k(x_zp + 128)} with x_zp {x_zp})"
                )
            u8 = (self.colsum * -(x_zp + 128)).to(torch.int32).contiguous()
            ss = (self.colsum * -x_zp).to(torch.int32).contiguous()
            params = _Params.from_buffer_copy(self.params)
            params.colcorr, params.colcorr_ss = u8.data_ptr(), ss.data_ptr()
            params.flags |= QG_S8
            self.s8 = (ctypes.addressof(params), params, u8, ss)  # the vectors live with it
        return int(self.s8[0])

    def pointers(
        self, w_scale: Tensor | float, bias: Tensor | None, w_zp: Tensor | int
    ) -> tuple[Any, ...]:
        """Pointers to (w_scale, bias, w_zp) as the C reads them: [n] vectors (per-tensor
        weight parameters, numbers, become [n] vectors once per value)."""
        v = self.vectors
        if v[0] is w_scale and v[1] is bias and v[2] is w_zp:
            return v[3]
        if not isinstance(w_scale, Tensor):
            # by identity: a tuple compare would call a tensor's == on another bias
            if len(v) == 7 and v[4] == float(w_scale) and v[5] is bias and v[6] == int(w_zp):
                return v[3]
            full = torch.full((self.n,), float(w_scale), dtype=torch.float32)
            zps = torch.full((self.n,), int(w_zp), dtype=torch.int64) if int(w_zp) else None
            b = None if bias is None else bias.contiguous()
            ptrs: tuple[Any, ...] = (
                full.data_ptr(),
                None if b is None else b.data_ptr(),
                None if zps is None else zps.data_ptr(),
                (full, b, zps),
            )
            self.vectors = (None, None, None, ptrs, float(w_scale), bias, int(w_zp))
            return ptrs
        assert isinstance(w_zp, Tensor)
        vs = (w_scale.contiguous(), None if bias is None else bias.contiguous(), w_zp.contiguous())
        ptrs = tuple(None if t is None else t.data_ptr() for t in vs)
        if all(t is None or t.is_contiguous() for t in (w_scale, bias, w_zp)):
            self.vectors = (w_scale, bias, w_zp, ptrs)
            return ptrs
        return (*ptrs, vs)  # pointers into temporary copies: keep the copies alive with them

    def onednn_weight(self) -> Tensor:
        if self.onednn is None:  # racing threads pack the same thing; one of them is kept
            self.onednn = torch.ops.onednn.qlinear_prepack(self.w, None)
        return self.onednn

    def __sizeof__(self) -> int:  # what the pre-pack cache counts: the memory this adds
        own = self.packed.nbytes + self.colcorr.nbytes
        if self.onednn is not None:
            own += self.onednn.element_size() * self.onednn.numel()
        return own


def _check_post(attrs: Mapping[str, Any], k: int) -> None:
    post = (str(attrs["post_op"]), str(attrs["algorithm"]))
    if post not in _ACTS or k == 0:
        raise pdlkit.KernelUnsupported(f"post op {post}, K = {k}")


def _check_range(attrs: Mapping[str, Any]) -> None:
    qrange = (attrs["out_qmin"], attrs["out_qmax"])
    if qrange not in ((0, 255), (-128, 127)):
        raise pdlkit.KernelUnsupported(f"output range {qrange}")


def _pack_q(w_q: Tensor, attrs: Mapping[str, Any], amx: bool = False) -> _Packed:
    _check_post(attrs, w_q.shape[1])
    _check_range(attrs)
    return _Packed(w_q, attrs, quantized_dtype(int(attrs["out_qmin"])), amx)


def _pack_f32(w_q: Tensor, attrs: Mapping[str, Any], amx: bool = False) -> _Packed:
    _check_post(attrs, w_q.shape[1])
    return _Packed(w_q, attrs, torch.float32, amx)


_UNSET = object()


class _PackedLn(_Packed):
    """The pre-packed weight of an output projection with the add + LayerNorm epilogue: the
    GEMM part as for ``qlinear`` (float32, no activation), the site's LayerNorm and codes
    constants, and the last LayerNorm weight / bias seen with their C struct."""

    __slots__ = ("codes_dtype", "ln", "ln_const")

    def __init__(self, w_q: Tensor, attrs: Mapping[str, Any], amx: bool = False):
        super().__init__(w_q, {**attrs, "post_op": "none", "algorithm": ""}, torch.float32, amx)
        if list(attrs["normalized_shape"]) != [self.n]:
            raise pdlkit.KernelUnsupported(
                f"layer_norm over {list(attrs['normalized_shape'])}, not the GEMM's row [{self.n}]"
            )
        quantized = "out_scale" in attrs
        self.codes_dtype = quantized_dtype(int(attrs["out_qmin"])) if quantized else None
        self.ln_const = {
            "eps": float(attrs["eps"]),
            "inv_scale": 1.0 / float(attrs["out_scale"]) if quantized else 1.0,
            "zp": int(attrs["out_zp"]) if quantized else 0,
            "qmin": int(attrs["out_qmin"]) if quantized else 0,
            "qmax": int(attrs["out_qmax"]) if quantized else 0,
        }
        self.ln: tuple[Any, ...] = (_UNSET, _UNSET, None, 0)  # None is a valid weight / bias

    def ln_args(self, gamma: Tensor | None, beta: Tensor | None) -> int:
        """The address of the C struct for this LayerNorm weight and bias (made once per pair:
        a compiled graph passes the same constants in every call). The struct, once made, is
        never written (threads may be reading it): another pair gets a new one."""
        ln = self.ln
        if ln[0] is gamma and ln[1] is beta:
            return ln[3]
        if any(t is not None and not t.is_contiguous() for t in (gamma, beta)):
            raise pdlkit.KernelUnsupported("a non-contiguous LayerNorm weight or bias")
        args = _LnArgs(
            gamma=None if gamma is None else gamma.data_ptr(),
            beta=None if beta is None else beta.data_ptr(),
            **self.ln_const,
        )
        self.ln = (gamma, beta, args, ctypes.addressof(args))
        return self.ln[3]


def _pack_ln(w_q: Tensor, attrs: Mapping[str, Any], amx: bool = False) -> _PackedLn:
    if w_q.shape[1] == 0:
        raise pdlkit.KernelUnsupported("K = 0")
    if "out_qmin" in attrs:
        _check_range(attrs)
    return _PackedLn(w_q, attrs, amx)


_LIB = _load()

if _LIB is not None:
    _run = _LIB.pdlkit_qgemm_run
    _empty = torch.empty
    _threads = torch.get_num_threads
    _onednn = torch.ops.onednn.qlinear_pointwise.default
    _parallel = bool(_LIB.pdlkit_qgemm_parallel())  # the GEMM runs on torch's OpenMP threads

    def _failed(rc: int) -> None:
        """What a non-zero return of the library's run functions means."""
        if rc == 1:
            raise pdlkit.KernelUnsupported("this CPU has no AVX-512 VNNI")
        if rc == 3:
            raise pdlkit.KernelUnsupported(
                "a scale or bias is not finite, or so large that the epilogue could overflow "
                "float32: the reference runs (its NaN / inf results are torch's)"
            )
        if rc == 4:
            raise pdlkit.KernelUnsupported(
                "K is too long for exact int32 sums with these zero points: they could "
                "overflow the int32 accumulator (qgemm_vnni.c, k_fits)"
            )
        if rc == 5:
            raise pdlkit.KernelUnsupported(
                "a row of linear(x) + residual holds a NaN, an infinity or a value past about "
                "1.8e19, where torch's LayerNorm gives NaN: the reference runs"
            )
        if rc < 0:
            raise MemoryError("qgemm_vnni: out of memory for the weight zero-point terms")
        raise RuntimeError(f"qgemm_vnni: the pre-packed parameters do not fit this entry (rc {rc})")

    def _gemm(
        x_q: Tensor,
        x_scale: float,
        x_zp: int,
        p: _Packed,
        w_scale: Tensor,
        w_zp: Tensor,
        bias: Tensor | None,
        out_scale: float,
        out_zp: int,
    ) -> Tensor:
        """One call of either op (the pre-pack fixed the output kind)."""
        k, n = p.k, p.n
        m = x_q.numel() // k  # k > 0: the pre-pack declines K = 0
        if (
            not _parallel
            and m * n * k >= PARALLEL_MIN_MACS
            and _threads() > 1
            and x_q.dtype is torch.uint8
            and isinstance(w_zp, Tensor)
            and not bool(w_zp.any())  # oneDNN ignores weight zero points (qlinear_onednn.py)
        ):
            return _onednn(
                x_q, x_scale, x_zp, p.onednn_weight(), w_scale, w_zp, bias, out_scale, out_zp,
                p.out_dtype, p.post[0], [], p.post[1],
            )  # fmt: skip
        x_q, ldx = rows(x_q, k)
        out = _empty((*x_q.shape[:-1], n), dtype=p.out_dtype)
        if m == 0:
            return out
        ptrs = p.pointers(w_scale, bias, w_zp)  # a 4th item keeps temporary copies alive
        rc = _run(x_q.data_ptr(), m, ldx, out.data_ptr(), n, ptrs[0], ptrs[1], ptrs[2], p.addr(x_q))
        if rc:
            _failed(rc)
        return out

    _DECL: dict[str, Any] = {
        "device": "cpu",
        "shapes": {"w_q": {"rank": 2}, "w_scale": {"rank": 1}, "w_zp": {"rank": 1}},
        "requires": ["avx512f", "avx512_vnni"],
        "priority": 10,  # before the oneDNN kernels (0)
        "prepack_arg": "w_q",
        "traits": ["deterministic"],
    }
    _DTYPES = {
        "x_q": [torch.uint8, torch.int8],  # int8: symmetric quantizers' activations (x + 128)
        "w_q": [torch.int8],
        "w_scale": [torch.float32],
        "w_zp": [torch.int64],
        "bias": [torch.float32],
    }

    @pdlkit.kernel(implements="qlinear_q", dtypes=_DTYPES, prepack=_pack_q, **_DECL)
    def qlinear_q_vnni(
        x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, out_scale, out_zp, *rest
    ) -> Tensor:
        """quantize(act(dequantize(x_q) @ dequantize(w_q).T + bias)) in one fused VNNI GEMM;
        w_q arrives packed (:class:`_Packed`)."""
        return _gemm(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, out_scale, out_zp)

    @pdlkit.kernel(implements="qlinear", dtypes=_DTYPES, prepack=_pack_f32, **_DECL)
    def qlinear_vnni(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, *rest) -> Tensor:
        """act(dequantize(x_q) @ dequantize(w_q).T + bias) in float32, in one fused VNNI GEMM;
        w_q arrives packed (:class:`_Packed`)."""
        return _gemm(x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, 1.0, 0)

    _run_ln = _LIB.pdlkit_qgemm_run_add_ln
    _f32 = torch.float32

    def _gemm_add_ln(
        x_q: Tensor,
        p: _PackedLn,
        w_scale: Tensor,
        w_zp: Tensor,
        bias: Tensor | None,
        residual: Tensor,
        ln_weight: Tensor | None,
        ln_bias: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """One call of either LayerNorm op: the float32 result and, where the pre-pack says
        so, its codes. Single-threaded where the library was built without OpenMP."""
        k, n = p.k, p.n
        x_q, ldx = rows(x_q, k)
        shape = (*x_q.shape[:-1], n)
        if residual.shape != shape or residual.dtype is not _f32:
            raise pdlkit.KernelUnsupported(
                f"residual {tuple(residual.shape)} {residual.dtype}, output {shape} float32"
            )
        res, ldr = rows(residual, n)
        out = _empty(shape, dtype=_f32)
        codes = None if p.codes_dtype is None else _empty(shape, dtype=p.codes_dtype)
        m = x_q.numel() // k
        if m == 0:
            return out, codes
        ptrs = p.pointers(w_scale, bias, w_zp)
        rc = _run_ln(
            x_q.data_ptr(), m, ldx, out.data_ptr(), n, ptrs[0], ptrs[1], ptrs[2], p.addr(x_q),
            p.ln_args(ln_weight, ln_bias), res.data_ptr(), ldr,
            None if codes is None else codes.data_ptr(), n,
        )  # fmt: skip
        if rc:
            _failed(rc)
        return out, codes

    _LN_DTYPES = {**_DTYPES, "residual": [torch.float32], "ln_weight": [torch.float32]}
    _LN_DTYPES["ln_bias"] = [torch.float32]

    @pdlkit.kernel(
        implements="qlinear_add_layer_norm_q",
        dtypes=_LN_DTYPES,
        prepack=_pack_ln,
        **_DECL,
    )
    def qlinear_add_layer_norm_q_vnni(
        x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, residual, normalized_shape, ln_weight,
        ln_bias, *rest,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """``(y, quantize_per_tensor(y))`` for ``y = layer_norm(qlinear(x) + residual)`` in
        one VNNI GEMM whose row blocks finish with the add, the LayerNorm and the codes while
        they are in L1; w_q arrives packed (:class:`_PackedLn`)."""
        out, codes = _gemm_add_ln(x_q, w_q, w_scale, w_zp, bias, residual, ln_weight, ln_bias)
        assert codes is not None
        return out, codes

    @pdlkit.kernel(
        implements="qlinear_add_layer_norm",
        dtypes=_LN_DTYPES,
        prepack=_pack_ln,
        **_DECL,
    )
    def qlinear_add_layer_norm_vnni(
        x_q, x_scale, x_zp, w_q, w_scale, w_zp, bias, residual, normalized_shape, ln_weight,
        ln_bias, *rest,
    ) -> Tensor:  # fmt: skip
        """``layer_norm(qlinear(x) + residual)`` in one VNNI GEMM (the last block of an
        encoder, whose LayerNorm is not quantized); w_q arrives packed (:class:`_PackedLn`)."""
        return _gemm_add_ln(x_q, w_q, w_scale, w_zp, bias, residual, ln_weight, ln_bias)[0]


# -- Q, K, V projections + attention: one GEMM for the three, then attention.c on its output --

_NOT_FINITE_ATTENTION = (
    "a value of q, k, v, a score or the mask is not finite (NaN or inf; a mask's -inf is fine): "
    "the reference runs, whose NaN / inf results are torch's"
)


class _AttnParams(ctypes.Structure):
    """``attn_params`` of attention.c."""

    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("qs", ctypes.c_int64 * 3),
        ("ks", ctypes.c_int64 * 3),
        ("vs", ctypes.c_int64 * 3),
        ("B", ctypes.c_int64),
        ("H", ctypes.c_int64),
        ("Sq", ctypes.c_int64),
        ("Sk", ctypes.c_int64),
        ("D", ctypes.c_int64),
        ("mask", ctypes.c_void_p),
        ("mask_float", ctypes.c_int),
        ("ms", ctypes.c_int64 * 4),
        ("causal", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("inv_out_scale", ctypes.c_float),
        ("zp", ctypes.c_int32),
        ("qmin", ctypes.c_int32),
        ("qmax", ctypes.c_int32),
        ("out", ctypes.c_void_p),
        ("os", ctypes.c_int64 * 3),
    ]


ATTENTION_SOURCE = SOURCE.with_name("attention.c")


def _load_attention() -> ctypes.CDLL | None:
    if _LIB is None:
        return None
    from pdlkit.runtime_abi.native_build import load_c_library

    # the library attention.py registers (same source and flags: the same cached file)
    lib = load_c_library(
        ATTENTION_SOURCE,
        "x86_64",
        "qkv_attention_q_merged_vnni",
        ("-fopenmp",),
        ("pdlkit_attention_params_size", ctypes.sizeof(_AttnParams)),
    )
    if lib is not None:
        p = ctypes.c_void_p
        # template, gemm, x, ldx, vectors, params, scratch, mask, out
        lib.pdlkit_attention_run_qkv.argtypes = [p, p, p, ctypes.c_int64, p, p, p, p, p]
        lib.pdlkit_attention_run_qkv.restype = ctypes.c_int32
    return lib


class _PackedQkv(_Packed):
    """The Q, K and V weights ([N, K] each) packed as one [3 N, K] GEMM, whose float32 output
    rows hold q | k | v side by side (head views of it are what attention.c reads); the
    attention's constants; the last (scales, zero points, biases) seen, concatenated; the
    attention's parameter struct per activation shape and mask geometry."""

    __slots__ = ("attn", "codes_dtype", "d", "joined", "templates")

    def __init__(self, wq: Tensor, attrs: Mapping[str, Any]):
        wk, wv = attrs["wk"], attrs["wv"]
        if wk.shape != wq.shape or wv.shape != wq.shape or wq.shape[1] == 0:
            raise pdlkit.KernelUnsupported(
                f"Q, K, V weights {[tuple(w.shape) for w in (wq, wk, wv)]}: not one [N, K > 0]"
            )
        _check_range(attrs)
        out_scale = float(attrs["out_scale"])
        if not 0.0 < out_scale < float("inf"):
            raise pdlkit.KernelUnsupported(f"out_scale {out_scale}")
        gemm = {**attrs, "post_op": "none", "algorithm": ""}
        del gemm["out_scale"]  # the GEMM's output is float32: the codes are attention's
        super().__init__(torch.cat((wq, wk, wv)), gemm, torch.float32)
        self.n //= 3  # the GEMM's params keep 3 N
        self.d = d = _head_dim(attrs["head_shape"], self.n)
        scale = float(attrs["scale"])
        self.codes_dtype = quantized_dtype(int(attrs["out_qmin"]))
        self.attn = {
            "scale": scale if scale > 0.0 else d**-0.5,
            "inv_out_scale": 1.0 / out_scale,
            "zp": int(attrs["out_zp"]),
            "qmin": int(attrs["out_qmin"]),
            "qmax": int(attrs["out_qmax"]),
            "causal": int(bool(attrs["is_causal"])),
        }
        self.joined: tuple[Any, ...] = ((), ())
        self.templates: dict[Any, tuple[_AttnParams, int]] = {}

    def vectors3(self, parts: tuple[Tensor | None, ...]) -> int:
        """The address of a C array of pointers to (w_scale, bias, w_zp) of the three
        projections joined: made once per set of tensors (a compiled graph passes the same
        constants in every call)."""
        last, addr = self.joined
        if len(last) == 9 and all(a is b for a, b in zip(last, parts, strict=True)):
            return addr[0]
        scales, biases, zps = parts[0:9:3], parts[1:9:3], parts[2:9:3]
        n = self.n
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([torch.zeros(n) if b is None else b.float() for b in biases])
        joined = (torch.cat(cast(Any, scales)).float(), bias, torch.cat(cast(Any, zps)).long())
        array = (ctypes.c_void_p * 3)(*(None if t is None else t.data_ptr() for t in joined))
        # the joined copies live as long as the pointers to them
        self.joined = (parts, (ctypes.addressof(array), array, joined))
        return self.joined[1][0]

    def template(self, b: int, s: int, mask: Tensor | None) -> int:
        """The address of attention.c's parameters for [b, s] activations and this mask's
        geometry (made once per geometry; a call sets only the pointers)."""
        key = (b, s) if mask is None else (b, s, mask.shape, mask.stride(), mask.dtype)
        hit = self.templates.get(key)
        if hit is not None:
            return hit[1]
        n, d = self.n, self.d
        h = n // d
        a = _AttnParams(B=b, H=h, Sq=s, Sk=s, D=d, **self.attn)
        for st in (a.qs, a.ks, a.vs):  # head views of one batch's [s, 3 n] GEMM output
            st[0], st[1], st[2] = 0, d, 3 * n
        a.os[0], a.os[1], a.os[2] = s * n, d, n  # out[b, i, h d + j]
        if mask is not None:
            if mask.dim() != 4 or mask.dtype not in (torch.bool, torch.float32):
                raise pdlkit.KernelUnsupported(f"attn_mask {mask.dtype} of rank {mask.dim()}")
            for dim, (size, want) in enumerate(zip(mask.shape, (b, h, s, s), strict=True)):
                if size not in (1, want):
                    raise pdlkit.KernelUnsupported(
                        f"attn_mask dim {dim} is {size}, not 1 or {want}"
                    )
                a.ms[dim] = 0 if size == 1 else mask.stride(dim)
            if s == 1:
                a.ms[3] = 1  # one column: its stride is irrelevant
            a.mask_float = int(mask.dtype is torch.float32)
        if len(self.templates) >= 16:  # shapes that keep changing: keep the latest
            self.templates.clear()
        self.templates[key] = (a, ctypes.addressof(a))
        return self.templates[key][1]


def _head_dim(head_shape: Any, n: int) -> int:
    """D of a ``view(B, S, H, D)`` (B, S or H may be -1) of [B, S, N] projections."""
    shape = list(head_shape)
    d = int(shape[-1]) if len(shape) == 4 else -1
    if d <= 0 or n % d or int(shape[2]) not in (-1, n // d):
        raise pdlkit.KernelUnsupported(f"view {shape} does not split N = {n} into heads")
    return d


def _pack_qkv(wq: Tensor, attrs: Mapping[str, Any]) -> _PackedQkv:
    return _PackedQkv(wq, attrs)


_ATTN = _load_attention()

if _ATTN is not None:
    _run_qkv = _ATTN.pdlkit_attention_run_qkv
    assert _LIB is not None  # _ATTN is loaded only beside it
    _GEMM_FN = ctypes.cast(_LIB.pdlkit_qgemm_run, ctypes.c_void_p).value  # what it calls per batch

    @pdlkit.kernel(
        implements="qkv_attention_q_merged",
        dtypes={
            "x_q": [torch.uint8],
            **{f"w{p}": [torch.int8] for p in "qkv"},
            **{f"s{p}": [torch.float32] for p in "qkv"},
            **{f"z{p}": [torch.int64] for p in "qkv"},
            **{f"b{p}": [torch.float32] for p in "qkv"},
            "attn_mask": [torch.bool, torch.float32],
        },
        shapes={"x_q": {"rank": 3}, **{f"w{p}": {"rank": 2} for p in "qkv"}},
        requires=["avx512f", "avx512_vnni", "avx512_bf16"],
        priority=10,
        prepack=_pack_qkv,
        prepack_arg="wq",
        prepack_with=("wk", "wv"),
        traits=["deterministic"],
    )
    def qkv_attention_q_merged_vnni(
        x_q, x_scale, x_zp, wq, sq, zq, bq, wk, sk, zk, bk, wv, sv, zv, bv, head_shape,
        attn_mask, *rest,
    ) -> Tensor:  # fmt: skip
        """The Q, K and V projections of a self-attention block as one VNNI GEMM (N = 3 H D)
        into float32 rows ``q | k | v``, then attention.c's AVX512_BF16 attention on head
        views of those rows, its codes stored as [B, S, H * D]; wq arrives packed with wk and
        wv (:class:`_PackedQkv`). One call where the graph had four (three GEMMs and the
        attention), with no [B, H, S, D] copies."""
        p: _PackedQkv = wq
        b, s, k = x_q.shape
        if k != p.k or head_shape[0] not in (-1, b) or head_shape[1] not in (-1, s):
            raise pdlkit.KernelUnsupported(f"view {list(head_shape)} of [{b}, {s}, {p.n}]")
        n, m = p.n, b * s
        out = _empty((b, s, n), dtype=p.codes_dtype)
        if m == 0:
            return out
        tmpl = p.template(b, s, attn_mask)
        x = x_q if x_q.is_contiguous() else x_q.contiguous()
        scratch = _empty((s, 3 * n), dtype=_f32)  # one batch's q | k | v rows
        vectors = p.vectors3((sq, bq, zq, sk, bk, zk, sv, bv, zv))
        mask = None if attn_mask is None else attn_mask.data_ptr()
        rc = _run_qkv(
            tmpl, _GEMM_FN, x.data_ptr(), k, vectors, p.params_addr, scratch.data_ptr(), mask,
            out.data_ptr(),
        )  # fmt: skip
        if rc >= 10:
            _failed(rc - 10)
        if rc == 1:
            raise pdlkit.KernelUnsupported("this CPU lacks AVX512F / AVX512BW / AVX512_BF16")
        if rc == 3:
            raise pdlkit.KernelUnsupported(_NOT_FINITE_ATTENTION)
        if rc:
            raise MemoryError("attention.c: no memory for its scratch")
        return out
