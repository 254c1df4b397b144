"""Decode-shaped int8 GEMMs (M = 1..256) on a GPU, and what a launch costs on the host.

    python benchmarks/cuda_decode.py [--out DIR] [--sweep]

Part 1, the GEMMs of a Llama layer at M rows: pdlkit's split-K kernel
(``kernels/cuda/_triton_splitk.py``; ``--sweep`` tries several tile configs and reports the
best), pdlkit's tiled GEMM (``_triton_gemm.py``), ``torch._int_mm`` + rescale (cuBLASLt) and
BF16 ``F.linear`` (cuBLAS). Each as GB/s of weights streamed (int8: N x K bytes; BF16: 2 N K)
against the device-to-device copy rate measured in the same run (bytes read + written).
Weights rotate over enough copies that L2 (50 MB on an H100) does not hold them.

Part 2, host time per call with no synchronization, one small GEMM: pdlkit's op through its
runner (Triton's Python launcher), the same op traced into an Inductor graph
(``launched_by_inductor``), and Inductor's own code for ``_int_mm`` + rescale.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (name, N, K, gated): a Llama-2-7B layer's GEMMs, and Llama-3-style GQA's narrower K/V
SHAPES = [
    ("qkv each / o 4096x4096", 4096, 4096, False),
    ("gate+up 11008x4096", 11008, 4096, True),
    ("down 4096x11008", 4096, 11008, False),
    ("GQA k/v 1024x4096", 1024, 4096, False),
    ("GQA gate+up 14336x4096", 14336, 4096, True),
]
ROWS = [1, 16, 64, 256]


def bench(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def copy_rate() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / bench(lambda: b.copy_(a)) / 1e6  # GB/s, read + written


def _weights(n: int, k: int, copies: int, dtype: torch.dtype) -> list[torch.Tensor]:
    if dtype == torch.int8:
        return [torch.randint(-127, 128, (n, k), dtype=dtype, device="cuda") for _ in range(copies)]
    return [torch.randn(n, k, device="cuda").to(dtype) for _ in range(copies)]


def _rotating(fns: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    state = {"i": 0}

    def call() -> Any:
        state["i"] = (state["i"] + 1) % len(fns)
        return fns[state["i"]]()

    return call


def split_configs(m: int, n: int, k: int, gated: bool, sweep: bool) -> list[Any]:
    from pdlkit.kernels.cuda import _triton_splitk as S

    configs: list[Any] = [None]
    if not sweep:
        return configs
    bm = min(64, max(16, 1 << (m - 1).bit_length()))
    for bn, bk, split, warps, stages in [
        (16, 256, 1, 4, 4), (32, 256, 1, 4, 4), (64, 256, 1, 4, 4), (32, 256, 2, 4, 4),
        (64, 256, 2, 4, 4), (128, 128, 4, 8, 4), (32, 512, 1, 8, 3),
    ]:  # fmt: skip
        if k // (bk * split) >= 2:
            configs.append(S.SplitConfig(bm, bn, bk, split, warps, stages))
    return configs


def gemm_row(m: int, name: str, n: int, k: int, gated: bool, sweep: bool) -> dict[str, Any]:
    copies = max(2, (160 << 20) // (n * k * (2 if gated else 1)))
    ws = _weights(n, k, copies, torch.int8)
    us = _weights(n, k, copies, torch.int8) if gated else [None] * copies
    q = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    scales = (
        torch.rand(m, device="cuda") * 0.01,
        torch.rand(n, device="cuda") * 0.01,
        torch.rand(n, device="cuda") * 0.01,
    )
    row: dict[str, Any] = {"m": m, "shape": name, "n": n, "k": k}
    row["splitk_ms"], row["splitk_config"] = best_split(q, ws, us, scales, sweep)
    row.update(peers(q, ws, us, scales))
    del ws, us
    wb = _weights(n * (2 if gated else 1), k, max(2, copies // 2), torch.bfloat16)
    xb = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    row["bf16_ms"] = bench(_rotating([functools.partial(F.linear, xb, w) for w in wb]))
    return row


def best_split(
    q: torch.Tensor, ws: list[Any], us: list[Any], scales: tuple[Any, ...], sweep: bool
) -> tuple[float, str]:
    """The fastest split-K config, each checked against a float reference first."""
    from pdlkit.kernels.cuda import _triton_splitk as S

    xs, sw, su = scales
    gated = us[0] is not None
    m, k = q.shape
    n = ws[0].shape[0]
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ref = (q.float() @ ws[0].float().T) * xs[:, None] * sw
    if gated:
        ref = F.silu(ref) * ((q.float() @ us[0].float().T) * xs[:, None] * su)
    best: tuple[float, str] | None = None
    for cfg in split_configs(m, n, k, gated, sweep):

        def split(w: torch.Tensor, u: Any, cfg: Any = cfg) -> Any:
            return S.splitk(q, xs, w, sw, out, u=u, u_scale=su if gated else None, config=cfg)

        try:
            out.fill_(float("nan"))
            split(ws[0], us[0])
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"relative error {err:.1e}"
            ms = bench(
                _rotating([functools.partial(split, w, u) for w, u in zip(ws, us, strict=True)])
            )
        except Exception as e:
            print(f"    {cfg}: {type(e).__name__}: {str(e)[:100]}", flush=True)
            continue
        if best is None or ms < best[0]:
            best = (ms, str(cfg or "default"))
    assert best is not None, "no split-K config ran"
    return best


def peers(
    q: torch.Tensor, ws: list[Any], us: list[Any], scales: tuple[Any, ...]
) -> dict[str, float]:
    """pdlkit's tiled kernel and cuBLASLt's int8 GEMM + rescale on the same weights."""
    from pdlkit.kernels.cuda import _triton_gemm as T

    xs, sw, su = scales
    out = torch.empty(q.shape[0], ws[0].shape[0], device="cuda", dtype=torch.bfloat16)
    if us[0] is not None:
        pairs = zip(ws, us, strict=True)
        gated = [functools.partial(T.gated, q, xs, w, sw, u, su, out) for w, u in pairs]
        return {"tiled_ms": bench(_rotating(gated))}
    tiled = [functools.partial(T.gemm, q, w, out, a_scale=xs, b_scale=sw) for w in ws]
    r = {"tiled_ms": bench(_rotating(tiled))}
    if q.shape[0] > 16:  # cuBLASLt's int8 GEMM needs M > 16

        def int_mm(w: torch.Tensor) -> torch.Tensor:
            return (torch._int_mm(q, w.t()).float() * xs[:, None] * sw).to(torch.bfloat16)

        r["int_mm_ms"] = bench(_rotating([functools.partial(int_mm, w) for w in ws]))
    return r


def rates(row: dict[str, Any], copy_gbs: float, gated: bool) -> None:
    nbytes = row["n"] * row["k"] * (2 if gated else 1)
    for key in ("splitk", "tiled", "int_mm"):
        if f"{key}_ms" in row:
            row[f"{key}_GBs"] = nbytes / row[f"{key}_ms"] / 1e6
            row[f"{key}_of_copy"] = row[f"{key}_GBs"] / copy_gbs
    row["bf16_GBs"] = 2 * nbytes / row["bf16_ms"] / 1e6
    row["bf16_of_copy"] = row["bf16_GBs"] / copy_gbs


# -- host time per call --------------------------------------------------------------------------


def host_us(fn: Callable[[], Any], calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def launch_costs() -> dict[str, float]:
    """One 32 x 256 x 256 int8 GEMM three ways, host microseconds per call."""
    from pathlib import Path

    import pdlkit.kernels
    from pdlkit.runtime_abi.binding import CallSite, bind, new_site
    from pdlkit.runtime_abi.registry import load_kernel_file
    from pdlkit.runtime_abi.triton_binding import compiled_call

    gemm = Path(pdlkit.kernels.__file__).parent / "cuda" / "gemm.py"
    k = {d.name: d for d in load_kernel_file(gemm)}["int8_linear_triton"]
    q = torch.randint(-127, 128, (32, 256), dtype=torch.int8, device="cuda")
    w = torch.randint(-127, 128, (256, 256), dtype=torch.int8, device="cuda")
    xs, ws = torch.rand(32, 1, device="cuda"), torch.rand(256, device="cuda")
    args = (q, xs, w, ws, None, 15)

    def fallback(*a: Any) -> Any:
        raise RuntimeError("declined")

    op = bind(k)
    sid = new_site(CallSite(k, "bench", "bench", "", fallback))
    x = torch.randn(32, 256, device="cuda")
    return {
        "runner_us": host_us(lambda: op(*args, sid)),
        "inductor_launched_us": host_us(compiled_call(op, args, sid)),
        # Inductor's own code, compiled the same way (compile_fx, no Dynamo frame): one of its
        # Triton kernels, and the replaced ops (cuBLASLt's _int_mm + a fused rescale)
        "inductor_one_triton_kernel_us": host_us(_inductor(lambda x: x * 2 + 1, x)),
        "inductor_int_mm_rescale_us": host_us(
            _inductor(
                lambda q, w: (torch._int_mm(q, w.t()).float() * xs * ws).to(torch.bfloat16), q, w
            )
        ),
    }


def _inductor(fn: Callable[..., Any], *args: torch.Tensor) -> Callable[[], Any]:
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    compiled: Any = compile_fx(make_fx(fn)(*args), list(args))
    return lambda: compiled(*args)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--rows", type=int, nargs="*", default=ROWS)
    a = ap.parse_args()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    res["copy_GBs"] = copy_rate()
    print(res, flush=True)
    res["launch"] = launch_costs()
    print("host us per call:", res["launch"], flush=True)
    res["rows"] = []
    for m in a.rows:
        for name, n, k, gated in SHAPES:
            row = gemm_row(m, name, n, k, gated, a.sweep)
            rates(row, res["copy_GBs"], gated)
            res["rows"].append(row)
            print(
                f"M={m:3d} {name:24s} splitk {row['splitk_ms'] * 1e3:7.1f} us "
                f"({row['splitk_of_copy']:.0%} of copy, {row['splitk_config']})  tiled "
                f"{row['tiled_ms'] * 1e3:7.1f} us  int_mm "
                f"{row.get('int_mm_ms', float('nan')) * 1e3:7.1f} us  bf16 "
                f"{row['bf16_ms'] * 1e3:7.1f} us ({row['bf16_of_copy']:.0%})",
                flush=True,
            )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_decode.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "cuda_decode.md").write_text(markdown(res, " ".join(sys.argv[1:])))


def markdown(res: dict[str, Any], argv: str) -> str:
    copy = res["copy_GBs"]
    lines = [
        f"# Decode-shaped int8 GEMMs on {res['device']} (torch {res['torch']})",
        "",
        f"Written by `benchmarks/cuda_decode.py {argv}`. Medians of `triton.testing.do_bench`, "
        "weights rotated so that L2 does not hold them. Rate: weight bytes streamed per "
        f"second (int8: N K bytes, a gated pair twice that; BF16: twice the int8 bytes) "
        f"against the device-to-device copy measured in the same run, {copy:.0f} GB/s "
        "(read + written).",
        "",
        "| M | GEMM (N x K) | split-K us | of copy | best config | tiled us | `_int_mm` + "
        "rescale us | BF16 `F.linear` us | of copy | BF16 / split-K |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        mm = f"{r['int_mm_ms'] * 1e3:.1f}" if "int_mm_ms" in r else "-"
        lines.append(
            f"| {r['m']} | {r['shape']} | {r['splitk_ms'] * 1e3:.1f} | {r['splitk_of_copy']:.0%} "
            f"| {r['splitk_config']} | {r['tiled_ms'] * 1e3:.1f} | {mm} | "
            f"{r['bf16_ms'] * 1e3:.1f} | {r['bf16_of_copy']:.0%} | "
            f"{r['bf16_ms'] / r['splitk_ms']:.2f}x |"
        )
    cost = res.get("launch", {})
    lines += ["", "Host time per call, no synchronization (us):", ""]
    lines += [f"- {k}: {v:.1f}" for k, v in cost.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
