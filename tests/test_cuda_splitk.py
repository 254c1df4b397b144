"""The decode-shaped int8 kernels' tile configs (kernels/cuda/_triton_splitk.py and the grouped
Q/K/V kernel of _triton_fused.py), each against an exact integer reference.

On the CPU they run in Triton's interpreter (a subprocess with TRITON_INTERPRET=1). With unit
scales and float32 outputs the int32 sums come out as they are (every sum here is far under
2**24, so float32 holds it exactly): any lost or doubled partial sum of a K slice shows.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_interpreted

pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")

_SCRIPT = textwrap.dedent(
    """
    import json, torch
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
        "one row a tile (multiply-adds)": S.SplitConfig(1, 32, 32, 2, 1, 1),
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
    outs = [torch.full((m, c), float("nan")) for c in (70, 24, 24)]
    ws = [w, w[:24].contiguous(), u[:24].contiguous()]
    Fz.grouped_splitk(q, ones_m, ws, [ones_n, ones_n[:24], ones_n[:24]], outs,
                      config=S.SplitConfig(32, 32, 64, 1, 1, 1))
    out["grouped_exact"] = [bool((o == (q.int() @ g.int().T).float()).all())
                            for o, g in zip(outs, ws)]
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
        "one row a tile (multiply-adds)",
    ],
)
def test_split_k_configs_sum_exactly_in_interpreter(interpreted, config):
    assert interpreted[config]["linear_exact"] == [True, True]  # every int32 sum, both calls
    assert interpreted[config]["gated_err"] < 1e-6  # silu(gate) * up in float32


def test_grouped_qkv_with_a_given_config_sums_exactly_in_interpreter(interpreted):
    assert interpreted["grouped_exact"] == [True, True, True]
