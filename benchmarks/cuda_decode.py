"""Decode-shaped int8 GEMMs (M = 1..256) on a GPU, and what a launch costs on the host.

    python benchmarks/cuda_decode.py [--out DIR] [--sweep] [--rows M ...] [--shapes GQA ...]

Part 1, the GEMMs of a Llama layer at M rows (Llama-2-7B's and Llama-3-style GQA's): pdlkit's
split-K kernel (``kernels/cuda/_triton_splitk.py``; one weight, or a SwiGLU gate/up pair) and
grouped kernel (Q, K and V in one launch, ``_triton_fused.py``), ``torch._int_mm`` + rescale
(cuBLASLt) and BF16 ``F.linear`` (cuBLAS; Q, K, V as one concatenated weight). Each as GB/s of
weights streamed (int8: N x K bytes; BF16: 2 N K) against the device-to-device copy rate
measured in the same run (bytes read + written). ``--sweep`` times several tile configs of
each pdlkit kernel (compiled first in parallel worker processes) and reports the best; among
them, configs that split K again with tile counters zeroed once and kept between calls
("kept counters": no fill per call). Weights laid out in their tiles (a contiguous block a K
step) were measured at 501d4fe and dropped: the best of them 0-0.6 us faster on the four Llama-2
shapes at 64 rows (cuda_decode_h200_m64_blocked_501d4fe.md), not worth packing weights for.

Two timings. ``graph``: a CUDA graph of back-to-back calls over rotating weight copies
(together over three times L2's 50 MB), its replay time over the calls: a decode step as a
captured model runs it. ``do_bench``: Triton's, which zeroes a 256 MB buffer before every
call; the L2 lines that leaves dirty are written back while the GEMM reads (up to L2's size
of extra traffic), which costs a 16 MB GEMM about as much as its own weights.

Part 2 (without ``--sweep``), host time per call with no synchronization, one small GEMM:
pdlkit's op through its runner (Triton's Python launcher), the same op traced into an
Inductor graph (``launched_by_inductor``), and Inductor's own code for ``_int_mm`` + rescale.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import astuple, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass(frozen=True)
class Case:
    """One GEMM of a layer at M rows: ``kind`` linear (one weight [N, K]), gated (gate and up
    weights, [N, K] each) or grouped (Q, K, V weights [N_g, K] sharing their activation)."""

    m: int
    name: str
    ns: tuple[int, ...]
    k: int
    kind: str

    @property
    def nbytes(self) -> int:  # int8 weight bytes streamed per call
        return sum(self.ns) * self.k * (2 if self.kind == "gated" else 1)


SHAPES = [
    ("o (and q, k, v) 4096x4096", (4096,), 4096, "linear"),
    ("gate+up 11008x4096", (11008,), 4096, "gated"),
    ("down 4096x11008", (4096,), 11008, "linear"),
    ("QKV grouped 3 x 4096x4096", (4096, 4096, 4096), 4096, "grouped"),
    ("GQA k/v 1024x4096", (1024,), 4096, "linear"),
    ("GQA gate+up 14336x4096", (14336,), 4096, "gated"),
    ("GQA down 4096x14336", (4096,), 14336, "linear"),
    ("GQA QKV grouped 4096+2x1024", (4096, 1024, 1024), 4096, "grouped"),
]
ROWS = [1, 16, 64, 256]
# (BN, BK, SPLIT_K, warps, stages) tried by --sweep, each with BM covering the rows (at most
# 64), and BM 64 and 128 for more rows
TILES = [
    (16, 256, 1, 4, 4), (32, 256, 1, 4, 4), (32, 256, 1, 4, 6), (64, 256, 1, 4, 4),
    (128, 256, 1, 8, 3), (32, 512, 1, 8, 3), (64, 256, 2, 4, 4), (64, 256, 4, 4, 4),
    (128, 256, 2, 8, 3), (128, 256, 4, 8, 3), (128, 128, 8, 4, 4),
    # fewer stages: two to four programs an SM, every program of a decode GEMM resident at once
    (32, 256, 1, 4, 3), (32, 128, 1, 4, 3), (64, 128, 1, 4, 4), (64, 256, 1, 4, 2),
    # wide tiles (fewer activation re-reads from L2), K split eight ways to keep programs
    (128, 256, 8, 8, 3), (256, 128, 8, 8, 3),
    # deeper pipelines: more weight bytes in flight per SM
    (16, 256, 1, 4, 8), (32, 256, 1, 4, 8), (32, 128, 1, 4, 6), (32, 128, 1, 4, 8),
    (64, 256, 1, 4, 5), (64, 256, 1, 4, 6), (64, 128, 1, 4, 6), (64, 128, 1, 4, 8),
    # K split in two or four (partial sums stored, added by the tile's last slice)
    (64, 256, 2, 4, 6), (64, 128, 2, 4, 4), (64, 128, 2, 4, 8), (128, 128, 2, 4, 6),
    (128, 128, 4, 4, 6),
    # eight warps on one 32-column weight tile (more loads issued an SM), wider K steps
    (32, 256, 1, 8, 4), (32, 256, 1, 8, 6), (32, 512, 1, 4, 4), (32, 512, 1, 8, 4),
    # K split, more shapes: fewer activation re-reads (wider tiles), more programs
    (32, 256, 2, 4, 6), (32, 256, 4, 4, 4), (64, 256, 2, 4, 3), (64, 128, 2, 4, 6),
    (64, 256, 4, 4, 6), (128, 256, 4, 4, 4), (128, 128, 4, 8, 4), (128, 128, 8, 4, 6),
]  # fmt: skip
SMEM = 227 * 1024


@dataclass(frozen=True)
class Kept:
    """A config whose K slices count themselves in on tile counters zeroed once and kept
    between calls (``splitk(counters=...)``), not zeroed by a fill before each call."""

    cfg: Any

    def __str__(self) -> str:
        return f"kept counters {self.cfg}"


_COUNTERS: dict[str, torch.Tensor] = {}


def kept_counters() -> torch.Tensor:
    if "c" not in _COUNTERS:
        _COUNTERS["c"] = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    return _COUNTERS["c"]


def bench(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def graph_ms(calls: Sequence[Callable[[], Any]], replays: int = 7) -> float:
    """Milliseconds per call of ``calls`` captured back to back in one CUDA graph."""
    for f in calls[:2]:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in calls:
            f()
    g.replay()
    times = []
    for _ in range(replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del g
    return statistics.median(times) / len(calls)


def copy_rate() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / bench(lambda: b.copy_(a)) / 1e6  # GB/s, read + written


def _rotating(fns: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    state = {"i": 0}

    def call() -> Any:
        state["i"] = (state["i"] + 1) % len(fns)
        return fns[state["i"]]()

    return call


def _rotation(fns: Sequence[Callable[[], Any]], calls: int = 24) -> list[Callable[[], Any]]:
    """At least ``calls`` calls cycling over ``fns`` (one per weight copy)."""
    return [fns[i % len(fns)] for i in range(max(calls, len(fns)))]


# -- the kernels under test ---------------------------------------------------------------------


def candidates(case: Case, sweep: bool) -> list[Any]:
    """None (the kernel's own pick), then with ``sweep`` the TILES that fit the case."""
    from pdlkit.kernels.cuda._triton_splitk import SplitConfig

    if not sweep:
        return [None]
    m, k = case.m, case.k
    gated = case.kind == "gated"
    out: list[Any] = [None]
    bms = [min(64, max(16, 1 << (m - 1).bit_length()))] if m <= 64 else [64, 128]
    for bm in bms:
        for bn, bk, split, warps, stages in TILES:
            tiles = sum(-(-n // bn) for n in case.ns) * -(-m // bm)
            smem = stages * bk * (bm + bn * (2 if gated else 1))
            if (
                (case.kind == "grouped" and split > 1)
                or (m >= 128 and bn < 32)
                or k // (bk * split) < 2
                or not 32 <= tiles * split <= 4096
                or smem > SMEM
            ):
                continue
            out.append(SplitConfig(bm, bn, bk, split, warps, stages))
            if split > 1:
                out.append(Kept(out[-1]))
    return out


@dataclass
class Inputs:
    q: torch.Tensor
    xs: torch.Tensor
    sets: list[list[torch.Tensor]]  # per weight copy: the case's weights
    scales: list[torch.Tensor]  # per weight (the copies share them)
    outs: list[torch.Tensor]


def make_inputs(case: Case, copies: int, fill: bool = True) -> Inputs:
    m, k = case.m, case.k
    shapes = [(n, k) for n in case.ns] * (2 if case.kind == "gated" else 1)

    def weight(shape: tuple[int, int]) -> torch.Tensor:
        if fill:
            return torch.randint(-127, 128, shape, dtype=torch.int8, device="cuda")
        return torch.empty(shape, dtype=torch.int8, device="cuda")

    return Inputs(
        q=torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda"),
        xs=torch.rand(m, device="cuda") * 0.01,
        sets=[[weight(s) for s in shapes] for _ in range(copies)],
        scales=[torch.rand(s[0], device="cuda") * 0.01 for s in shapes],
        outs=[torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for n in case.ns],
    )


def run_case(case: Case, x: Inputs, ws: list[torch.Tensor], cfg: Any) -> None:
    from pdlkit.kernels.cuda import _triton_fused as Fz
    from pdlkit.kernels.cuda import _triton_splitk as S

    extra: dict[str, Any] = {}
    if isinstance(cfg, Kept):
        extra["counters"] = kept_counters()
        cfg = cfg.cfg
    if case.kind == "grouped":
        Fz.grouped_splitk(x.q, x.xs, ws, x.scales, x.outs, config=cfg, **extra)
    elif case.kind == "gated":
        S.splitk(x.q, x.xs, ws[0], x.scales[0], x.outs[0], u=ws[1], u_scale=x.scales[1], config=cfg, **extra)  # fmt: skip
    else:
        S.splitk(x.q, x.xs, ws[0], x.scales[0], x.outs[0], config=cfg, **extra)


def reference(case: Case, x: Inputs) -> list[torch.Tensor]:
    ws = x.sets[0]
    ys = [
        (x.q.float() @ w.float().T) * x.xs[:, None] * s for w, s in zip(ws, x.scales, strict=True)
    ]
    if case.kind == "gated":
        return [F.silu(ys[0]) * ys[1]]
    return ys


def _compile(job: tuple[Case, tuple[int, ...]]) -> str:
    """In a worker process: one call of the case with this config, so that Triton's disk
    cache holds its binary when the main process times it ('' or why it failed)."""
    from pdlkit.kernels.cuda._triton_splitk import SplitConfig

    case, cfg = job
    try:
        x = make_inputs(case, 1, fill=False)
        run_case(case, x, x.sets[0], SplitConfig(*cfg))
        torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:120]}"


def precompile(cases: list[Case], workers: int) -> None:
    jobs = [
        (c, astuple(cfg))
        for c in cases
        for cfg in candidates(c, True)
        if cfg is not None and not isinstance(cfg, Kept)  # Kept runs its config's binary
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        errors = [e for e in pool.map(_compile, jobs, chunksize=4) if e]
    print(f"compiled {len(jobs)} configs in {time.perf_counter() - t0:.0f} s "
          f"({workers} processes; {len(errors)} failed{': ' + errors[0] if errors else ''})",
          flush=True)  # fmt: skip


def time_pdlkit(case: Case, x: Inputs, sweep: bool) -> dict[str, Any]:
    """Each candidate checked against a float reference, then timed in a graph; the kernel's
    own pick and the fastest also by do_bench."""
    ref = reference(case, x)
    timed: dict[str, float] = {}
    for cfg in candidates(case, sweep):
        fns = [functools.partial(run_case, case, x, ws, cfg) for ws in x.sets]
        try:
            for o in x.outs:
                o.fill_(float("nan"))
            fns[0]()
            for o, r in zip(x.outs, ref, strict=True):
                err = ((o.float() - r).norm() / r.norm()).item()
                assert err < 1e-2, f"relative error {err:.1e}"
            timed[str(cfg or "pick")] = graph_ms(_rotation(fns))
        except Exception as e:
            print(f"    {cfg}: {type(e).__name__}: {str(e)[:100]}", flush=True)
    best = min(timed, key=timed.__getitem__)
    row: dict[str, Any] = {"pick_graph_ms": timed.get("pick", float("nan")), "best_config": best}
    row["best_graph_ms"] = timed[best]
    by_name = {str(c or "pick"): c for c in candidates(case, sweep)}
    fns = [functools.partial(run_case, case, x, ws, by_name[best]) for ws in x.sets]
    row["best_bench_ms"] = bench(_rotating(fns))
    if sweep:
        row["sweep_graph"] = timed
    return row


def time_peers(case: Case, x: Inputs, copies: int) -> dict[str, float]:
    """BF16 F.linear (the gated pair and Q, K, V as one weight), cuBLASLt's _int_mm, and past
    64 rows pdlkit's tiled GEMM (``_triton_gemm.py``, which int8_linear_triton runs there)."""
    from pdlkit.kernels.cuda import _triton_gemm as T

    row: dict[str, float] = {}
    if case.m > 64 and case.kind != "grouped":
        o, (sw, su) = x.outs[0], (x.scales + x.scales)[:2]
        tiled = [
            functools.partial(T.gated, x.q, x.xs, s[0], sw, s[1], su, o)
            if case.kind == "gated"
            else functools.partial(T.gemm, x.q, s[0], o, a_scale=x.xs, b_scale=sw)
            for s in x.sets
        ]
        row["tiled_graph_ms"] = graph_ms(_rotation(tiled))
    if case.kind == "linear" and case.m > 16:  # cuBLASLt's int8 GEMM needs M > 16

        def int_mm(w: torch.Tensor) -> torch.Tensor:
            return (torch._int_mm(x.q, w.t()).float() * x.xs[:, None] * x.scales[0]).to(torch.bfloat16)  # fmt: skip

        row["int_mm_graph_ms"] = graph_ms(_rotation([functools.partial(int_mm, s[0]) for s in x.sets]))  # fmt: skip
    row.update(stream_floor(case.nbytes, copies))
    n = sum(case.ns) * (2 if case.kind == "gated" else 1)
    xb = torch.randn(case.m, case.k, device="cuda", dtype=torch.bfloat16)
    wb = [torch.randn(n, case.k, device="cuda").to(torch.bfloat16) for _ in range(max(2, copies // 2))]  # fmt: skip
    fns = [functools.partial(F.linear, xb, w) for w in wb]
    row["bf16_graph_ms"] = graph_ms(_rotation(fns))
    row["bf16_bench_ms"] = bench(_rotating(fns))
    return row


@functools.cache
def _read_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def read_kernel(p, out, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):  # noqa: N803
        """Sums (so that no load is dropped) program_id's STEPS blocks of ``p``'s n int32."""
        base = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in range(STEPS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(p + offs, mask=offs < n, other=0)
        tl.store(out + tl.program_id(0), tl.sum(acc, axis=0))

    return read_kernel


# (int32 words a block, blocks a program, warps) tried for the stream floor
READS = [(2048, 1, 4), (2048, 4, 4), (2048, 16, 4), (4096, 4, 8), (4096, 8, 8), (8192, 2, 8)]


def stream_floor(nbytes: int, copies: int) -> dict[str, float]:
    """A floor for a kernel that reads ``nbytes`` once, timed as the GEMMs are (a graph over
    ``copies`` rotating buffers): the fastest of a few launches of a kernel that only reads
    them (``read_graph_ms``), and ``torch.Tensor.copy_`` of the same bytes (``copy_graph_ms``:
    the copy rate at this size, reading and writing them)."""
    words = nbytes // 4
    bufs = [torch.randint(-(2**30), 2**30, (words,), dtype=torch.int32, device="cuda")
            for _ in range(copies)]  # fmt: skip
    kernel = _read_kernel()
    best = float("inf")
    for block, steps, warps in READS:
        grid = (-(-words // (block * steps)),)
        out = torch.empty(grid[0], dtype=torch.int32, device="cuda")

        def read(b: torch.Tensor, block: int = block, steps: int = steps, warps: int = warps,
                 grid: tuple[int] = grid, out: torch.Tensor = out) -> None:  # fmt: skip
            kernel[grid](b, out, words, BLOCK=block, STEPS=steps, num_warps=warps)

        best = min(best, graph_ms(_rotation([functools.partial(read, b) for b in bufs])))
    dst = torch.empty_like(bufs[0])
    copy = graph_ms(_rotation([functools.partial(dst.copy_, b) for b in bufs]))
    return {"read_graph_ms": best, "copy_graph_ms": copy}


def weight_copies(nbytes: int, least: int = 2) -> int:
    """Weight copies to rotate over, together over three times L2's 50 MB (160 MB), so that
    each call reads its weights from HBM as a model's layers do."""
    return max(least, -(-(160 << 20) // nbytes))


def gemm_row(case: Case, sweep: bool, copy_gbs: float) -> dict[str, Any]:
    copies = weight_copies(case.nbytes)
    x = make_inputs(case, copies)
    row: dict[str, Any] = {"m": case.m, "shape": case.name, "ns": case.ns, "k": case.k}
    row["kind"] = case.kind
    row.update(time_pdlkit(case, x, sweep))
    row.update(time_peers(case, x, copies))
    del x
    for key in [k for k in row if k.endswith("_ms")]:
        moved = 2 if key.startswith(("bf16", "copy")) else 1  # BF16 weights; a copy writes too
        row[key.replace("_ms", "_of_copy")] = moved * case.nbytes / row[key] / 1e6 / copy_gbs
    return row


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
    import pdlkit.kernels.ops.logical_ops  # noqa: F401 (binds the implements= declarations)
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
    ap.add_argument("--shapes", nargs="*", help="only the shapes whose name holds one of these")
    ap.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    a = ap.parse_args()
    from machine import host_header

    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    res["host"] = host_header()
    res["copy_GBs"] = copy_rate()
    print(res, flush=True)
    shapes = [s for s in SHAPES if not a.shapes or any(w in s[0] for w in a.shapes)]
    cases = [Case(m, *shape) for m in a.rows for shape in shapes]
    if a.sweep:
        precompile(cases, a.workers)
    else:
        res["launch"] = launch_costs()
        print("host us per call:", res["launch"], flush=True)
    res["rows"] = []
    for case in cases:
        try:
            row = gemm_row(case, a.sweep, res["copy_GBs"])
        except Exception as e:  # one case's failure must not lose the others' figures
            print(f"{case}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        res["rows"].append(row)
        print(table_line(row), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_decode.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res, " ".join(sys.argv[1:]))
    (out / "cuda_decode.md").write_text(md)
    print(md)


def _us(row: dict[str, Any], key: str) -> str:
    return f"{row[key] * 1e3:.1f}" if key in row else "-"


def _pct(row: dict[str, Any], key: str) -> str:
    return f"{row[key]:.0%}" if key in row else "-"


def table_line(r: dict[str, Any]) -> str:
    return (
        f"| {r['m']} | {r['shape']} | {_us(r, 'pick_graph_ms')} | {_pct(r, 'pick_graph_of_copy')} "
        f"| {_us(r, 'best_graph_ms')} | {_pct(r, 'best_graph_of_copy')} | {r['best_config']} "
        f"| {_us(r, 'best_bench_ms')} | {_pct(r, 'best_bench_of_copy')} "
        f"| {_us(r, 'tiled_graph_ms')} | {_us(r, 'int_mm_graph_ms')} | {_us(r, 'bf16_graph_ms')} "
        f"| {_pct(r, 'bf16_graph_of_copy')} | {_us(r, 'bf16_bench_ms')} "
        f"| {r['bf16_graph_ms'] / r['best_graph_ms']:.2f}x | {_us(r, 'read_graph_ms')} "
        f"| {_pct(r, 'read_graph_of_copy')} | {_us(r, 'copy_graph_ms')} "
        f"| {_pct(r, 'copy_graph_of_copy')} | {_floor(r)} |"
    )


def _floor(r: dict[str, Any]) -> str:
    """The GEMM's time against reading its weights alone (the stream floor)."""
    return f"{r['read_graph_ms'] / r['best_graph_ms']:.0%}" if "read_graph_ms" in r else "-"


def markdown(res: dict[str, Any], argv: str) -> str:
    copy = res["copy_GBs"]
    lines = [
        f"# Decode-shaped int8 GEMMs on {res['device']} (torch {res['torch']})",
        "",
        *res["host"],
        "",
        f"Written by `benchmarks/cuda_decode.py {argv}`. Rate: int8 weight bytes streamed per "
        "second (a gated pair's two weights, grouped Q, K, V's three) against the "
        f"device-to-device copy measured in the same run, {copy:.0f} GB/s (read + written); "
        "BF16 streams twice the bytes. graph: medians of a CUDA graph's replays, back-to-back "
        "calls over rotating weight copies, per call. do_bench: Triton's (L2 flushed by a "
        "256 MB fill before each call, whose dirty lines are written back during the call). "
        "pick: `pick_split_config` / `pick_grouped_config` as committed; best: the fastest "
        "config tried (SplitConfig(bm, bn, bk, split_k, warps, stages)). Read floor: the "
        "fastest of a few launches of a kernel that only reads the case's weight bytes, timed "
        "as the GEMMs are (about what a kernel reading them once can reach); copy of the bytes: "
        "`copy_` of them (the copy rate at this size); GEMM at the floor's rate: read floor / "
        "best graph.",
        "",
        "| M | GEMM (N x K) | pick graph us | of copy | best graph us | of copy | best config "
        "| best do_bench us | of copy | tiled graph us | `_int_mm` + rescale graph us "
        "| BF16 graph us | of copy "
        "| BF16 do_bench us | BF16 / best (graph) | read floor graph us | of copy "
        "| copy of the bytes graph us | of copy | GEMM at the floor's rate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *[table_line(r) for r in res["rows"]],
    ]
    cost = res.get("launch", {})
    if cost:
        lines += ["", "Host time per call, no synchronization (us):", ""]
        lines += [f"- {k}: {v:.1f}" for k, v in cost.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
