"""The attention's Q K^T and P V on AMX-BF16 tiles (kernels/x86/attention_amx.h), in attention.c's
attention_q kernels and in qgemm_vnni.c's qkv_attention_q_merged.

On a host without AMX the tile path runs with the tile instructions emulated in C
(-DPDLKIT_AMX_EMULATE): its blocking, padding, precision groups and threads are checked against
the vector path (a build with -DPDLKIT_ATTENTION_NO_AMX) and FP32 attention, and a counter the
emulated build exports (pdlkit_attention_amx_gemms) shows that the tiles ran, or did not. The
tests that run the real instructions skip there ("needs amx_bf16 (lscpu)")."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import AMX_BF16, AVX512_BF16, VNNI

if not AVX512_BF16:
    pytest.skip(
        "the attention kernel needs an x86-64 CPU with AVX512_BF16", allow_module_level=True
    )
if shutil.which(os.environ.get("CC", "cc")) is None:
    pytest.skip("no C compiler (cc / $CC) to build the kernels", allow_module_level=True)
pytest.importorskip("torchao.quantization.pt2e", reason="needs torchao (pip install -e '.[quant]')")

from pdlkit.kernels.ops import logical_ops as ref  # noqa: E402
from pdlkit.kernels.x86 import attention, qlinear_vnni  # noqa: E402
from pdlkit.runtime_abi.dlopen import open_library  # noqa: E402
from pdlkit.runtime_abi.native_build import build_library  # noqa: E402
from pdlkit.runtime_abi.native_load import load_native_library  # noqa: E402

needs_amx_bf16 = pytest.mark.skipif(not AMX_BF16, reason="needs amx_bf16 (lscpu)")


class Built:
    """A library built with some flags: its kernels by name and its tile-product counter
    (exported by the emulated and the counting builds only)."""

    def __init__(self, source: Any, *flags: str):
        path = build_library(source, "x86_64", extra=("-fopenmp", *flags))
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        self.kernels = {k.name: k for k in load_native_library(path, digest, data)}
        self._lib = open_library(path, data, digest)  # the handle the kernels run from

    def gemms(self) -> int:
        fn = self._lib.pdlkit_attention_amx_gemms
        fn.restype = ctypes.c_int64
        return int(fn())


@pytest.fixture(scope="module")
def emulated() -> Built:
    return Built(attention.SOURCE, "-DPDLKIT_AMX_EMULATE")


@pytest.fixture(scope="module")
def vector() -> Built:
    return Built(attention.SOURCE, "-DPDLKIT_ATTENTION_NO_AMX")


@contextmanager
def threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _mask(kind: str, b: int, sq: int, sk: int, g: torch.Generator) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "float_pad":  # HF's extended mask: [B, 1, 1, Sk], finfo.min on padding keys
        m = torch.zeros(b, 1, 1, sk)
        m[:, :, :, sk - sk // 5 :] = torch.finfo(torch.float32).min
        return m
    return torch.rand(b, 1, sq, sk, generator=g) > 0.3  # bool, per query row and key


def _args(shape: tuple[int, ...], mask: str, seed: int, sk: int | None = None, std: float = 1.0):
    """attention_q's arguments: q [B, H, Sq, D], k and v [B, H, Sk, D], out_scale calibrated on
    the FP32 output's range (as PT2E's observers do)."""
    b, h, sq, d = shape
    sk = sq if sk is None else sk
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=g) * std
    k = torch.randn(b, h, sk, d, generator=g) * std
    v = torch.randn(b, h, sk, d, generator=g)
    m = _mask(mask, b, sq, sk, g)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    lo, hi = min(y.min().item(), 0.0), max(y.max().item(), 0.0)
    scale = (hi - lo) / 255
    return (q, k, v, m, 0, 0.0, scale, round(-lo / scale), 0, 255)


def _within_one(out: torch.Tensor, want: torch.Tensor, share: float = 0.15) -> None:
    assert out.shape == want.shape and out.dtype == want.dtype
    diff = (out.int() - want.int()).abs()
    assert diff.max().item() <= 1, diff.max().item()
    assert (diff > 0).float().mean().item() <= share


def _run(built: Built, name: str, args: tuple, n_threads: int) -> tuple[torch.Tensor, int]:
    """The kernel's codes and how many tile products the call ran."""
    counted = hasattr(built._lib, "pdlkit_attention_amx_gemms")
    before = built.gemms() if counted else 0
    with threads(n_threads):
        out = built.kernels[name].fn(*args)
    return out, (built.gemms() - before if counted else 0)


def _blocks(b: int, h: int, sq: int) -> int:
    return b * h * -(-sq // 16)  # blocks of 16 query rows


@pytest.mark.parametrize("shape", [(8, 4, 64, 64), (1, 12, 128, 64)], ids=["bert-mini", "base"])
@pytest.mark.parametrize("mask", ["none", "float_pad", "bool"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_emulated_tiles_within_one_code(emulated, vector, shape, mask, n_threads):
    """bert-mini's and BERT-base's attention on (emulated) tiles: within one code of the vector
    path and of FP32 SDPA + quantize; Q K^T and P V of every block ran on the tiles."""
    args = _args(shape, mask, seed=sum(shape) + n_threads)
    out, gemms = _run(emulated, "x86_attention_q_bf16", args, n_threads)
    assert gemms == 2 * _blocks(*shape[:3])
    plain, none = _run(vector, "x86_attention_q_bf16", args, n_threads)
    assert none == 0
    _within_one(out, plain)
    _within_one(out, ref.attention_q(*args))
    merged, _ = _run(emulated, "x86_attention_q_merged_bf16", args, n_threads)
    assert torch.equal(merged, out.transpose(1, 2).reshape(merged.shape))


@pytest.mark.parametrize(
    ("shape", "sk", "causal"),
    [((2, 3, 50, 64), 50, 0), ((1, 2, 40, 32), 72, 1), ((2, 2, 17, 128), 16, 0)],
    ids=["Sk50", "Sk72-causal", "Sq17-Sk16"],
)
def test_emulated_tiles_pad_sk_and_sq_tails(emulated, vector, shape, sk, causal):
    """Sk not a multiple of 32 (P V's last step reads zeros past Sk), Sq not a multiple of 16
    (padding rows not stored), causal, Sq != Sk: on tiles, within one code of the vector path
    and FP32."""
    q, k, v, m, _, *rest = _args(shape, "bool", seed=sk, sk=sk)
    args = (q, k, v, m, causal, *rest)
    out, gemms = _run(emulated, "x86_attention_q_bf16", args, 1)
    assert gemms == 2 * _blocks(*shape[:3])
    _within_one(out, _run(vector, "x86_attention_q_bf16", args, 1)[0])
    _within_one(out, ref.attention_q(*args))


@pytest.mark.parametrize(
    ("shape", "sk"), [((2, 4, 64, 48), 64), ((2, 4, 8, 64), 64), ((1, 2, 64, 40), 50)]
)
def test_shapes_outside_the_tiling_rule_run_the_vector_path(emulated, vector, shape, sk):
    """D % 32 != 0 or Sq < 16: the emulated build declines the tiles (no tile product) and
    gives the vector path's codes exactly."""
    args = _args(shape, "float_pad", seed=3, sk=sk)
    for n_threads in (1, 2):
        out, gemms = _run(emulated, "x86_attention_q_bf16", args, n_threads)
        assert gemms == 0
        assert torch.equal(out, _run(vector, "x86_attention_q_bf16", args, n_threads)[0])


def test_float32_qk_blocks_use_no_qk_tiles(emulated, vector):
    """q, k of standard deviation 10: every group of rows computes Q K^T in float32 (the vector
    path's FMA code), so only P V runs on tiles; outlier rows in an otherwise small block make
    their 4-row group float32 while the block's Q K^T still runs on tiles."""
    shape = (2, 4, 64, 64)
    args = _args(shape, "none", seed=5, std=10.0)
    out, gemms = _run(emulated, "x86_attention_q_bf16", args, 1)
    assert gemms == _blocks(*shape[:3])  # P V only
    _within_one(out, _run(vector, "x86_attention_q_bf16", args, 1)[0])
    _within_one(out, ref.attention_q(*args))
    q, k, v, *rest = _args(shape, "none", seed=6)
    q = q.clone()
    q[:, :, 5] *= 12.0  # rows 4-7 of block 0 need float32 logits
    q[:, :, 33] *= 12.0
    args = (q, k, v, *rest)
    out, gemms = _run(emulated, "x86_attention_q_bf16", args, 2)
    assert gemms == 2 * _blocks(*shape[:3])
    _within_one(out, _run(vector, "x86_attention_q_bf16", args, 2)[0])
    _within_one(out, ref.attention_q(*args))


def test_emulated_tiles_decline_non_finite_inputs(emulated):
    """A NaN in v (or q) is declined on the tile path as on the vector path."""
    import pdlkit

    q, k, v, *rest = _args((1, 2, 32, 64), "none", seed=7)
    for t in (q, v):
        bad = t.clone()
        bad[0, 1, 3, 5] = float("nan")
        args = (bad, k, v, *rest) if t is q else (q, k, bad, *rest)
        with pytest.raises(pdlkit.KernelUnsupported, match="not finite"):
            emulated.kernels["x86_attention_q_bf16"].fn(*args)


# -- qkv_attention_q_merged (qgemm_vnni.c includes attention_core.h) --


def _qkv_args(b: int, s: int, n: int, heads: int, seed: int, masked: bool) -> list:
    """q, k, v projections of about unit size (as trained models have them), an explicit scale
    (the reference takes 0.0 as a literal 0, the kernel as None), out_scale calibrated on the
    reference's float output."""
    g = torch.Generator().manual_seed(seed)
    args: list = [torch.randint(0, 256, (b, s, n), generator=g, dtype=torch.uint8), 0.02, 128]
    for _ in "qkv":
        args += [torch.randint(-127, 128, (n, n), generator=g, dtype=torch.int8)]
        args += [(torch.rand(n, generator=g) + 0.5) * 0.01 / n**0.5]
        args += [torch.zeros(n, dtype=torch.int64), torch.randn(n, generator=g) * 0.1]
    mask = None
    if masked:  # HF BERT's bool padding mask, broadcast over heads and query rows
        keys = torch.ones(b, s, dtype=torch.bool)
        keys[:, s - s // 4 :] = False
        mask = keys[:, None, None, :].expand(b, 1, s, s)
    args += [[b, s, -1, n // heads], mask, 0, (n // heads) ** -0.5]
    y = ref._qkv_attention_float(*args)
    lo, hi = min(y.min().item(), 0.0), max(y.max().item(), 0.0)
    return [*args, (hi - lo) / 255, round(-lo / ((hi - lo) / 255)), 0, 255]


def _qkv_call(built: Built, args: list, n_threads: int) -> tuple[torch.Tensor, int]:
    decl = built.kernels["qkv_attention_q_merged_vnni"]
    attrs = {
        p: a for p, a in zip(decl.params, args, strict=True) if not isinstance(a, torch.Tensor)
    }
    attrs.update(wk=args[7], wv=args[11])
    packed = decl.prepack(args[3], attrs)
    counted = hasattr(built._lib, "pdlkit_attention_amx_gemms")
    before = built.gemms() if counted else 0
    with threads(n_threads):
        out = decl.fn(*args[:3], packed, *args[4:])
    return out, (built.gemms() - before if counted else 0)


@pytest.fixture(scope="module")
def qkv_libs() -> Callable[[str], Built]:
    if not VNNI:
        pytest.skip("qkv_attention_q_merged needs avx512_vnni")
    cache: dict[str, Built] = {}

    def get(flag: str) -> Built:
        if flag not in cache:
            cache[flag] = Built(qlinear_vnni.SOURCE, flag)
        return cache[flag]

    return get


@pytest.mark.parametrize(
    ("b", "s", "n", "heads"), [(8, 64, 256, 4), (1, 128, 768, 12)], ids=["bert-mini", "base"]
)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_emulated_tiles_in_the_merged_qkv_kernel(qkv_libs, b, s, n, heads, masked, n_threads):
    """qkv_attention_q_merged's attention on (emulated) tiles: every block's P V (and Q K^T
    where its logits are small) on tiles, codes within one of the vector path's (same int32
    projections) and of the FP32 reference."""
    args = _qkv_args(b, s, n, heads, seed=s + n_threads, masked=masked)
    out, gemms = _qkv_call(qkv_libs("-DPDLKIT_AMX_EMULATE"), args, n_threads)
    blocks = _blocks(b, heads, s)
    assert blocks <= gemms <= 2 * blocks
    plain, _ = _qkv_call(qkv_libs("-DPDLKIT_ATTENTION_NO_AMX"), args, n_threads)
    _within_one(out, plain)
    _within_one(out, ref.qkv_attention_q_merged(*args))


# -- the tile instructions themselves --


@needs_amx_bf16
@pytest.mark.parametrize("shape", [(8, 4, 64, 64), (1, 12, 128, 64), (2, 3, 50, 64)])
@pytest.mark.parametrize("mask", ["none", "float_pad"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_amx_tiles_within_one_code(vector, shape, mask, n_threads):
    """TDPBF16PS itself (a build with the real instructions and the counter): every block on
    tiles, within one code of the vector path and FP32; the shipped library (which takes the
    tiles on this host too) gives the same codes."""
    counting = Built(attention.SOURCE, "-DPDLKIT_ATTENTION_COUNT_TILES")
    args = _args(shape, mask, seed=sum(shape))
    out, gemms = _run(counting, "x86_attention_q_bf16", args, n_threads)
    assert gemms == 2 * _blocks(*shape[:3])
    _within_one(out, _run(vector, "x86_attention_q_bf16", args, n_threads)[0])
    _within_one(out, ref.attention_q(*args))
    with threads(n_threads):
        assert torch.equal(attention.x86_attention_q_bf16.fn(*args), out)


@needs_amx_bf16
def test_amx_tiles_in_the_merged_qkv_kernel(qkv_libs):
    args = _qkv_args(8, 64, 256, 4, seed=3, masked=True)
    out, gemms = _qkv_call(qkv_libs("-DPDLKIT_ATTENTION_COUNT_TILES"), args, 2)
    assert gemms >= _blocks(8, 4, 64)
    _within_one(out, _qkv_call(qkv_libs("-DPDLKIT_ATTENTION_NO_AMX"), args, 2)[0])
    _within_one(out, ref.qkv_attention_q_merged(*args))
