"""int8 linear with requantized output (``qlinear_q``) for PT2E graphs on x86, as
``torch._int_mm`` plus one native epilogue pass.

Per call: the uint8 activations become int8 (``x ^ 0x80 = x - 128``, a C loop), one
``torch._int_mm(x_s8, w.t())`` computes the int32 products with the weight stored ``[N, K]``,
and one C pass (``int8_epilogue.c``) adds the zero-point correction
``(128 - x_zp) * colsum_w[n]``, scales by ``x_scale * w_scale[n]``, adds the bias, applies
ReLU / GELU (erf or tanh) and requantizes to uint8 / int8, rounding half to even like
``quantize_per_tensor``. Asymmetric weights (some ``w_zp[n] != 0``) are handled in the same
pass (``- w_zp[n] * (rowsum_x[m] - K * x_zp)``). The pre-pack keeps the weight (aliased, not
copied) and the column correction, and the epilogue's constant parameters as one C struct.

Measured against ``qlinear_q_onednn`` on one Zen 4 core (``benchmarks/x86_qlinear.py``,
interleaved medians): bert-mini's FFN GEMM with GELU (512 x 256 x 1024) 8% faster with erf,
18% with tanh (about 840 against 930 us per call inside the compiled model); 2.5-3x faster at
small M (1 x 256 x 1024, 7 x 33 x 17), where oneDNN's per-call cost (~25 us) dominates;
within +-4% without an activation. Where oneDNN wins (weights over ``INTMM_MAX_WEIGHT``
elements, for which ``_int_mm`` handles the weight anew in every call, and large outputs
when torch runs several threads, since the epilogue is single-threaded) the kernel makes
oneDNN's call itself, from a oneDNN-packed weight kept in its pre-pack: a declaration's
shape rules cannot say "N * K at most" at compile time.

The library is built on first load with the host's C compiler
(:func:`pdlkit.runtime_abi.native_build.build_library`, cached by hash); on a host that is not
x86-64, or without a compiler, this file warns once and declares nothing.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pdlkit.kernels._qlinear_meta import qlinear_q_meta, quantized_dtype
from pdlkit.runtime_abi.native_build import host_arch
from torch import Tensor

import pdlkit

SOURCE = Path(__file__).resolve().with_name("int8_epilogue.c")
_ACTS = {("none", ""): 0, ("none", "none"): 0, ("relu", ""): 1, ("relu", "none"): 1}
_ACTS.update({("gelu", "none"): 2, ("gelu", ""): 2, ("gelu", "tanh"): 3})
_OUT_KIND = {torch.uint8: 0, torch.int8: 1, torch.float32: 2}


class _Params(ctypes.Structure):
    """``pdlkit_qepi_params`` of int8_epilogue.c."""

    _fields_ = [
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("colcorr", ctypes.c_void_p),
        ("x_scale", ctypes.c_double),
        ("inv_out_scale", ctypes.c_float),
        ("x_zp", ctypes.c_int32),
        ("out_zp", ctypes.c_int32),
        ("qmin", ctypes.c_int32),
        ("qmax", ctypes.c_int32),
        ("act", ctypes.c_int32),
        ("out_kind", ctypes.c_int32),
        ("pad_", ctypes.c_int32),
    ]


def _load() -> ctypes.CDLL | None:
    if host_arch() != "x86_64":
        return None  # nothing to declare: the kernel needs x86-64's VNNI _int_mm
    from pdlkit.runtime_abi.native_build import BuildError, build_library

    try:
        lib = ctypes.CDLL(str(build_library(SOURCE, "x86_64")))
    except (BuildError, OSError) as e:
        warnings.warn(
            f"pdlkit: {SOURCE.name} could not be built, qlinear_q_intmm is not declared: {e}",
            stacklevel=2,
        )
        return None
    if lib.pdlkit_qepi_params_size() != ctypes.sizeof(_Params):
        warnings.warn(f"pdlkit: {SOURCE.name}: parameter struct size mismatch", stacklevel=2)
        return None
    lib.pdlkit_qepi_init()  # the GELU tables, before any call
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.pdlkit_u8_to_s8.argtypes = [p, i64, p, i64, i64]
    lib.pdlkit_u8_to_s8.restype = None
    for f in (lib.pdlkit_qepi_run, lib.pdlkit_qepi_run_scalar):
        # acc, rows, out, ldo, w_scale, bias, w_zp, x, ldx, params
        f.argtypes = [p, i64, p, i64, p, p, p, p, i64, p]
        f.restype = ctypes.c_int
    return lib


# Where oneDNN is faster (measured on one Zen 4 core, benchmarks/x86_qlinear.py), the kernel
# calls oneDNN itself, so that choosing it never costs: torch._int_mm handles the weight anew
# in every call, which costs more than it saves beyond about half a million weight elements
# (768 x 3072: 1.05-2x slower than oneDNN, most at small M); and with several threads the
# single-threaded epilogue loses to oneDNN's parallel one on large outputs.
INTMM_MAX_WEIGHT = 1 << 19  # N * K
SERIAL_MAX_OUTPUT = 1 << 18  # M * N, when torch runs more than one thread
SCRATCH_MAX_OUTPUT = 1 << 22  # M * N: larger products get a fresh buffer per call


class _Packed:
    """The pre-packed weight of one call site: the weight [N, K] (its storage, not a copy) for
    ``_int_mm(x, wt)``, the column correction and the epilogue's parameters; and oneDNN's packed
    weight where oneDNN runs instead (made at pre-pack time for large weights, else on first
    need)."""

    __slots__ = (
        "__weakref__", "colcorr", "copied", "k", "n", "onednn", "out_dtype", "params", "params_addr",
        "post", "w", "wt",
    )  # fmt: skip

    def __init__(self, w_q: Tensor, attrs: Mapping[str, Any], out_dtype: torch.dtype):
        n, k = w_q.shape
        if w_q.is_contiguous():
            # the weight's storage without a reference to the weight tensor itself: the
            # pre-pack cache drops this entry when the weight dies (weakref), and an in-place
            # update bumps the weight's version, which packs again (new column sums)
            w = torch.empty(0, dtype=torch.int8).set_(
                w_q.untyped_storage(), w_q.storage_offset(), (n, k), (k, 1)
            )
        else:
            w = w_q.contiguous()
        self.copied = not w_q.is_contiguous()
        x_zp = int(attrs["x_zp"])
        colsum = w_q.sum(dim=1, dtype=torch.int32)
        self.colcorr = (colsum * (128 - x_zp)).to(torch.int32).contiguous()
        self.w, self.wt, self.n, self.k, self.out_dtype = w, w.t(), n, k, out_dtype
        post = (str(attrs["post_op"]), str(attrs["algorithm"]))
        act = _ACTS[post]
        self.post = (("none", ""), ("relu", ""), ("gelu", "none"), ("gelu", "tanh"))[act]
        self.onednn: Tensor | None = None
        if n * k > INTMM_MAX_WEIGHT:
            self.onednn = torch.ops.onednn.qlinear_prepack(w, None)
        out_scale = float(attrs.get("out_scale", 1.0))
        self.params = _Params(
            n=n,
            k=k,
            colcorr=self.colcorr.data_ptr(),
            x_scale=float(attrs["x_scale"]),
            inv_out_scale=1.0 / out_scale,  # ctypes rounds to float, as quantize_per_tensor does
            x_zp=x_zp,
            out_zp=int(attrs.get("out_zp", 0)),
            qmin=int(attrs.get("out_qmin", 0)),
            qmax=int(attrs.get("out_qmax", 0)),
            act=act,
            out_kind=_OUT_KIND[out_dtype],
        )
        self.params_addr = ctypes.addressof(self.params)

    def onednn_weight(self) -> Tensor:
        if self.onednn is None:  # racing threads pack the same thing; one of them is kept
            self.onednn = torch.ops.onednn.qlinear_prepack(self.w, None)
        return self.onednn

    def __sizeof__(self) -> int:  # what the pre-pack cache counts: the memory this adds
        own = self.colcorr.nbytes + (self.w.nbytes if self.copied else 0)
        if self.onednn is not None:
            own += self.onednn.element_size() * self.onednn.numel()
        return own


def _pack_q(w_q: Tensor, attrs: Mapping[str, Any]) -> _Packed:
    post = (str(attrs["post_op"]), str(attrs["algorithm"]))
    qrange = (attrs["out_qmin"], attrs["out_qmax"])
    if post not in _ACTS or qrange not in ((0, 255), (-128, 127)) or w_q.shape[1] == 0:
        raise pdlkit.KernelUnsupported(f"post op {post}, output range {qrange}, K = {w_q.shape[1]}")
    return _Packed(w_q, attrs, quantized_dtype(int(attrs["out_qmin"])))


_LIB = _load()

if _LIB is not None:
    _xor = _LIB.pdlkit_u8_to_s8
    _run = _LIB.pdlkit_qepi_run
    _int_mm = torch._int_mm
    _empty = torch.empty
    _i8, _i32 = torch.int8, torch.int32
    _local = threading.local()
    _threads = torch.get_num_threads
    _onednn = torch.ops.onednn.qlinear_pointwise.default

    @pdlkit.kernel(
        op="qlinear_q",
        meta=qlinear_q_meta,
        device="cpu",
        dtypes={
            "x_q": [torch.uint8],
            "w_q": [torch.int8],
            "w_scale": [torch.float32],
            "w_zp": [torch.int64],
            "bias": [torch.float32],
        },
        shapes={"w_q": {"rank": 2}, "w_scale": {"rank": 1}, "w_zp": {"rank": 1}},
        requires=["avx512f", "avx512_vnni"],
        priority=10,  # before qlinear_q_onednn (0)
        prepack=_pack_q,
        prepack_arg="w_q",
        traits=["deterministic"],
    )
    def qlinear_q_intmm(
        x_q: Tensor,
        x_scale: float,
        x_zp: int,
        w_q: Tensor,
        w_scale: Tensor,
        w_zp: Tensor,
        bias: Tensor | None,
        out_scale: float,
        out_zp: int,
        out_qmin: int,
        out_qmax: int,
        post_op: str,
        algorithm: str,
    ) -> Tensor:
        """quantize(act(dequantize(x_q) @ dequantize(w_q).T + bias)) as x ^ 0x80, _int_mm and
        one C epilogue (oneDNN where it is faster); w_q arrives packed (:class:`_Packed`)."""
        p: _Packed = w_q  # type: ignore[assignment]
        k, n = p.k, p.n
        m = x_q.numel() // k
        w1 = p.onednn
        if w1 is not None or (m * n >= SERIAL_MAX_OUTPUT and _threads() > 1):
            return _onednn(
                x_q, x_scale, x_zp, w1 if w1 is not None else p.onednn_weight(), w_scale, w_zp,
                bias, out_scale, out_zp, p.out_dtype, p.post[0], [], p.post[1],
            )  # fmt: skip
        if not x_q.is_contiguous():
            x_q = x_q.contiguous()
        out = _empty((*x_q.shape[:-1], n), dtype=p.out_dtype)
        if m == 0:
            return out
        # the int8 activations and int32 products live in per-thread scratch buffers: fresh
        # megabyte-sized buffers per call come back from the allocator as new pages, and
        # faulting them in cost more than the whole epilogue inside a model (bert-mini)
        key = (m, k, n)
        try:
            bufs = _local.bufs
        except AttributeError:
            bufs = _local.bufs = {}
        pair = bufs.get(key)
        if pair is None:
            pair = (_empty((m, k), dtype=_i8), _empty((m, n), dtype=_i32))
            if m * n <= SCRATCH_MAX_OUTPUT:
                if len(bufs) >= 8:
                    bufs.clear()
                bufs[key] = pair
        xs, acc = pair
        xp = x_q.data_ptr()
        _xor(xp, k, xs.data_ptr(), m, k)
        _int_mm(xs, p.wt, out=acc)
        _run(
            acc.data_ptr(), m, out.data_ptr(), n, w_scale.contiguous().data_ptr(),
            None if bias is None else bias.contiguous().data_ptr(),
            w_zp.contiguous().data_ptr(), xp, k, p.params_addr,
        )  # fmt: skip
        return out
