"""qlinear_q and qlinear on x86: the fused VNNI GEMM kernels against oneDNN's, per shape; and
the BF16 linear kernels (``linear_bf16.py``) against oneDNN's BF16 matmul.

    python benchmarks/x86_qlinear.py                 # one thread, the shapes below
    python benchmarks/x86_qlinear.py --rounds 9 --repeats 20 --threads 1

Calls the kernel functions themselves (``kernels/x86/qlinear_vnni.py`` and
``kernels/x86/qlinear_onednn.py``) with weights pre-packed once, as the compiled graph does
from its second call (no pdlkit dispatch in the timings: it costs the same for both). For each
(M, K, N, post op) the kernels run in interleaved rounds in one process: each round times
``--repeats`` calls of each, in alternating order, so that load from other users of the
machine falls on all; reported are the medians over all calls, GOP/s (2 M N K per call) and
the ratio vnni / oneDNN (< 1: the VNNI kernel is faster), for the requantized output
(``qlinear_q``) and the float32 one (``qlinear``), and the largest difference in quantization
codes between the two kernels. ``torch._int_mm`` on the same operands (s8 x s8 -> s32, no
epilogue) is timed beside them as the GEMM alone. The BF16 part compares ``linear_bf16`` /
``linear_gelu_bf16`` with ``linear_onednn`` / ``linear_gelu_onednn`` (oneDNN's matmul with a
pre-packed weight and a GELU post-op), bf16 in and out, with ``F.linear`` in bf16 beside them.
The third table times ``qlinear_add_layer_norm_q_vnni`` (the GEMM with the residual add,
LayerNorm and quantize in its epilogue) against what a compiled PT2E block ran before it: the
float32 ``qlinear_vnni`` followed by Inductor's add + LayerNorm + quantize kernel
(``torch.compile`` of those three ops).
Writes ``benchmarks/results/x86_qlinear.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from machine import cpu_model, provenance
from pdlkit.runtime_abi.registry import load_kernel_file

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "x86_qlinear.md"
SHAPES: list[tuple[int, int, int, str, str]] = [
    (512, 256, 256, "none", ""),  # bert-mini Q, K, V, attention output
    (512, 1024, 256, "none", ""),  # bert-mini FFN down
    (512, 256, 1024, "gelu", "none"),  # bert-mini FFN up
    (512, 256, 1024, "gelu", "tanh"),
    (512, 256, 1024, "relu", ""),
    (512, 256, 1024, "none", ""),
    (8, 256, 256, "none", ""),  # bert-mini pooler
    (1, 256, 1024, "gelu", "none"),
    (7, 33, 17, "none", ""),
    (128, 768, 768, "none", ""),  # BERT-base 1 x 128
    (128, 768, 3072, "gelu", "none"),
    (128, 3072, 768, "none", ""),
]


def _kernels() -> dict[str, Any]:
    found = {}
    for f in ("x86/qlinear_vnni.py", "x86/qlinear_onednn.py", "x86/linear_bf16.py"):
        found.update({k.name: k for k in load_kernel_file(ROOT / "kernels" / f)})
    found.update({k.name: k for k in load_kernel_file(ROOT / "kernels/cpu/linear_epilogue.py")})
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
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ks = _kernels()
    if "qlinear_q_vnni" not in ks:
        raise SystemExit("qlinear_q_vnni is not declared on this host (see the warning above)")
    lines = [
        f"torch {torch.__version__}, {args.threads} thread(s), rounds {args.rounds} x {args.repeats}",
        f"{'M':>5} {'K':>5} {'N':>5} {'post':>10} {'out':>4} {'oneDNN us':>10} {'vnni us':>9} "
        f"{'ratio':>6} {'GOP/s':>6} {'_int_mm us':>10} {'codes':>5}",
    ]
    print(*lines, sep="\n", flush=True)
    g = torch.Generator().manual_seed(0)
    for m, k, n, post, algo in SHAPES:
        cases, codes = _cases(ks, g, m, k, n, post, algo)
        times: dict[str, list[float]] = {c: [] for c in cases}
        for f in cases.values():  # warm up
            _time(f, 3)
        for r in range(args.rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for c in order:
                times[c] += _time(cases[c], args.repeats)
        med = {c: statistics.median(t) for c, t in times.items()}
        name = f"{post}/{algo}" if algo else post
        for out, suffix, code in (("u8", "", str(codes)), ("f32", "_f32", "")):
            mine, peer = med["vnni" + suffix], med["onednn" + suffix]
            line = (
                f"{m:>5} {k:>5} {n:>5} {name:>10} {out:>4} {peer:>10.1f} {mine:>9.1f} "
                f"{mine / peer:>6.2f} {2 * m * n * k / mine / 1e3:>6.0f} {med['int_mm']:>10.1f} "
                f"{code:>5}"
            )
            print(line, flush=True)
            lines.append(line)
    if "linear_bf16" in ks:
        lines += ["", *_bf16(ks, g, args)]
    lines += ["", *_layer_norm(ks, g, args)]
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    text = [
        "# benchmarks/x86_qlinear.py",
        "",
        f"- date: {when}; CPU: {cpu_model()}; nproc {os.cpu_count()}; load at end {load}",
        provenance(),
        "",
        "Per shape, medians of the timed calls (interleaved rounds); `out`: uint8 (`qlinear_q`) or "
        "float32 (`qlinear`) output; ratio = VNNI kernel / oneDNN (< 1: faster); GOP/s of the VNNI "
        "kernel (2 M N K per call); `_int_mm`: the GEMM alone (s8 x s8 -> s32, no epilogue); codes: "
        "largest difference between the two kernels' uint8 outputs. Second table: the BF16 "
        "kernels (`linear_bf16`, `linear_gelu_bf16`) against oneDNN's BF16 matmul "
        "(`linear_onednn`, `linear_gelu_onednn`), GFLOP/s of the BF16 kernel, `F.linear` in "
        "bf16 (GEMM and bias, no activation), and the largest difference between the two "
        "kernels' outputs. Third table: `qlinear_add_layer_norm_q_vnni` (`fused`) against "
        "`qlinear_vnni` + Inductor's add + LayerNorm + quantize kernel (`unfused`), ratio "
        "fused / unfused, the GEMM alone (`qlinear_vnni`), what the fused epilogue adds to it, "
        "and the largest code difference.",
        "",
        "```",
        *lines,
        "```",
        "",
    ]
    args.out.write_text("\n".join(text))
    print(f"wrote {args.out}")


BF16_SHAPES = [(m, k, n, post, algo) for m, k, n, post, algo in SHAPES if post in ("none", "gelu")]


def _interleaved(cases: dict[str, Callable[[], Any]], args: argparse.Namespace) -> dict[str, float]:
    times: dict[str, list[float]] = {c: [] for c in cases}
    for f in cases.values():  # warm up
        _time(f, 3)
    for r in range(args.rounds):
        for c in list(cases) if r % 2 == 0 else list(reversed(cases)):
            times[c] += _time(cases[c], args.repeats)
    return {c: statistics.median(t) for c, t in times.items()}


def _bf16(ks: dict[str, Any], g: torch.Generator, args: argparse.Namespace) -> list[str]:
    """The BF16 kernels against oneDNN's, bf16 in and out; GFLOP/s of the fused kernel."""
    lines = [
        f"{'M':>5} {'K':>5} {'N':>5} {'post':>10} {'oneDNN us':>10} {'bf16 us':>9} {'ratio':>6} "
        f"{'GFLOP/s':>7} {'F.linear us':>11} {'max diff':>8}"
    ]
    print(*lines, sep="\n", flush=True)
    for m, k, n, post, algo in BF16_SHAPES:
        x = torch.randn(m, k, generator=g).bfloat16()
        w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
        b = torch.randn(n, generator=g).bfloat16()
        gelu = post == "gelu"
        attrs = {"approximate": algo} if gelu else {}
        mine = ks["linear_gelu_bf16" if gelu else "linear_bf16"]
        peer = ks["linear_gelu_onednn" if gelu else "linear_onednn"]
        pm, po = mine.prepack(w, attrs), peer.prepack(w, attrs)
        extra = (algo,) if gelu else ()
        cases: dict[str, Callable[[], Any]] = {
            "onednn": lambda peer=peer, po=po, x=x, b=b, extra=extra: peer.fn(x, po, b, *extra),
            "bf16": lambda mine=mine, pm=pm, x=x, b=b, extra=extra: mine.fn(x, pm, b, *extra),
            "linear": lambda x=x, w=w, b=b: torch.nn.functional.linear(x, w, b),
        }
        diff = (cases["onednn"]().float() - cases["bf16"]().float()).abs().max().item()
        med = _interleaved(cases, args)
        name = f"{post}/{algo}" if algo else post
        line = (
            f"{m:>5} {k:>5} {n:>5} {name:>10} {med['onednn']:>10.1f} {med['bf16']:>9.1f} "
            f"{med['bf16'] / med['onednn']:>6.2f} {2 * m * n * k / med['bf16'] / 1e3:>7.0f} "
            f"{med['linear']:>11.1f} {diff:>8.3g}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


LN_SHAPES = [(512, 256, 256), (512, 1024, 256), (128, 768, 768), (128, 3072, 768)]


def _layer_norm(ks: dict[str, Any], g: torch.Generator, args: argparse.Namespace) -> list[str]:
    """qlinear_add_layer_norm_q_vnni against qlinear_vnni + Inductor's add/LayerNorm/quantize."""
    lines = [
        f"{'M':>5} {'K':>5} {'N':>5} {'unfused us':>10} {'fused us':>9} {'ratio':>6} "
        f"{'GEMM us':>8} {'epilogue us':>11} {'codes':>5}"
    ]
    print(lines[0], flush=True)
    for m, k, n in LN_SHAPES:
        cases, codes = _ln_cases(ks, g, m, k, n)
        med = _interleaved(cases, args)
        line = (
            f"{m:>5} {k:>5} {n:>5} {med['unfused']:>10.1f} {med['fused']:>9.1f} "
            f"{med['fused'] / med['unfused']:>6.2f} {med['gemm']:>8.1f} "
            f"{med['fused'] - med['gemm']:>11.1f} {codes:>5}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def _ln_cases(
    ks: dict[str, Any], g: torch.Generator, m: int, k: int, n: int
) -> tuple[dict[str, Callable[[], Any]], int]:
    import torchao.quantization.pt2e  # noqa: F401  (registers quantized_decomposed)

    qd = torch.ops.quantized_decomposed
    fused, gemm = ks["qlinear_add_layer_norm_q_vnni"], ks["qlinear_vnni"]

    def tail(y: torch.Tensor, res: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> Any:
        out = torch.nn.functional.layer_norm(y + res, (n,), gamma, beta, 1e-12)
        return out, qd.quantize_per_tensor(out, 8 / 255, 128, 0, 255, torch.uint8)

    x = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws, wz = torch.rand(n, generator=g) * 0.01 + 1e-3, torch.zeros(n, dtype=torch.int64)
    b, res = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    gamma, beta = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g) * 0.1
    pg = gemm.prepack(w, dict(x_scale=0.02, x_zp=128, post_op="none", algorithm=""))
    attrs = dict(x_scale=0.02, x_zp=128, normalized_shape=[n], eps=1e-12, out_scale=8 / 255)
    pf = fused.prepack(w, {**attrs, "out_zp": 128, "out_qmin": 0, "out_qmax": 255})
    compiled = torch.compile(tail, dynamic=False)
    gemm_args = (x, 0.02, 128, pg, ws, wz, b, "none", "")
    fused_args = (x, 0.02, 128, pf, ws, wz, b, res, [n], gamma, beta, 1e-12, 8 / 255, 128, 0, 255)
    cases: dict[str, Callable[[], Any]] = {
        "unfused": lambda: compiled(gemm.fn(*gemm_args), res, gamma, beta),
        "fused": lambda: fused.fn(*fused_args),
        "gemm": lambda: gemm.fn(*gemm_args),
    }
    codes = int((cases["unfused"]()[1].int() - cases["fused"]()[1].int()).abs().max().item())
    return cases, codes


def _cases(
    ks: dict[str, Any], g: torch.Generator, m: int, k: int, n: int, post: str, algo: str
) -> tuple[dict[str, Callable[[], Any]], int]:
    """The calls to time for one shape, and the largest code difference between the kernels."""
    mine, onednn = ks["qlinear_q_vnni"], ks["qlinear_q_onednn"]
    mine_f32, onednn_f32 = ks["qlinear_vnni"], ks["qlinear_onednn"]
    x = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    wz = torch.zeros(n, dtype=torch.int64)
    b = torch.randn(n, generator=g)
    attrs: dict[str, Any] = dict(x_scale=0.02, x_zp=128, out_scale=0.05, out_zp=3, out_qmin=0)
    attrs.update(out_qmax=255, post_op=post, algorithm=algo)
    pm, po = mine.prepack(w, attrs), onednn.prepack(w, attrs)
    pmf, pof = mine_f32.prepack(w, attrs), onednn_f32.prepack(w, attrs)
    tail = (ws, wz, b, 0.05, 3, 0, 255, post, algo)
    xs, wt = (x ^ 0x80).view(torch.int8), w.t()
    cases: dict[str, Callable[[], Any]] = {
        "onednn": lambda: onednn.fn(x, 0.02, 128, po, *tail),
        "vnni": lambda: mine.fn(x, 0.02, 128, pm, *tail),
        "onednn_f32": lambda: onednn_f32.fn(x, 0.02, 128, pof, ws, wz, b, post, algo),
        "vnni_f32": lambda: mine_f32.fn(x, 0.02, 128, pmf, ws, wz, b, post, algo),
        "int_mm": lambda: torch._int_mm(xs, wt),
    }
    codes = int((cases["onednn"]().int() - cases["vnni"]().int()).abs().max().item())
    return cases, codes


if __name__ == "__main__":
    main()
