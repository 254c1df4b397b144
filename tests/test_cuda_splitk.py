"""The decode-shaped int8 kernels' tile configs (kernels/cuda/_triton_splitk.py and the grouped
Q/K/V kernel of _triton_fused.py), each against an exact integer reference.

On the CPU they run in Triton's interpreter (a subprocess with TRITON_INTERPRET=1). With unit
scales and float32 outputs the int32 sums come out as they are (every sum here is far under
2**24, so float32 holds it exactly): any lost or doubled partial sum of a K slice shows.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from conftest import needs_gpu, run_interpreted

import pdlkit

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

_SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, torch
    import torch.nn.functional as F
    from pdlkit.kernels.cuda import _triton_fused as Fz, _triton_splitk as S
    torch.manual_seed(0)
    m, n, k = 33, 70, 200  # three row tiles of 16, a partial column tile, K not a multiple of BK
    q = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    w, u = (torch.randint(-127, 128, (n, k), dtype=torch.int8) for _ in range(2))
    ones_m, ones_n = torch.ones(m), torch.ones(n)
    exact_w = (q.int() @ w.int().T).float()
    exact_u = (q.int() @ u.int().T).float()
    out = {}
    configs = {  # (bm, bn, bk, split_k, warps, stages)
        "one slice": S.SplitConfig(16, 32, 32, 1, 1, 1),
        "wide, three slices": S.SplitConfig(16, 64, 32, 3, 1, 1),
        "rows in one tile, eight slices": S.SplitConfig(64, 16, 16, 8, 1, 1),
    }
    for name, cfg in configs.items():
        y = torch.full((m, n), float("nan"))
        lin = []
        for _ in range(2):  # the second call finds the workspace as the first left it
            S.splitk(q, ones_m, w, ones_n, y, config=cfg)
            lin.append(bool((y == exact_w).all()))
        h = torch.full((m, n), float("nan"))
        S.splitk(q, ones_m, w, ones_n, h, u=u, u_scale=ones_n, config=cfg)
        want = F.silu(exact_w) * exact_u
        out[name] = {"linear_exact": lin, "gated_err": ((h - want).norm() / want.norm()).item()}
    kept = torch.zeros(64, dtype=torch.int32)  # counters a caller keeps between calls
    y = torch.full((m, n), float("nan"))
    sums = []
    for _ in range(2):
        S.splitk(q, ones_m, w, ones_n, y, config=configs["wide, three slices"], counters=kept)
        sums.append(bool((y == exact_w).all()))
    out["kept counters"] = {"exact": sums, "left_zero": bool((kept == 0).all())}
    outs = [torch.full((m, c), float("nan")) for c in (70, 24, 24)]
    ws = [w, w[:24].contiguous(), u[:24].contiguous()]
    Fz.grouped_splitk(q, ones_m, ws, [ones_n, ones_n[:24], ones_n[:24]], outs,
                      config=S.SplitConfig(32, 32, 64, 1, 1, 1))
    out["grouped_exact"] = [bool((o == (q.int() @ g.int().T).float()).all())
                            for o, g in zip(outs, ws)]
    # weight-only: fp16 activations (halves), int8 weights; every sum is a multiple of 0.5 up
    # to 900, exact in fp16, so a lost, doubled or truncated float32 partial sum shows
    a = (torch.randint(-3, 4, (m, k)) / 2).half()
    w3 = torch.randint(-3, 4, (n, k), dtype=torch.int8)
    exact3 = (a.double() @ w3.double().T).half()
    out["weight_only_exact"] = {}
    for name in ("one slice", "wide, three slices"):
        for swap in (False, True):  # the widened weight as the dot's first operand, or second
            y = torch.full((m, n), float("nan")).half()
            cfg = dataclasses.replace(configs[name], swap=swap)
            S.splitk(a, None, w3, ones_n, y, config=cfg, weight_only=True)
            out["weight_only_exact"][name + (", swapped" if swap else "")] = bool((y == exact3).all())
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_SCRIPT)


@pytest.mark.parametrize(
    "config",
    [
        "one slice",
        "wide, three slices",
        "rows in one tile, eight slices",
    ],
)
def test_split_k_configs_sum_exactly_in_interpreter(interpreted, config):
    assert interpreted[config]["linear_exact"] == [True, True]  # every int32 sum, both calls
    assert interpreted[config]["gated_err"] < 1e-6  # silu(gate) * up in float32


def test_tile_counters_a_caller_keeps_are_left_zero_for_the_next_call(interpreted):
    assert interpreted["kept counters"] == {"exact": [True, True], "left_zero": True}


def test_grouped_qkv_with_a_given_config_sums_exactly_in_interpreter(interpreted):
    assert interpreted["grouped_exact"] == [True, True, True]


def test_weight_only_sums_exactly_with_k_split_in_interpreter(interpreted):
    # float32 partial sums in a float32 workspace, added by each tile's last slice
    # and with the dot's operands swapped (SplitConfig.swap): the sums come out transposed
    assert interpreted["weight_only_exact"] == {
        "one slice": True, "one slice, swapped": True,
        "wide, three slices": True, "wide, three slices, swapped": True,
    }  # fmt: skip


def _int_mm(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """q @ w.T in int32: cuBLASLt's (M > 16), else on the CPU."""
    if q.shape[0] > 16:
        return torch._int_mm(q, w.T)
    return (q.cpu().int() @ w.cpu().int().T).to(q.device)


@needs_gpu
@pytest.mark.parametrize(
    "m,n,k,cfg",
    [
        (64, 4096, 4096, (64, 64, 256, 2, 4, 4)),
        (16, 1000, 4096, (16, 128, 256, 4, 8, 3)),
        (256, 520, 11008, (128, 32, 256, 2, 4, 4)),  # a gated pair's shared memory fits
        (1, 96, 8192, None),  # pick_split_config's own split: too few tiles for the SMs
    ],
)
@pytest.mark.parametrize("gated", [False, True])
def test_gpu_split_k_slices_sum_exactly(m, n, k, cfg, gated):
    from pdlkit.kernels.cuda import _triton_splitk as S

    config = S.SplitConfig(*cfg) if cfg else S.pick_split_config(m, n, k, gated)
    assert config.split_k > 1
    q = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    w, u = (torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(2))
    ones_m, ones_n = torch.ones(m, device="cuda"), torch.ones(n, device="cuda")
    exact_w, exact_u = (_int_mm(q, b) for b in (w, u))
    for _ in range(2):  # the workspace and its counters start from zero every call
        out = torch.full((m, n), float("nan"), device="cuda")
        S.splitk(q, ones_m, w, ones_n, out, u=u if gated else None,
                 u_scale=ones_n if gated else None, config=config)  # fmt: skip
        if gated:
            want = F.silu(exact_w.float()) * exact_u.float()
            assert ((out - want).norm() / want.norm()).item() < 1e-6
        else:
            assert torch.equal(
                out, exact_w.float()
            )  # the same int32 sums, rounded to float32 alike


@needs_gpu
@pytest.mark.parametrize("m", [100, 128])
def test_gpu_decode_gemm_of_65_to_128_rows_launches_and_sums_exactly(m):
    # pick_split_config's tile there (128 x 32, K steps of 256, six stages) needs more shared
    # memory than an H100 has; fit_stages takes a stage off
    from pdlkit.kernels.cuda import _triton_splitk as S

    q = torch.randint(-127, 128, (m, 4096), dtype=torch.int8, device="cuda")
    w = torch.randint(-127, 128, (4096, 4096), dtype=torch.int8, device="cuda")
    out = torch.full((m, 4096), float("nan"), device="cuda")
    S.splitk(q, torch.ones(m, device="cuda"), w, torch.ones(4096, device="cuda"), out)
    assert torch.equal(out, _int_mm(q, w).float())


@needs_gpu
@pytest.mark.parametrize(
    "cfg",
    [(64, 128, 128, 4, 4, 4), (16, 64, 256, 8, 4, 4), (128, 64, 128, 1, 4, 4, True),
     (64, 128, 64, 2, 4, 4, True), None],
)  # fmt: skip
def test_gpu_weight_only_slices_sum_exactly(cfg):
    from pdlkit.kernels.cuda import _triton_splitk as S

    m, n, k = 64, 1000, 2048
    config = S.SplitConfig(*cfg) if cfg else None
    a = (torch.randint(-1, 2, (m, k), device="cuda") / 2).half()  # sums: halves up to 1024,
    w = torch.randint(-1, 2, (n, k), dtype=torch.int8, device="cuda")  # exact in fp16
    exact = (a.cpu().double() @ w.cpu().double().T).half().cuda()
    for _ in range(2):  # the workspace and its counters start from zero every call
        out = torch.full((m, n), float("nan"), device="cuda").half()
        S.splitk(a, None, w, torch.ones(n, device="cuda"), out, config=config, weight_only=True)
        assert torch.equal(out, exact)


def test_weight_only_tiles_follow_the_measured_winners():
    from pdlkit.kernels.cuda._triton_splitk import SplitConfig, w8_config

    # the winners of benchmarks/cuda_weight_only.py --sweep on an H200 (within 5% of each)
    assert w8_config(1, 4096, 4096) == SplitConfig(16, 32, 256, 1, 4, 5)  # q, k, v, o
    assert w8_config(16, 4096, 11008) == SplitConfig(16, 64, 128, 4, 4, 4)  # down: K in four
    assert w8_config(1, 1024, 4096).split_k == 4  # GQA k, v: 32 tiles, 128 programs
    assert w8_config(64, 14336, 4096) == SplitConfig(64, 64, 128, 1, 4, 4)  # GQA gate, up
    assert w8_config(256, 14336, 4096) == SplitConfig(128, 128, 64, 1, 4, 4)
    assert w8_config(256, 4096, 11008) == SplitConfig(64, 128, 64, 2, 4, 4)
    assert w8_config(256, 4096, 4096) == SplitConfig(128, 64, 128, 1, 4, 4, swap=True)  # o
    # prefill-sized calls: one K slice (no workspace of partial sums the size of the output)
    assert w8_config(2048, 4096, 11008).split_k == 1


@pytest.fixture
def gpu_shared(monkeypatch):
    """Pretend the GPU is of compute capability ``major`` with ``limit`` bytes of shared
    memory a program (kernels/cuda/_common.py's shared_limit)."""
    from pdlkit.kernels.cuda import _common

    def pretend(major: int, limit: int) -> None:
        monkeypatch.setattr(_common, "shared_limit", lambda: (major, limit))

    return pretend


def test_a_tile_that_overflows_an_h100_gets_fewer_stages(gpu_shared):
    from pdlkit.kernels.cuda._triton_splitk import pick_split_config, tile_stages

    gpu_shared(9, 232448)  # an H100 / H200
    cfg = pick_split_config(128, 4096, 4096, False)  # 128 x 32, K steps of 256, six stages
    assert tile_stages(cfg, 1, False) == 5  # 245,760 bytes at six
    cfg = pick_split_config(64, 4096, 4096, False)  # the measured decode tile: as it is
    assert tile_stages(cfg, 1, False) == cfg.stages


def test_an_sm89_gpu_gets_fewer_stages_or_a_declined_kernel(gpu_shared):
    from pdlkit.kernels.cuda._common import fit_stages

    gpu_shared(8, 101376)  # an L4 / L40S / RTX 4090: 99 KB a program, stages - 1 buffers
    assert fit_stages(6, 24576, "splitk") == 5  # 5 x 24,576 bytes
    with pytest.raises(
        pdlkit.KernelUnsupported, match="splitk_kernel: .* more than this GPU's 101376"
    ):
        fit_stages(3, 131072, "splitk_kernel")


def test_grouped_qkv_tiles_by_columns_at_decode_rows():
    from pdlkit.kernels.cuda._triton_splitk import SplitConfig, pick_grouped_config

    # Llama-2-7B's 3 x 4096 columns: 192 tiles of 64 x 64, K steps of 128, six in flight
    assert pick_grouped_config(64, [4096] * 3, 4096) == SplitConfig(64, 64, 128, 1, 4, 6)
    # Llama-3's 4096 + 2 x 1024: 96 tiles, K steps of 256, five in flight
    assert pick_grouped_config(64, [4096, 1024, 1024], 4096) == SplitConfig(64, 64, 256, 1, 4, 5)
    assert pick_grouped_config(128, [4096] * 3, 4096).bm == 128  # past 64 rows: _tile's
