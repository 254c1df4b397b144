"""What the two ctypes GEMM kernel files of this folder (``qlinear_vnni.py``,
``linear_bf16.py``) do alike: load their library, handle their tensors. Not a kernel file (the registry skips
``_*.py``)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from pdlkit.runtime_abi.native_build import host_arch
from torch import Tensor


def load_gemm_library(
    source: Path, what: str, prefix: str, params: type[ctypes.Structure], run_args: list[Any]
) -> ctypes.CDLL | None:
    """Build and load one of this folder's GEMM libraries and declare its entry points, which
    the C side names alike: ``<prefix>_init`` (tables, called here, before any call),
    ``_parallel``, ``_packed_size``, ``_pack``, ``_run`` / ``_run_scalar`` (argument types
    ``run_args``) and ``_params_size`` (checked against ``params``). None off x86-64 or when
    the build fails (:func:`load_c_library` warns once)."""
    if host_arch() != "x86_64":
        return None  # nothing to declare: the kernels are x86-64 code
    from pdlkit.runtime_abi.native_build import load_c_library

    # -fopenmp: on torch's OpenMP threads where the compiler has OpenMP, else single-threaded
    lib = load_c_library(
        source, "x86_64", what, ("-fopenmp",), (f"{prefix}_params_size", ctypes.sizeof(params))
    )
    if lib is None:
        return None
    getattr(lib, f"{prefix}_init")()
    getattr(lib, f"{prefix}_parallel").restype = ctypes.c_int
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    size = getattr(lib, f"{prefix}_packed_size")
    size.argtypes, size.restype = [i64, i64], i64
    pack = getattr(lib, f"{prefix}_pack")
    pack.argtypes, pack.restype = [p, i64, i64, i64, p], None
    for name in ("_run", "_run_scalar"):
        f = getattr(lib, prefix + name)
        f.argtypes, f.restype = run_args, ctypes.c_int
    return lib


INT32_MAX = 2**31 - 1


def int32_exact_k(x_zp: int, w_zp_lo: int = 0, w_zp_hi: int = 0) -> int:
    """The longest K for which every ``sum_k (x - x_zp) (w - w_zp)`` over uint8 ``x`` and int8
    ``w`` (``w_zp`` in ``[w_zp_lo, w_zp_hi]``) fits in int32, so that an int32 accumulator
    (which wraps modulo 2^32, as VNNI's ``vpdpbusd`` does) ends on the exact sum. Each term is
    at most ``A * B`` in magnitude, ``A = max(|x_zp|, |255 - x_zp|)``, ``B = max(w_zp_hi + 128,
    127 - w_zp_lo)``, and x = 0 or 255 with w = -128 throughout reaches it: 65793 for symmetric
    weights and any x_zp in [0, 255], 131071 for x_zp = 128, 33025 for any 8-bit zero points."""
    a = max(abs(x_zp), abs(255 - x_zp))
    b = max(w_zp_hi + 128, 127 - w_zp_lo)
    return INT32_MAX // (a * b)  # a >= 128, b >= 128


def storage_alias(t: Tensor) -> Tensor:
    """A tensor over ``t``'s storage that holds no reference to ``t`` itself: a pre-pack can
    keep it (for oneDNN's packed copy, made on first need) while the pre-pack cache still
    drops the entry when ``t`` dies, and an in-place update of ``t`` still bumps the version
    the cache checks."""
    return t.new_empty(0).set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def rows(x: Tensor, k: int) -> tuple[Tensor, int]:
    """``(x, ldx)`` for a C GEMM that reads rows of ``k`` contiguous elements ``ldx`` apart:
    a 2-D ``x`` whose rows are contiguous is read in place (BERT's pooler input ``x[:, 0]``
    is a strided ``[B, K]`` view); anything else is made contiguous (a copy only if it is not)."""
    if x.dim() == 2 and x.stride(1) == 1 and x.stride(0) >= k:
        return x, x.stride(0)
    return (x if x.is_contiguous() else x.contiguous()), k
