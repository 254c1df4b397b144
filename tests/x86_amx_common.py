"""What the x86 AMX test modules share (test_x86_amx.py, test_x86_amx_emulated.py,
test_x86_amx_bf16.py): their module-level skips, the int8 operands, and a kernel called with a
pre-pack made for it as a compiled graph calls it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import VNNI

ROOT = Path(__file__).resolve().parents[1]


def skip_module_without_vnni_build() -> None:
    """Skips the test module that calls it (at its import) where qgemm_vnni.c's kernels cannot
    be built and run, or the PT2E reference is missing."""
    if not VNNI:
        pytest.skip(
            "the AMX kernels run their VNNI path where a call does not fit the tiles: needs "
            "avx512_vnni",
            allow_module_level=True,
        )
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler (cc / $CC) to build qgemm_vnni.c", allow_module_level=True)
    pytest.importorskip(
        "torchao", reason="the PT2E reference needs torchao (pip install -e '.[quant]')"
    )


def _operands(m, k, n, x_dtype, seed=0, x_zp=None):
    g = torch.Generator().manual_seed(seed)
    lo, hi = (-128, 127) if x_dtype is torch.int8 else (0, 255)
    x = torch.randint(lo, hi + 1, (m, k), generator=g).to(x_dtype)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    b = torch.randn(n, generator=g)
    if x_zp is None:
        x_zp = -7 if x_dtype is torch.int8 else 128
    return x, w, ws, b, x_zp


def _call(decl, x, x_zp, w, ws, b, post, algo, out, pt=False):
    """The kernel with a pre-pack made for it, as a compiled graph calls it; (output, packed)."""
    zp = 0 if pt else torch.zeros(w.shape[0], dtype=torch.int64)
    attrs = {"x_scale": 0.02, "x_zp": x_zp, "post_op": post, "algorithm": algo}
    if out is None:
        p = decl.prepack(w, attrs)
        return decl.fn(x, 0.02, x_zp, p, ws, zp, b, post, algo), p
    qmin, qmax = (0, 255) if out is torch.uint8 else (-128, 127)
    attrs.update(out_scale=0.05, out_zp=3, out_qmin=qmin, out_qmax=qmax)
    p = decl.prepack(w, attrs)
    return decl.fn(x, 0.02, x_zp, p, ws, zp, b, 0.05, 3, qmin, qmax, post, algo), p
