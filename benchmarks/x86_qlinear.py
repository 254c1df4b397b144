"""qlinear_q (and qlinear) on x86: the _int_mm + C epilogue kernels against oneDNN's, per shape.

    python benchmarks/x86_qlinear.py                 # one thread, the shapes below
    python benchmarks/x86_qlinear.py --rounds 9 --repeats 20 --threads 1

Calls the kernel functions themselves (``kernels/x86/qlinear_intmm.py`` and
``kernels/x86/qlinear_onednn.py``) with weights pre-packed once, as the compiled graph does
from its second call (no pdlkit dispatch in the timings: it costs the same for both). For each
(M, K, N, post op) the two kernels run in interleaved rounds in one process: each round times
``--repeats`` calls of one, then of the other, so that load from other users of the machine
falls on both; reported are the medians over all calls and the ratio intmm / oneDNN (< 1: the
_int_mm kernel is faster), and the largest difference in quantization codes between the two.
The float32-output op (``qlinear``) is measured the same way with ``--f32``, through the
epilogue's float32 mode.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from pdlkit.runtime_abi.registry import load_kernel_file

ROOT = Path(__file__).resolve().parents[1]
SHAPES: list[tuple[int, int, int, str, str]] = [
    (512, 256, 1024, "none", ""),
    (512, 256, 1024, "relu", ""),
    (512, 256, 1024, "gelu", "none"),
    (512, 256, 1024, "gelu", "tanh"),
    (512, 1024, 256, "none", ""),
    (512, 256, 256, "none", ""),
    (1, 256, 1024, "gelu", "none"),
    (7, 33, 17, "none", ""),
    (128, 768, 3072, "gelu", "none"),
    (128, 3072, 768, "none", ""),
]


def _kernels() -> dict[str, Any]:
    found = {}
    for f in ("qlinear_intmm.py", "qlinear_onednn.py"):
        found.update({k.name: k for k in load_kernel_file(ROOT / "kernels" / "x86" / f)})
    return found


def _time(fn: Callable[[], Any], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--f32", action="store_true", help="also the float32-output op (qlinear)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ks = _kernels()
    if "qlinear_q_intmm" not in ks:
        raise SystemExit("qlinear_q_intmm is not declared on this host (see the warning above)")
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), rounds {args.rounds} x {args.repeats}"
    )
    print(
        f"{'M':>5} {'K':>5} {'N':>5} {'post':>10} {'oneDNN us':>10} {'intmm us':>10} {'ratio':>6} {'codes':>5}"
    )
    g = torch.Generator().manual_seed(0)
    for m, k, n, post, algo in SHAPES:
        cases, codes = _cases(ks, g, m, k, n, post, algo, args.f32)
        times: dict[str, list[float]] = {c: [] for c in cases}
        for f in cases.values():  # warm up
            _time(f, 3)
        for r in range(args.rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for c in order:
                times[c] += _time(cases[c], args.repeats)
        med = {c: statistics.median(t) for c, t in times.items()}
        name = f"{post}/{algo}" if algo else post
        print(
            f"{m:>5} {k:>5} {n:>5} {name:>10} {med['onednn']:>10.1f} {med['intmm']:>10.1f} "
            f"{med['intmm'] / med['onednn']:>6.2f} {codes:>5}"
        )
        if args.f32:
            print(
                f"{'':>5} {'':>5} {'':>5} {'f32 out':>10} {med['onednn_f32']:>10.1f} "
                f"{med['intmm_f32']:>10.1f} {med['intmm_f32'] / med['onednn_f32']:>6.2f}"
            )


def _cases(
    ks: dict[str, Any], g: torch.Generator, m: int, k: int, n: int, post: str, algo: str, f32: bool
) -> tuple[dict[str, Callable[[], Any]], int]:
    """The calls to time for one shape, and the largest code difference between the kernels."""
    mine, onednn, f32_onednn = ks["qlinear_q_intmm"], ks["qlinear_q_onednn"], ks["qlinear_onednn"]
    x = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    wz = torch.zeros(n, dtype=torch.int64)
    b = torch.randn(n, generator=g)
    attrs: dict[str, Any] = dict(x_scale=0.02, x_zp=128, out_scale=0.05, out_zp=3, out_qmin=0)
    attrs.update(out_qmax=255, post_op=post, algorithm=algo)
    pm, po = mine.prepack(w, attrs), onednn.prepack(w, attrs)
    tail = (ws, wz, b, 0.05, 3, 0, 255, post, algo)
    cases: dict[str, Callable[[], Any]] = {
        "onednn": lambda: onednn.fn(x, 0.02, 128, po, *tail),
        "intmm": lambda: mine.fn(x, 0.02, 128, pm, *tail),
    }
    codes = int((cases["onednn"]().int() - cases["intmm"]().int()).abs().max().item())
    if f32:  # the float32-output epilogue (no qlinear kernel uses it: see the module docstring)
        pf = mine.prepack(w, {**attrs, "out_scale": 1.0, "out_zp": 0})
        pf.params.out_kind = 2
        pfo = f32_onednn.prepack(w, attrs)
        lib = mine.fn.__globals__["_LIB"]

        def f32_mine() -> torch.Tensor:
            out = torch.empty((m, n))
            xs = torch.empty((m, k), dtype=torch.int8)
            lib.pdlkit_u8_to_s8(x.data_ptr(), k, xs.data_ptr(), m, k)
            acc = torch._int_mm(xs, pf.wt)
            lib.pdlkit_qepi_run(
                acc.data_ptr(), m, out.data_ptr(), n, ws.data_ptr(), b.data_ptr(),
                wz.data_ptr(), x.data_ptr(), k, pf.params_addr,
            )  # fmt: skip
            return out

        cases["onednn_f32"] = lambda: f32_onednn.fn(x, 0.02, 128, pfo, ws, wz, b, post, algo)
        cases["intmm_f32"] = f32_mine
    return cases, codes


if __name__ == "__main__":
    main()
