"""The CUDA GEMM kernels' tiles fit the shared memory of the GPUs they declare (sm_80 and
newer), checked without a GPU: Triton compiles each kernel for sm_80, sm_86 and sm_90 on the
CPU (its bundled ptxas), and the binary's shared memory, with the stages
``kernels/cuda/_common.fit_stages`` leaves, is within what that GPU gives a program. A tile
that does not fit raises OutOfResources at launch, inside Inductor's generated code."""

from __future__ import annotations

from typing import Any

import pytest

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

# (compute capability, bytes of shared memory one program may opt into): an A100, an sm_86 /
# sm_89 GPU (A10, L4, L40S, RTX 30x0 / 40x0), an H100 / H200
GPUS = [(80, 166912), (86, 101376), (90, 232448)]


def _compile(fn: Any, types: dict[str, str], consts: dict[str, Any], cfg: Any, stages: int, cc: int) -> int:  # fmt: skip
    """The shared memory of ``fn`` compiled for sm_<cc> with ``consts`` bound, as Triton's
    JIT specializes a launch: pointers, strides and N 16-byte aligned."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, compile
    except ImportError as e:  # another Triton than 3.x
        pytest.skip(f"Triton's compiler API is not importable here: {e}")
    names = fn.arg_names
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    consts = defaults | consts  # constexprs a launch leaves to their defaults (UPCAST, ...)
    signature = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    aligned = [
        i
        for i, n in enumerate(names)
        if n not in consts and (signature[n].startswith("*") or n.startswith("stride") or n == "N")
    ]
    src = ASTSource(
        fn=fn,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i in aligned},
    )
    try:
        kernel = compile(src, target=GPUTarget("cuda", cc, 32), options={"num_warps": cfg.warps, "num_stages": stages})  # fmt: skip
    except RuntimeError as e:  # no ptxas in this Triton build
        pytest.skip(f"Triton cannot compile for sm_{cc} here: {str(e)[:200]}")
    return int(kernel.metadata.shared)


def _splitk_shared(m: int, n: int, k: int, weight_only: bool, cc: int, limit: int, monkeypatch: Any) -> int:  # fmt: skip
    from pdlkit.kernels.cuda import _common
    from pdlkit.kernels.cuda import _triton_splitk as S

    cfg = S.w8_config(m, n, k) if weight_only else S.pick_split_config(m, n, k, False)
    monkeypatch.setattr(_common, "shared_limit", lambda: (cc // 10, limit))
    stages = S.tile_stages(cfg, 1 + weight_only, False)  # as splitk() launches it
    k_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.bk) * cfg.bk  # as splitk() slices K
    split = triton.cdiv(k, k_split)
    consts: dict[str, Any] = dict(
        N=n, stride_bn=k, stride_cm=n, q_eps=0.0, q_max=1.0, K=k, K_SPLIT=k_split, SPLIT_K=split,
        EVEN_K=split * k_split == k, GATED=False, HAS_BIAS=False, HAS_RES=False, QUANT_A=False,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, RB=4096, W8=weight_only, u_ptr=None, u_scale_ptr=None,
        bias_ptr=None, res_ptr=None, x_ptr=None,
    )  # fmt: skip
    if weight_only:
        consts["a_scale_ptr"] = None
    if split == 1:
        consts.update(ws_ptr=None, count_ptr=None)
    types = {
        "a_ptr": "*bf16" if weight_only else "*i8", "b_ptr": "*i8", "c_ptr": "*bf16",
        "ws_ptr": "*fp32" if weight_only else "*i32", "count_ptr": "*i32",
        "a_scale_ptr": "*fp32", "b_scale_ptr": "*fp32",
    }  # fmt: skip
    return _compile(S.splitk_kernel, types, consts, cfg, stages, cc)


@pytest.mark.parametrize("cc,limit", GPUS)
@pytest.mark.parametrize(
    "m,n,k,weight_only",
    [
        (64, 4096, 4096, False),  # Llama-2's o projection in a 64-sequence decode step
        (128, 4096, 4096, False),  # six stages of a 128 x 32 tile: 245,760 bytes as picked
        (256, 11008, 4096, False),
        (64, 4096, 4096, True),  # torchao's weight-only linear: bf16 activation tiles
    ],
)
def test_decode_gemm_tiles_fit_the_gpu(m, n, k, weight_only, cc, limit, monkeypatch):
    assert _splitk_shared(m, n, k, weight_only, cc, limit, monkeypatch) <= limit


@pytest.mark.parametrize("cc,limit", GPUS)
@pytest.mark.parametrize("is_int", [True, False])
def test_prefill_gemm_tile_fits_the_gpu(is_int, cc, limit, monkeypatch):
    from pdlkit.kernels.cuda import _common
    from pdlkit.kernels.cuda import _triton_gemm as G

    cfg = G.pick_config(2048, 11008, 4096, is_int)  # 128 x 256 tiles
    monkeypatch.setattr(_common, "shared_limit", lambda: (cc // 10, limit))
    size = 1 if is_int else 2
    stages = G.tile_stages(cfg, size, size, "gemm_kernel")  # as gemm() launches it
    dt = "*i8" if is_int else "*bf16"
    types = dict(
        a_ptr=dt, b_ptr=dt, c_ptr="*bf16", a_scale_ptr="*fp32", b_scale_ptr="*fp32",
        bias_ptr="*bf16", wsum_ptr="*i32", res_ptr="*bf16", a_scale_val="fp32",
        out_inv_scale="fp32", out_zp="fp32", qmin="fp32", qmax="fp32",
    )  # fmt: skip
    consts = dict(
        K=4096, IS_INT=is_int, UPCAST=False, A_U8=False, A_SCALE=2 if is_int else 0,
        B_SCALE=is_int, HAS_BIAS=False, HAS_WSUM=False, ACT=0, REQUANT=False, HAS_RES=True,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, GROUP_M=cfg.group_m,
    )  # fmt: skip
    assert _compile(G.gemm_kernel, types, consts, cfg, stages, cc) <= limit
