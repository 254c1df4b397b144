"""qlinear_q and qlinear on x86: the fused VNNI and AMX GEMM kernels against oneDNN's, per
shape; and the BF16 linear kernels (``linear_bf16.py``) against oneDNN's BF16 matmul.

    python benchmarks/x86_qlinear.py                 # one thread, the shapes below
    python benchmarks/x86_qlinear.py --rounds 9 --repeats 20 --threads 1
    python benchmarks/x86_qlinear.py --threads 2 --no-bf16 --out /tmp/x.md

The AMX kernels (the ``*_amx`` kernels of ``qlinear_vnni.py``) run on AMX tiles where the host has them (the ``tiles``
column says whether the call did), else their VNNI path. First line of the results: the limit,
a 2048^3 int8 GEMM through oneDNN's qlinear (no epilogue), in TOP/s per core.

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
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from machine import host_header
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
    (1024, 768, 768, "none", ""),  # BERT-base 8 x 128
    (1024, 768, 3072, "gelu", "none"),
    (1024, 3072, 768, "none", ""),
]


def _kernels() -> dict[str, Any]:
    found = {}
    files = (
        "x86/qlinear_vnni.py",
        "x86/qlinear_onednn.py",
        "x86/linear_bf16.py",
    )
    for f in files:
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
    ap.add_argument("--no-bf16", action="store_true", help="skip the BF16 table")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(*host_header(args.threads), sep="\n", flush=True)
    ks = _kernels()
    if "qlinear_q_vnni" not in ks:
        raise SystemExit("qlinear_q_vnni is not declared on this host (see the warning above)")
    lines = [
        f"torch {torch.__version__}, {args.threads} thread(s), rounds {args.rounds} x {args.repeats}",
        _limit(args),
        f"{'M':>5} {'K':>5} {'N':>5} {'post':>10} {'x':>2} {'out':>4} {'oneDNN us':>10} "
        f"{'vnni us':>8} {'ratio':>6} {'amx us':>8} {'ratio':>6} {'tiles':>5} {'GOP/s':>6} "
        f"{'TOP/s/c':>7} {'_int_mm us':>10} {'codes':>5}",
    ]
    print(*lines, sep="\n", flush=True)
    g = torch.Generator().manual_seed(0)
    for m, k, n, post, algo in SHAPES:
        for xs8 in (False, True) if (m, k, n) in S8_SHAPES else (False,):
            lines += _qlinear_rows(ks, g, args, m, k, n, post, algo, xs8)
    if "linear_bf16" in ks and not args.no_bf16:
        lines += ["", *_bf16(ks, g, args)]
    lines += ["", *_layer_norm(ks, g, args)]
    text = [
        "# benchmarks/x86_qlinear.py",
        "",
        *host_header(args.threads),
        "",
        "Per shape, medians of the timed calls (interleaved rounds); `x`: u8 or s8 activations "
        "(s8: oneDNN's row gets the same values as u8 with the zero point moved by 128); `out`: "
        "uint8 (`qlinear_q`) or float32 (`qlinear`) output; ratio = kernel / oneDNN (< 1: faster) "
        "for the VNNI kernel and the AMX kernel (`tiles`: whether its calls ran on AMX tiles); "
        "GOP/s and TOP/s per core of the faster of the two (2 M N K per call); `_int_mm`: the GEMM "
        "alone (s8 x s8 -> s32, no epilogue); codes: largest difference between the AMX kernel's "
        "and oneDNN's uint8 outputs. The limit line: oneDNN's qlinear on a 2048^3 int8 GEMM "
        "(no epilogue), the per-core TOP/s the issue's 'within 15%' refers to. Second table: the BF16 "
        "kernels (`linear_bf16`, `linear_gelu_bf16`) against oneDNN's BF16 matmul "
        "(`linear_onednn`, `linear_gelu_onednn`), GFLOP/s of the BF16 kernel, `F.linear` in "
        "bf16 (GEMM and bias, no activation), and the largest difference between the two "
        "kernels' outputs, then the AMX BF16 kernel (`linear_bf16_amx` of `linear_bf16.py`: time, ratio to oneDNN, "
        "whether it ran on tiles, GFLOP/s). Third table: `qlinear_add_layer_norm_q_vnni` (`fused`) against "
        "`qlinear_vnni` + Inductor's add + LayerNorm + quantize kernel (`unfused`), ratio "
        "fused / unfused, the GEMM alone (`qlinear_vnni`), what the fused epilogue adds to it, "
        "the largest code difference, and `qlinear_add_layer_norm_q_amx` (`amx`) with its ratio "
        "to `unfused`.",
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
    """The BF16 kernels (AVX512_BF16 and AMX) against oneDNN's, bf16 in and out; GFLOP/s."""
    from pdlkit.kernels.x86 import linear_bf16

    lines = [
        f"{'M':>5} {'K':>5} {'N':>5} {'post':>10} {'oneDNN us':>10} {'bf16 us':>9} {'ratio':>6} "
        f"{'GFLOP/s':>7} {'F.linear us':>11} {'max diff':>8} {'amx us':>8} {'ratio':>6} "
        f"{'tiles':>5} {'GFLOP/s':>7}"
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
        amx = ks[mine.name + "_amx"]
        pa = amx.prepack(w, attrs)
        extra = (algo,) if gelu else ()
        cases: dict[str, Callable[[], Any]] = {
            "onednn": partial(peer.fn, x, po, b, *extra),
            "bf16": partial(mine.fn, x, pm, b, *extra),
            "amx": partial(amx.fn, x, pa, b, *extra),
            "linear": partial(torch.nn.functional.linear, x, w, b),
        }
        diff = (cases["onednn"]().float() - cases["bf16"]().float()).abs().max().item()
        med = _interleaved(cases, args)
        name = f"{post}/{algo}" if algo else post
        line = (
            f"{m:>5} {k:>5} {n:>5} {name:>10} {med['onednn']:>10.1f} {med['bf16']:>9.1f} "
            f"{med['bf16'] / med['onednn']:>6.2f} {2 * m * n * k / med['bf16'] / 1e3:>7.0f} "
            f"{med['linear']:>11.1f} {diff:>8.3g} {med['amx']:>8.1f} "
            f"{med['amx'] / med['onednn']:>6.2f} {'yes' if linear_bf16.uses_amx(pa, m) else 'no':>5} "
            f"{2 * m * n * k / med['amx'] / 1e3:>7.0f}"
        )
        print(line, flush=True)
        lines.append(line)
    return lines


LN_SHAPES = [(512, 256, 256), (512, 1024, 256), (128, 768, 768), (128, 3072, 768)]


def _layer_norm(ks: dict[str, Any], g: torch.Generator, args: argparse.Namespace) -> list[str]:
    """qlinear_add_layer_norm_q_vnni against qlinear_vnni + Inductor's add/LayerNorm/quantize."""
    lines = [
        f"{'M':>5} {'K':>5} {'N':>5} {'unfused us':>10} {'fused us':>9} {'ratio':>6} "
        f"{'GEMM us':>8} {'epilogue us':>11} {'codes':>5} {'amx us':>8} {'ratio':>6}"
    ]
    print(lines[0], flush=True)
    for m, k, n in LN_SHAPES:
        cases, codes = _ln_cases(ks, g, m, k, n)
        med = _interleaved(cases, args)
        line = (
            f"{m:>5} {k:>5} {n:>5} {med['unfused']:>10.1f} {med['fused']:>9.1f} "
            f"{med['fused'] / med['unfused']:>6.2f} {med['gemm']:>8.1f} "
            f"{med['fused'] - med['gemm']:>11.1f} {codes:>5} {med['amx']:>8.1f} "
            f"{med['amx'] / med['unfused']:>6.2f}"
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
    amx = ks["qlinear_add_layer_norm_q_amx"]
    pa = amx.prepack(w, {**attrs, "out_zp": 128, "out_qmin": 0, "out_qmax": 255})
    compiled = torch.compile(tail, dynamic=False)
    gemm_args = (x, 0.02, 128, pg, ws, wz, b, "none", "")
    fused_args = (x, 0.02, 128, pf, ws, wz, b, res, [n], gamma, beta, 1e-12, 8 / 255, 128, 0, 255)
    cases: dict[str, Callable[[], Any]] = {
        "unfused": lambda: compiled(gemm.fn(*gemm_args), res, gamma, beta),
        "fused": lambda: fused.fn(*fused_args),
        "amx": lambda: amx.fn(x, 0.02, 128, pa, *fused_args[4:]),
        "gemm": lambda: gemm.fn(*gemm_args),
    }
    codes = int((cases["unfused"]()[1].int() - cases["fused"]()[1].int()).abs().max().item())
    return cases, codes


# shapes also timed with s8 activations (symmetric quantizers): the VNNI kernel's u8 view,
# AMX's TDPBSSD
S8_SHAPES = {(512, 256, 256), (128, 768, 768)}


def _limit(args: argparse.Namespace) -> str:
    """oneDNN's qlinear on a 2048^3 GEMM (u8 x s8, float32 out, no post op): TOP/s per core."""
    onednn = _kernels()["qlinear_onednn"]
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (2048, 2048), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (2048, 2048), generator=g, dtype=torch.int8)
    ws, wz = torch.full((2048,), 1e-3), torch.zeros(2048, dtype=torch.int64)
    po = onednn.prepack(w, {})
    t = _interleaved(
        {"limit": lambda: onednn.fn(x, 0.02, 128, po, ws, wz, None, "none", "")},
        argparse.Namespace(rounds=3, repeats=5),
    )["limit"]
    per_core = 2 * 2048**3 / t / 1e6 / args.threads
    return f"limit: oneDNN qlinear 2048^3 {t:.0f} us = {per_core:.2f} TOP/s per core ({args.threads} thread(s))"


def _qlinear_rows(
    ks: dict[str, Any], g: torch.Generator, args: argparse.Namespace, m: int, k: int, n: int,
    post: str, algo: str, xs8: bool,
) -> list[str]:  # fmt: skip
    """The two rows (uint8 and float32 output) of one shape."""
    from pdlkit.kernels.x86 import qlinear_vnni

    cases, codes, packed = _cases(ks, g, m, k, n, post, algo, xs8)
    med = _interleaved(cases, args)
    name = f"{post}/{algo}" if algo else post
    tiles = "yes" if qlinear_vnni.uses_amx(packed, m, torch.int8 if xs8 else torch.uint8) else "no"
    out_lines = []
    for out, suffix, code in (("u8", "", str(codes)), ("f32", "_f32", "")):
        vnni, amx, peer = med["vnni" + suffix], med["amx" + suffix], med["onednn" + suffix]
        best = min(vnni, amx)
        line = (
            f"{m:>5} {k:>5} {n:>5} {name:>10} {'s8' if xs8 else 'u8':>2} {out:>4} {peer:>10.1f} "
            f"{vnni:>8.1f} {vnni / peer:>6.2f} {amx:>8.1f} {amx / peer:>6.2f} {tiles:>5} "
            f"{2 * m * n * k / best / 1e3:>6.0f} {2 * m * n * k / best / 1e6 / args.threads:>7.2f} "
            f"{med['int_mm']:>10.1f} {code:>5}"
        )
        print(line, flush=True)
        out_lines.append(line)
    return out_lines


def _cases(
    ks: dict[str, Any], g: torch.Generator, m: int, k: int, n: int, post: str, algo: str,
    xs8: bool = False,
) -> tuple[dict[str, Callable[[], Any]], int, Any]:  # fmt: skip
    """The calls to time for one shape, the largest code difference between the AMX kernel
    and oneDNN, and the AMX kernel's pre-pack. With ``xs8`` the VNNI / AMX kernels get int8
    activations (zero point 0) and oneDNN the same values as uint8 (zero point 128)."""
    onednn, onednn_f32 = ks["qlinear_q_onednn"], ks["qlinear_onednn"]
    x = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    wz = torch.zeros(n, dtype=torch.int64)
    b = torch.randn(n, generator=g)
    xm, zpm = ((x ^ 0x80).view(torch.int8), 0) if xs8 else (x, 128)  # the same values
    attrs: dict[str, Any] = dict(x_scale=0.02, x_zp=128, out_scale=0.05, out_zp=3, out_qmin=0)
    attrs.update(out_qmax=255, post_op=post, algorithm=algo)
    po, pof = onednn.prepack(w, attrs), onednn_f32.prepack(w, attrs)
    tail = (ws, wz, b, 0.05, 3, 0, 255, post, algo)
    xs, wt = (x ^ 0x80).view(torch.int8), w.t()
    cases: dict[str, Callable[[], Any]] = {
        "onednn": lambda: onednn.fn(x, 0.02, 128, po, *tail),
        "onednn_f32": lambda: onednn_f32.fn(x, 0.02, 128, pof, ws, wz, b, post, algo),
        "int_mm": lambda: torch._int_mm(xs, wt),
    }
    mine_attrs = {**attrs, "x_zp": zpm}
    packed = None
    for engine in ("vnni", "amx"):
        q, f = ks[f"qlinear_q_{engine}"], ks[f"qlinear_{engine}"]
        pq, pf = q.prepack(w, mine_attrs), f.prepack(w, mine_attrs)
        cases[engine] = partial(q.fn, xm, 0.02, zpm, pq, *tail)
        cases[engine + "_f32"] = partial(f.fn, xm, 0.02, zpm, pf, ws, wz, b, post, algo)
        packed = pq
    codes = int((cases["onednn"]().int() - cases["amx"]().int()).abs().max().item())
    return cases, codes, packed


if __name__ == "__main__":
    main()
