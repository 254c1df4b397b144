"""CUDA GEMM and Llama-MLP benchmark: pdlkit's Triton int8 kernels vs torch._int_mm and BF16.

Run on a GPU machine (``benchmarks/run_gpu.sh`` runs the GPU tests and this in one go):

    python benchmarks/cuda_gemm.py [--out benchmarks/results] [--quick] [--sweep]

Prints, in one run: the two ceilings (device-to-device copy, BF16 8192^3 matmul), GEMM
throughput of pdlkit int8 (Triton, fused rescale epilogue) vs ``torch._int_mm`` (cuBLASLt)
vs BF16 ``torch.mm`` at 4096^3, 8192^3 and transformer shapes, and a SiLU-gated Llama MLP
(hidden 4096, intermediate 11008, 2048 tokens) end to end: Inductor BF16, the naive int8 path
under Inductor, and pdlkit (int8 dynamic per token). Medians of CUDA-event timings (Triton's
``do_bench``), inputs rotated so L2 does not hold them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import host_header  # noqa: E402


def bench(fn, reps: int = 50) -> float:
    """Median milliseconds of ``fn`` over ``reps`` timed runs (CUDA events), after warm-up."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=reps * 2, return_mode="median"))


def ceilings() -> dict[str, float]:
    n = 1 << 30  # 1 GiB each way
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a))
    copy_tbs = 2 * n / ms / 1e9
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(lambda: x @ y)
    return {"copy_TBps": copy_tbs, "bf16_mm_8192_TFLOPs": 2 * 8192**3 / ms / 1e9}


def fastest(label: str, run, configs: list, ops: int, verbose: bool = True) -> tuple[float, str]:
    """(median ms, config) of the fastest tile config of ``run(config)``; None is the default
    choice. Configs that do not fit (shared memory) are reported and skipped."""
    best: tuple[float, str] | None = None
    for cfg in configs:
        try:
            ms = bench(lambda cfg=cfg: run(cfg))
        except Exception as e:
            print(f"  {label} {cfg}: {type(e).__name__}: {str(e)[:80]}")
            continue
        if verbose:
            print(f"  {label} {cfg or 'default'}: {ops / ms / 1e9:.0f} TOP/s {ms:.3f} ms")
        if best is None or ms < best[0]:
            best = (ms, str(cfg or "default"))
    assert best is not None, f"no tile config of {label} ran"
    return best


def gemm_table(shapes, sweep: bool) -> list[dict]:
    return [gemm_row(m, n, k, sweep) for m, n, k in shapes]


def gemm_row(m: int, n: int, k: int, sweep: bool) -> dict:
    from pdlkit.kernels.cuda import _triton_gemm as T

    q = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
    xs = torch.rand(m, device="cuda") * 0.01
    ws = torch.rand(n, device="cuda") * 0.01
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    # correctness first, on these random inputs
    T.gemm(q, w, out, a_scale=xs, b_scale=ws)
    ref = ((q.float() @ w.float().T) * xs[:, None] * ws).to(torch.bfloat16)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    configs = [None]
    if sweep:
        configs += [
            T.Config(bm, bn, bk, wp, st)
            for bm, bn, bk, wp, st in [
                (128, 256, 128, 8, 4),
                (128, 128, 128, 8, 4),
                (64, 128, 128, 4, 4),
                (256, 128, 128, 8, 3),
            ]
        ]
    best = fastest(
        f"{m}x{n}x{k}",
        lambda cfg: T.gemm(q, w, out, a_scale=xs, b_scale=ws, config=cfg),
        configs,
        2 * m * n * k,
        verbose=sweep,
    )
    wt = w.t()
    ms_int = bench(lambda: torch._int_mm(q, wt))
    ms_int_rescale = bench(
        lambda: (torch._int_mm(q, wt).float() * xs[:, None] * ws).to(torch.bfloat16)
    )
    a16 = q.to(torch.bfloat16)
    b16 = w.to(torch.bfloat16).t()
    ms_bf16 = bench(lambda: a16 @ b16)
    flop = 2 * m * n * k
    row = {
        "shape": [m, n, k],
        "rel_err": err,
        "pdlkit_ms": best[0],
        "best_config": best[1],
        "pdlkit_TOPs": flop / best[0] / 1e9,
        "int_mm_TOPs": flop / ms_int / 1e9,
        "int_mm_rescale_TOPs": flop / ms_int_rescale / 1e9,
        "bf16_TFLOPs": flop / ms_bf16 / 1e9,
    }
    row["vs_int_mm"] = row["pdlkit_TOPs"] / row["int_mm_TOPs"]
    print(
        f"{m:>5}x{n:>5}x{k:>5}  pdlkit {row['pdlkit_TOPs']:7.0f} TOP/s  _int_mm "
        f"{row['int_mm_TOPs']:7.0f}  (+rescale {row['int_mm_rescale_TOPs']:6.0f})  bf16 "
        f"{row['bf16_TFLOPs']:6.0f}  ratio {row['vs_int_mm']:.2f}x  err {err:.1e}",
        flush=True,
    )
    return row


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int = 4096, inter: int = 11008):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def bf16_row(m: int, n: int, k: int) -> dict:
    """Triton BF16 GEMM + bias (the ``linear`` kernel) vs cuBLAS through ``F.linear``."""
    from pdlkit.kernels.cuda import _triton_gemm as T

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    T.gemm(x, w, out, bias=b)
    ref = F.linear(x.float(), w.float(), b.float())
    err = ((out.float() - ref).norm() / ref.norm()).item()
    flop = 2 * m * n * k
    tri = flop / bench(lambda: T.gemm(x, w, out, bias=b)) / 1e9
    cub = flop / bench(lambda: F.linear(x, w, b)) / 1e9
    print(
        f"bf16 {m}x{n}x{k}: triton {tri:.0f} TFLOP/s, cuBLAS {cub:.0f}, ratio {tri / cub:.2f}x, err {err:.1e}"
    )
    return {
        "shape": [m, n, k],
        "triton_TFLOPs": tri,
        "cublas_TFLOPs": cub,
        "ratio": tri / cub,
        "rel_err": err,
    }


def mlp_kernels(tokens: int, sweep: bool) -> dict:
    """The four pdlkit kernels of the int8 MLP on their own: where the block's time goes."""
    from pdlkit.kernels.cuda import _triton_gemm as T

    h, i = 4096, 11008
    x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
    hid = torch.randn(tokens, i, device="cuda", dtype=torch.bfloat16)
    wg, wu = (torch.randint(-127, 128, (i, h), dtype=torch.int8, device="cuda") for _ in range(2))
    wd = torch.randint(-127, 128, (h, i), dtype=torch.int8, device="cuda")
    sg, su, sd = (torch.rand(n, device="cuda") * 0.01 for n in (i, i, h))
    q, s = T.quant_rows(x, 1e-8, 127.0)
    qh, sh = T.quant_rows(hid, 1e-8, 127.0)
    out_h = torch.empty(tokens, i, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(tokens, h, device="cuda", dtype=torch.bfloat16)
    res = {
        "quant_x_ms": bench(lambda: T.quant_rows(x, 1e-8, 127.0)),
        "quant_h_ms": bench(lambda: T.quant_rows(hid, 1e-8, 127.0)),
        "down_ms": bench(lambda: T.gemm(qh, wd, out, a_scale=sh.view(-1), b_scale=sd)),
    }
    configs = [None]
    if sweep:
        configs += [
            T.Config(*c)
            for c in [(128, 128, 128, 8, 3), (128, 128, 128, 8, 4), (128, 128, 64, 8, 4),
                      (64, 128, 128, 4, 4), (128, 64, 128, 4, 4), (256, 128, 64, 8, 3)]
        ]  # fmt: skip
    best = fastest(
        "gated",
        lambda cfg: T.gated(q, s.view(-1), wg, sg, wu, su, out_h, config=cfg),
        configs,
        4 * tokens * i * h,
    )
    res["gated_ms"], res["gated_config"] = best
    res["gated_TOPs"] = 4 * tokens * i * h / best[0] / 1e9
    res["sum_ms"] = res["quant_x_ms"] + res["gated_ms"] + res["quant_h_ms"] + res["down_ms"]
    # host cost of one launch (no synchronization), small shapes so the GPU never backs up
    xs_ = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    qs_, ss_ = T.quant_rows(xs_, 1e-8, 127.0)
    ws_ = torch.randint(-127, 128, (256, 256), dtype=torch.int8, device="cuda")
    wss_ = torch.rand(256, device="cuda")
    os_ = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
    res["host_us_quant_launch"] = host_us(lambda x: T.quant_rows(x, 1e-8, 127.0), xs_, 200)
    res["host_us_gemm_launch"] = host_us(
        lambda x: T.gemm(qs_, ws_, os_, a_scale=ss_.view(-1), b_scale=wss_), xs_, 200
    )
    res["host_us_int_mm"] = host_us(lambda x: torch._int_mm(qs_, ws_.t()), xs_, 200)
    print(f"  mlp kernels: {res}", flush=True)
    return res


def host_us(fn, x, calls: int = 40) -> float:
    """Host time per call with no synchronization: when it exceeds the GPU time, the
    launches, not the kernels, set the latency."""
    import time

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def mlp_block(tokens: int) -> dict:
    import copy

    from pdlkit.quantization.int8_dynamic import quantize_int8_dynamic

    import pdlkit

    torch.manual_seed(0)
    fp32 = LlamaMLP().cuda().eval()
    for p in fp32.parameters():
        nn.init.normal_(p, std=0.02)
    x32 = torch.randn(tokens, 4096, device="cuda")
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    xb = x32.to(torch.bfloat16)
    int8 = quantize_int8_dynamic(copy.deepcopy(bf16))
    out = {}
    with torch.no_grad():
        ref = fp32(x32)
        from pdlkit.runtime_abi.capability import host

        print(f"  host: {host().describe()}")
        report = pdlkit.explain(int8, xb)
        out["substituted"] = [f"{r.pattern} -> {r.kernel}" for r in report.substitutions]
        print(f"  pdlkit substitutions: {out['substituted']}", flush=True)
        runs = {
            "inductor_bf16": torch.compile(bf16),
            "inductor_int8_naive": torch.compile(int8),
            "pdlkit_int8": pdlkit.optimize(int8),
            # BF16: no shipped kernel beats cuBLAS, so this is Inductor through pdlkit
            "pdlkit_bf16": pdlkit.optimize(bf16),
        }
        for name, fn in runs.items():
            y = fn(xb)
            cos = F.cosine_similarity(y.float().flatten(), ref.flatten(), dim=0).item()
            ms = bench(lambda fn=fn: fn(xb))
            host = host_us(fn, xb)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn(xb)
            ms_graph = bench(graph.replay)
            out[name] = {"ms": ms, "cosine_vs_fp32": cos, "host_us": host, "graph_ms": ms_graph}
            print(
                f"  mlp {name:22s} {ms:.3f} ms  cos {cos:.5f}  host {host:.0f} us/call  "
                f"CUDA graph {ms_graph:.3f} ms",
                flush=True,
            )
        out["stats"] = pdlkit.stats()
    base = out["inductor_bf16"]["ms"]
    for name in runs:
        out[name]["speedup_vs_bf16_inductor"] = base / out[name]["ms"]
    return out


def markdown(res: dict) -> str:
    c = res["ceilings"]
    v = res["versions"]
    lines = [
        "# CUDA GEMMs and Llama MLP: pdlkit (Triton) vs cuBLASLt int8 and BF16",
        "",
        f"Written by `benchmarks/cuda_gemm.py` on {res['device']} (torch {v['torch']}, CUDA "
        f"{v['cuda']}, Triton {v['triton']}). Medians of CUDA-event timings (do_bench).",
        *res["machine"],  # CPU model, AMX, GPU name, versions, commit
        "",
        f"Ceilings measured in the same run: device-to-device copy {c['copy_TBps']:.2f} TB/s, "
        f"BF16 8192^3 matmul {c['bf16_mm_8192_TFLOPs']:.0f} TFLOP/s.",
        "",
        "| M x N x K | pdlkit int8 TOP/s | `_int_mm` TOP/s | `_int_mm` + rescale | BF16 mm TFLOP/s "
        "| pdlkit / `_int_mm` | pdlkit / BF16 ceiling |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["gemm"]:
        m, n, k = r["shape"]
        lines.append(
            f"| {m} x {n} x {k} | {r['pdlkit_TOPs']:.0f} | {r['int_mm_TOPs']:.0f} | "
            f"{r['int_mm_rescale_TOPs']:.0f} | {r['bf16_TFLOPs']:.0f} | {r['vs_int_mm']:.2f}x | "
            f"{r['pdlkit_vs_bf16_ceiling']:.2f}x |"
        )
    lines += ["", "BF16 GEMM + bias (opt-in Triton kernel) vs cuBLAS (`F.linear`):", ""]
    lines += ["| M x N x K | Triton TFLOP/s | cuBLAS TFLOP/s | ratio |", "|---|---|---|---|"]
    for r in res.get("bf16", []):
        m, n, k = r["shape"]
        lines.append(
            f"| {m} x {n} x {k} | {r['triton_TFLOPs']:.0f} | {r['cublas_TFLOPs']:.0f} | "
            f"{r['ratio']:.2f}x |"
        )
    mk = res["mlp_kernels_2048"]
    mlp = res["mlp_2048"]
    lines += [
        "",
        "Llama MLP (hidden 4096, intermediate 11008, SiLU-gated), 2048 tokens, BF16 activations:",
        "",
        "| path | ms | vs Inductor BF16 | cosine vs FP32 | host us/call | CUDA graph replay ms |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("inductor_bf16", "inductor_int8_naive", "pdlkit_int8", "pdlkit_bf16"):
        if name in mlp:
            r = mlp[name]
            lines.append(
                f"| {name} | {r['ms']:.3f} | {r['speedup_vs_bf16_inductor']:.2f}x | "
                f"{r['cosine_vs_fp32']:.5f} | {r['host_us']:.0f} | {r['graph_ms']:.3f} |"
            )
    lines += [
        "",
        f"pdlkit int8 substitutions: {', '.join(mlp['substituted'])}.",
        f"Its kernels alone: quantize x {mk['quant_x_ms']:.3f} ms, gate+up {mk['gated_ms']:.3f} ms "
        f"({mk['gated_TOPs']:.0f} TOP/s), quantize h {mk['quant_h_ms']:.3f} ms, down "
        f"{mk['down_ms']:.3f} ms; sum {mk['sum_ms']:.3f} ms.",
        f"Host time per launch (no synchronization): Triton GEMM {mk['host_us_gemm_launch']:.0f} us, "
        f"per-token quantize {mk['host_us_quant_launch']:.0f} us, `torch._int_mm` "
        f"{mk['host_us_int_mm']:.0f} us.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="try several tile configs per shape")
    a = ap.parse_args()
    assert torch.cuda.is_available(), "benchmarks/cuda_gemm.py needs a CUDA GPU"
    res: dict = {"machine": host_header(), "device": torch.cuda.get_device_name()}
    print("\n".join(res["machine"]), flush=True)
    import triton

    res["versions"] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
    }
    print(res["device"], res["versions"], flush=True)
    res["ceilings"] = ceilings()
    print("ceilings", res["ceilings"], flush=True)
    big = [(4096, 4096, 4096), (8192, 8192, 8192)]
    llama = [(m, 11008, 4096) for m in (512, 2048, 8192)] + [
        (m, 4096, 11008) for m in (512, 2048, 8192)
    ]
    res["gemm"] = gemm_table(big, a.sweep) + ([] if a.quick else gemm_table(llama, False))
    res["bf16"] = [bf16_row(*shape) for shape in big + [(2048, 11008, 4096), (2048, 4096, 11008)]]
    res["mlp_kernels_2048"] = mlp_kernels(2048, a.sweep)
    res["mlp_2048"] = mlp_block(2048)
    peak = res["ceilings"]["bf16_mm_8192_TFLOPs"]
    for r in res["gemm"]:
        r["pdlkit_vs_bf16_ceiling"] = r["pdlkit_TOPs"] / peak
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_gemm.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "cuda_gemm.md").write_text(markdown(res))
    print("\nsummary")
    for r in res["gemm"]:
        print(f"  {r['shape']}: pdlkit/_int_mm {r['vs_int_mm']:.2f}x, {r['pdlkit_TOPs']:.0f} TOP/s")
    m = res["mlp_2048"]
    print(
        f"  mlp 2048: bf16 inductor {m['inductor_bf16']['ms']:.3f} ms, naive int8 "
        f"{m['inductor_int8_naive']['ms']:.3f} ms, pdlkit {m['pdlkit_int8']['ms']:.3f} ms "
        f"({m['pdlkit_int8']['speedup_vs_bf16_inductor']:.2f}x), cos {m['pdlkit_int8']['cosine_vs_fp32']:.4f}"
    )


if __name__ == "__main__":
    main()
