"""The C ABI (``include/pdlkit_abi.h``) as ctypes sees it: version, status codes, dtype and
device codes, the frame and descriptor structs, and the packed-frame formats. One home for
the layouts :mod:`native_desc` reads and :mod:`native` fills."""

from __future__ import annotations

import ctypes
import struct
from ctypes import POINTER, c_char_p, c_double, c_int32, c_int64, c_size_t, c_uint32, c_void_p
from pathlib import Path
from typing import Any

import torch

ABI_MAJOR, ABI_MINOR = 1, 2
HEADER = Path(__file__).resolve().parent / "include" / "pdlkit_abi.h"
REGISTER_SYMBOL = "pdlkit_register"
MAX_NDIM = 64  # the shape buffer meta() may fill per output
_ERROR_BYTES = 1024

OK, UNSUPPORTED, INVALID_ARGUMENT, INTERNAL = 0, 1, 2, 3
STATUS_NAMES = {
    OK: "OK",
    UNSUPPORTED: "UNSUPPORTED",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    INTERNAL: "INTERNAL",
}
KIND_TENSOR, KIND_INT, KIND_FLOAT, KIND_STRING, KIND_INT_LIST, KIND_DENSE_TENSOR = range(1, 7)
_KIND_TYPES: dict[int, Any] = {
    KIND_TENSOR: torch.Tensor,
    KIND_INT: int,
    KIND_FLOAT: float,
    KIND_STRING: str,
    KIND_INT_LIST: list[int],
}
_TRAIT_BITS = {1 << 0: "deterministic", 1 << 1: "inplace", 1 << 2: "graph_capture_safe"}
_DEVICES = {1: "cpu", 2: "cuda"}  # kDLCPU, kDLCUDA
_DEVICE_CODES = {v: k for k, v in _DEVICES.items()}

# (DLDataTypeCode, bits) <-> torch dtype; the codes are DLPack 1.x's (checked against torch's
# own to_dlpack in the tests).
_DTYPES: dict[tuple[int, int], torch.dtype] = {
    (0, 8): torch.int8,
    (0, 16): torch.int16,
    (0, 32): torch.int32,
    (0, 64): torch.int64,
    (1, 8): torch.uint8,
    (1, 16): torch.uint16,
    (1, 32): torch.uint32,
    (1, 64): torch.uint64,
    (2, 16): torch.float16,
    (2, 32): torch.float32,
    (2, 64): torch.float64,
    (4, 16): torch.bfloat16,
    (5, 64): torch.complex64,
    (5, 128): torch.complex128,
    (6, 8): torch.bool,
    (10, 8): torch.float8_e4m3fn,
    (11, 8): torch.float8_e4m3fnuz,
    (12, 8): torch.float8_e5m2,
    (13, 8): torch.float8_e5m2fnuz,
    (14, 8): torch.float8_e8m0fnu,
}
_DL_CODES = {v: k for k, v in _DTYPES.items()}


# -- the header's structs, field for field ----------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class Attribute(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char_p),
        ("kind", c_int32),
        ("i", c_int64),
        ("f", c_double),
        ("s", c_char_p),
        ("s_size", c_size_t),
        ("ints", POINTER(c_int64)),
        ("num_ints", c_size_t),
        ("tensor", POINTER(DLTensor)),
    ]


class MetaFrame(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("kernel", c_void_p),
        ("inputs", POINTER(DLTensor)),
        ("num_inputs", c_size_t),
        ("attrs", POINTER(POINTER(Attribute))),
        ("num_attrs", c_size_t),
        ("outputs", POINTER(DLTensor)),
        ("num_outputs", c_size_t),
        ("max_ndim", c_int32),
        ("error", c_void_p),
        ("error_size", c_size_t),
    ]


class CallFrame(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("kernel", c_void_p),
        ("inputs", POINTER(DLTensor)),
        ("num_inputs", c_size_t),
        ("outputs", POINTER(DLTensor)),
        ("num_outputs", c_size_t),
        ("attrs", POINTER(POINTER(Attribute))),
        ("num_attrs", c_size_t),
        ("stream", c_void_p),
        ("workspace", c_void_p),
        ("workspace_size", c_size_t),
        ("error", c_void_p),
        ("error_size", c_size_t),
    ]


class ArgDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char_p),
        ("kind", c_int32),
        ("dtypes", POINTER(DLDataType)),
        ("num_dtypes", c_size_t),
        ("ranks", POINTER(c_int32)),
        ("num_ranks", c_size_t),
        ("divisible_dims", POINTER(c_int32)),
        ("divisible_by", POINTER(c_int64)),
        ("num_divisible", c_size_t),
        ("contiguous", c_int32),
        ("alignment", c_uint32),
        ("optional", c_int32),  # ABI 1.1
    ]


class KernelDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char_p),
        ("version", c_int32),
        ("op", c_char_p),
        ("device_type", c_int32),
        ("priority", c_int32),
        ("args", c_void_p),  # stepped through by each element's struct_size
        ("num_args", c_size_t),
        ("isa", POINTER(c_char_p)),
        ("num_isa", c_size_t),
        ("workspace_size", c_size_t),
        ("traits", ctypes.c_uint64),
        ("num_outputs", c_size_t),
        ("meta", c_void_p),
        ("run", c_void_p),
        ("doc", c_char_p),
        ("prepack_arg", c_char_p),  # ABI 1.1
        ("prepack", c_void_p),  # ABI 1.1
        ("prepack_with", POINTER(c_char_p)),  # ABI 1.2
        ("num_prepack_with", c_size_t),  # ABI 1.2
    ]


class PrepackFrame(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("kernel", c_void_p),
        ("weight", POINTER(DLTensor)),
        ("attrs", POINTER(POINTER(Attribute))),
        ("num_attrs", c_size_t),
        ("packed", c_void_p),
        ("packed_size", c_size_t),
        ("error", c_void_p),
        ("error_size", c_size_t),
        ("with_", POINTER(DLTensor)),  # ABI 1.2 (`with` in C)
        ("num_with", c_size_t),  # ABI 1.2
    ]


class Registration(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("abi_major", c_uint32),
        ("abi_minor", c_uint32),
        ("kernels", POINTER(c_void_p)),
        ("num_kernels", c_size_t),
    ]


_META_FN = ctypes.CFUNCTYPE(c_int32, POINTER(MetaFrame))
_RUN_FN = ctypes.CFUNCTYPE(c_int32, c_void_p)  # takes the address of a packed CallFrame
_PREPACK_FN = ctypes.CFUNCTYPE(c_int32, POINTER(PrepackFrame))

# The size of each descriptor struct in ABI 1.0: a 1.0 library's structs end there, and the
# fields appended since read as zero.
_V10_SIZE: dict[type, int] = {
    ArgDesc: ArgDesc.optional.offset,
    KernelDesc: KernelDesc.prepack_arg.offset,
}

# run() frames are packed with struct.pack_into (filling ctypes fields one by one costs
# ~15 us per tensor); these formats are checked against the ctypes layouts above.
_FRAME_FMT = "NPPNPNPNPPNPN"
_DL_FMT = "PiiiBBHPPQ"
assert struct.calcsize("@" + _FRAME_FMT) == ctypes.sizeof(CallFrame)
assert struct.calcsize("@" + _DL_FMT) == ctypes.sizeof(DLTensor)
