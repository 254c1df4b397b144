"""Decode-shaped int8 weight-only GEMMs (torchao's ``Int8WeightOnlyConfig``) on a GPU.

    python benchmarks/cuda_weight_only.py [--out DIR] [--rows M ...] [--sweep]

The linears of a Llama layer at M rows (Llama-2-7B's and Llama-3-style GQA's; torchao keeps
Q, K and V apart): pdlkit's split-K kernel with ``weight_only`` (bf16 activations, int8
weights widened in registers, ``kernels/cuda/_triton_splitk.py``), at its own pick
(``w8_config``) and, with ``--sweep``, at each config of ``TILES`` that fits; BF16
``F.linear`` (cuBLAS) on the same layer's bf16 weights is the peer. Past 64 rows the
path that widens the weight whole and calls cuBLAS (``widened``) is timed too. Timed as
``cuda_decode.py`` times the int8 GEMMs: a CUDA graph of back-to-back calls over rotating
weight copies (over three times L2's size), replay time per call; rates as bytes of weights
streamed against the copy rate measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import astuple, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_decode import _rotation, copy_rate, graph_ms, weight_copies  # noqa: E402

SHAPES = [  # (name, N, K)
    ("q, k, v, o 4096x4096", 4096, 4096),
    ("gate, up 11008x4096", 11008, 4096),
    ("down 4096x11008", 4096, 11008),
    ("GQA k, v 1024x4096", 1024, 4096),
    ("GQA gate, up 14336x4096", 14336, 4096),
    ("GQA down 4096x14336", 4096, 14336),
]
ROWS = [1, 16, 64, 256]
# (BN, BK, SPLIT_K, warps, stages), each with BM covering the rows (at most 64; 64 and 128 past)
TILES = [
    (32, 256, 1, 4, 5), (32, 128, 1, 4, 6), (64, 128, 1, 4, 4), (64, 256, 1, 4, 3),
    (128, 128, 1, 8, 3), (128, 64, 1, 4, 4),
    (64, 128, 2, 4, 4), (64, 256, 2, 4, 3), (128, 128, 2, 8, 3), (128, 64, 2, 4, 4),
    (128, 128, 4, 4, 4), (128, 128, 4, 8, 3), (128, 64, 4, 4, 6), (256, 64, 4, 8, 3),
    (128, 128, 8, 4, 4), (256, 64, 8, 8, 3), (64, 128, 4, 4, 4), (64, 256, 4, 4, 3),
    (32, 256, 2, 4, 4), (32, 128, 4, 4, 6),
    # eight warps on 64-column tiles: more warps an SM to hide the int8 -> bf16 widening's latency
    # (not in the sweep behind w8_config's picks)
    (64, 128, 1, 8, 4), (64, 128, 2, 8, 4), (64, 256, 1, 8, 3), (128, 64, 2, 8, 4),
]  # fmt: skip
SMEM = 227 * 1024


def candidates(m: int, n: int, k: int, sweep: bool) -> list[Any]:
    """None (the kernel's own pick) and the pick with the dot's operands swapped (the widened
    weight first: ``SplitConfig.swap``), then with ``sweep`` the TILES that fit, each both ways."""
    from pdlkit.kernels.cuda._triton_gemm import _sms
    from pdlkit.kernels.cuda._triton_splitk import SplitConfig, w8_config

    out: list[Any] = [None, replace(w8_config(m, n, k, _sms()), swap=True)]
    if not sweep:
        return out
    bms = [min(64, max(16, 1 << (m - 1).bit_length()))] if m <= 64 else [64, 128]
    for bm in bms:
        for bn, bk, split, warps, stages in TILES:
            tiles = -(-n // bn) * -(-m // bm)
            if stages * bk * (2 * bm + bn) > SMEM or k // (bk * split) < 2:
                continue
            if not 16 <= tiles * split <= 4096:
                continue
            out += [SplitConfig(bm, bn, bk, split, warps, stages, swap) for swap in (False, True)]
    return out


def _inputs(m: int, n: int, k: int, copies: int) -> dict[str, Any]:
    return {
        "x": torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
        "w": [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(copies)],
        "s": torch.rand(n, device="cuda") * 0.01,
        "out": torch.empty(m, n, device="cuda", dtype=torch.bfloat16),
    }  # fmt: skip


def _run(x: dict[str, Any], w: torch.Tensor, cfg: Any) -> None:
    from pdlkit.kernels.cuda import _triton_splitk as S

    S.splitk(x["x"], None, w, x["s"], x["out"], config=cfg, weight_only=True)


def _compile(job: tuple[int, int, int, tuple[int, ...]]) -> str:
    """In a worker process: one call with this config, so Triton's disk cache holds it."""
    from pdlkit.kernels.cuda._triton_splitk import SplitConfig

    m, n, k, cfg = job
    try:
        _run(_inputs(m, n, k, 1), torch.zeros(n, k, dtype=torch.int8, device="cuda"), SplitConfig(*cfg))  # fmt: skip
        torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:120]}"


def precompile(cases: list[tuple[int, int, int]], workers: int) -> None:
    jobs = [(*c, astuple(cfg)) for c in cases for cfg in candidates(*c, True) if cfg is not None]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        errors = [e for e in pool.map(_compile, jobs, chunksize=4) if e]
    print(f"compiled {len(jobs)} configs in {time.perf_counter() - t0:.0f} s, "
          f"{len(errors)} failed{': ' + errors[0] if errors else ''}", flush=True)  # fmt: skip


def row(m: int, n: int, k: int, sweep: bool) -> dict[str, Any]:
    """Each candidate checked against a float reference, then timed in a graph; BF16 too."""
    copies = weight_copies(n * k)
    x = _inputs(m, n, k, copies)
    ref = (x["x"].float() @ x["w"][0].float().T) * x["s"].bfloat16().float()
    timed: dict[str, float] = {}
    for cfg in candidates(m, n, k, sweep):
        try:
            x["out"].fill_(float("nan"))
            _run(x, x["w"][0], cfg)
            err = ((x["out"].float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"relative error {err:.1e}"
            timed[str(cfg or "pick")] = graph_ms(
                _rotation([functools.partial(_run, x, w, cfg) for w in x["w"]])
            )
        except Exception as e:
            print(f"  {m} x {n}x{k} {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    if m > 64:  # the weight widened whole, then cuBLAS (kernels/cuda/weight_only.py)
        from pdlkit.kernels.cuda.weight_only import _widened

        ws = x["s"].reshape(-1, 1)
        calls = [functools.partial(_widened, x["x"], w, ws, None) for w in x["w"]]
        timed["widened"] = graph_ms(_rotation(calls))
    del x
    wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies // 2 + 1)]
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bf16 = graph_ms(_rotation([functools.partial(F.linear, a, w) for w in wb]))
    best = min(timed, key=timed.__getitem__)
    return {"m": m, "n": n, "k": k, "pick_ms": timed.get("pick"), "best": best,
            "best_ms": timed[best], "bf16_ms": bf16, "timed": timed}  # fmt: skip


def markdown(res: dict[str, Any], argv: str) -> str:
    from machine import host_header

    gbs = res["copy_GBs"]
    lines = [
        f"# int8 weight-only GEMMs at decode rows on {res['device']}", "",
        f"Written by `benchmarks/cuda_weight_only.py {argv}`.", "", *host_header(), "",
        f"Copy rate {gbs:.0f} GB/s (read + written); us per call in a CUDA graph over rotating "
        "weight copies; `of copy`: int8 weight bytes (BF16: twice) per second against it.", "",
        "| M | GEMM (N x K) | pick us | of copy | best us | best config | BF16 us | of copy "
        "| BF16 / pick | BF16 / best |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in res["rows"]:
        nb = r["n"] * r["k"]
        pick = r["pick_ms"] or float("nan")
        lines.append(
            f"| {r['m']} | {r['name']} | {pick * 1e3:.1f} | {nb / pick / 1e6 / gbs:.0%} "
            f"| {r['best_ms'] * 1e3:.1f} | {r['best']} | {r['bf16_ms'] * 1e3:.1f} "
            f"| {2 * nb / r['bf16_ms'] / 1e6 / gbs:.0%} | {r['bf16_ms'] / pick:.2f}x "
            f"| {r['bf16_ms'] / r['best_ms']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--rows", type=int, nargs="*", default=ROWS)
    ap.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    a = ap.parse_args()
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "copy_GBs": copy_rate()}
    cases = [(m, n, k, name) for m in a.rows for name, n, k in SHAPES]
    if a.sweep:
        precompile([c[:3] for c in cases], a.workers)
    res["rows"] = []
    for m, n, k, name in cases:
        r = row(m, n, k, a.sweep) | {"name": name}
        res["rows"].append(r)
        print(
            m, name, {key: r[key] for key in ("pick_ms", "best", "best_ms", "bf16_ms")}, flush=True
        )
    from measure import write_report

    out = Path(a.out)
    write_report(out / "cuda_weight_only.md", markdown(res, " ".join(sys.argv[1:])))
    (out / "cuda_weight_only.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
