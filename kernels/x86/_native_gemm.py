"""What the x86 GEMM kernel files of this folder share: the int32 exactness bound of their
8-bit sums and how to read the header of a weight their C prepack hooks wrote
(``x86_abi.h``'s ``x86_pack_header``). Not a kernel file (the registry skips ``_*.py``)."""

from __future__ import annotations

from typing import Any

import torch

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


def pack_header(packed: Any) -> tuple[int, int, int]:
    """``(flags, n, k)`` of a weight packed by qgemm_vnni.c or gemm_bf16.c (a
    :class:`pdlkit.runtime_abi.native.PackedWeight`): the engine its pre-pack asked for
    (bit 0: AMX) and the logical weight's size."""
    words = packed.data[:64].view(torch.int64)  # x86_pack_header: magic | flags, n, k, ...
    return int(words[0]) >> 32, int(words[1]), int(words[2])


def packed_uses_amx(packed: Any, m: int, kstep: int, feature: str, kernel: Any) -> bool:
    """Whether a call of ``m`` rows with this pre-pack runs on AMX tiles, by the rule of the
    libraries' ``*_uses_amx``: asked for by the pre-pack (an ``*_amx`` kernel's), K a multiple
    of ``kstep``, at least 32 rows, and the tiles in use by the library of ``kernel`` (one of
    its declarations) in this process: ``feature`` in
    :func:`pdlkit.runtime_abi.capability.host` (which keeps AMX flags only where Linux grants
    the tile state), and the library's own tile self-test passed (``pdlkit_amx_tiles``,
    ``amx_selftest.h``)."""
    from pdlkit.runtime_abi.capability import host
    from pdlkit.runtime_abi.dlopen import opened

    flags, _, k = pack_header(packed)
    if not (flags & 1 and k % kstep == 0 and m >= 32 and feature in host().features):
        return False
    lib = opened(kernel.digest) if kernel is not None else None
    return lib is not None and bool(lib.pdlkit_amx_tiles(int(feature == "amx_bf16")))
