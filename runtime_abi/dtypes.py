"""The one dtype table: torch dtypes, their Torch-dialect codes and MLIR spellings, the names
users write, and what a quantized output's range says about its dtype.

    before: has_dtype(%x, "int8") compared an element type against a matcher-private alias
            table; a kernel decoded a dtype operand through pdlkit.matcher.to_mlir
    after:  DTYPES below; dtype_from_code(15) is torch.bfloat16, mlir_name("int8") is "si8",
            torch_name("si8") is "int8" (no torch_mlir needed: kernels import this at run time)

A dtype constant reaches a kernel through ``pdlkit_call`` as the importer numbered it: c10's
``ScalarType`` order (``tests/test_dtypes.py`` checks the codes against torch-mlir's table).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    dtype: torch.dtype
    code: int  # c10::ScalarType, as the Torch dialect's integer dtype operands carry it
    mlir: str  # the Torch dialect's element type spelling
    names: tuple[str, ...]  # what users write (the first is the torch name)


DTYPES: tuple[DType, ...] = (
    DType(torch.uint8, 0, "ui8", ("uint8",)),
    DType(torch.int8, 1, "si8", ("int8",)),
    DType(torch.int16, 2, "si16", ("int16", "short")),
    DType(torch.int32, 3, "si32", ("int32",)),
    DType(torch.int64, 4, "si64", ("int64", "long", "int")),
    DType(torch.float16, 5, "f16", ("float16", "half")),
    DType(torch.float32, 6, "f32", ("float32", "float")),
    DType(torch.float64, 7, "f64", ("float64", "double")),
    DType(torch.bool, 11, "i1", ("bool",)),
    DType(torch.bfloat16, 15, "bf16", ("bfloat16",)),
    DType(torch.complex32, 9, "complex<f16>", ("complex32",)),
    DType(torch.complex64, 10, "complex<f32>", ("complex64",)),
    DType(torch.float8_e5m2, 23, "f8E5M2", ("float8_e5m2",)),
    DType(torch.float8_e4m3fn, 24, "f8E4M3FN", ("float8_e4m3fn",)),
    DType(torch.float8_e5m2fnuz, 25, "f8E5M2FNUZ", ("float8_e5m2fnuz",)),
    DType(torch.float8_e4m3fnuz, 26, "f8E4M3FNUZ", ("float8_e4m3fnuz",)),
    DType(torch.uint32, 28, "ui32", ("uint32",)),
)
FLOAT_MLIR = frozenset({"f16", "bf16", "f32", "f64"})

_BY_CODE = {d.code: d.dtype for d in DTYPES}
_MLIR_OF_NAME = {n: d.mlir for d in DTYPES for n in d.names}
_NAME_OF_MLIR = {d.mlir: d.names[0] for d in DTYPES}
_BY_NAME = {n: d.dtype for d in DTYPES for n in (*d.names, d.mlir)}
_NAME_OF_DTYPE = {d.dtype: d.names[0] for d in DTYPES}


def dtype_from_code(code: int) -> torch.dtype:
    """The torch dtype behind an integer dtype operand (``to.dtype(x, 15)`` is bfloat16)."""
    if code not in _BY_CODE:
        raise ValueError(f"{code} is not a dtype code of the Torch dialect")
    return _BY_CODE[code]


def mlir_name(name: str) -> str:
    """``"int8"``, ``"torch.int8"`` or ``"si8"`` -> ``"si8"`` (unknown names pass through)."""
    name = name.removeprefix("torch.")
    return _MLIR_OF_NAME.get(name, name)


def torch_name(mlir: str) -> str:
    """``"si8"`` -> ``"int8"`` for messages (unknown spellings pass through)."""
    return _NAME_OF_MLIR.get(mlir, mlir)


def dtype_named(name: str) -> torch.dtype | None:
    """``"bfloat16"``, ``"bf16"``, ``"torch.bfloat16"`` -> ``torch.bfloat16``; None if unknown."""
    return _BY_NAME.get(name.removeprefix("torch."))


def short_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return _NAME_OF_DTYPE.get(dtype, str(dtype).removeprefix("torch."))


def quantized_dtype(qmin: int) -> torch.dtype:
    """The integer dtype of a quantized output whose range starts at ``qmin``."""
    return torch.uint8 if qmin >= 0 else torch.int8


def within_8_bits(qmin: int, qmax: int) -> bool:
    """Whether [qmin, qmax] lies within its dtype's range (:func:`quantized_dtype`): [0, 255],
    or a part of it such as the [0, 127] of 7-bit activations (``reduce_range``); a kernel
    that saturates to the whole dtype then clamps to [qmin, qmax], which gives the same codes."""
    dtype = torch.iinfo(quantized_dtype(qmin))
    return dtype.min <= qmin <= qmax <= dtype.max


def whole_dtype(qmin: int, qmax: int) -> bool:
    """Whether [qmin, qmax] is the whole range of its dtype (:func:`quantized_dtype`)."""
    dtype = torch.iinfo(quantized_dtype(qmin))
    return (qmin, qmax) == (dtype.min, dtype.max)
