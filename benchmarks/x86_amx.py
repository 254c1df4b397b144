"""The AMX int8 GEMM engine (``kernels/x86/qgemm_amx_gemm.h``) against oneDNN's qlinear, at
bert-mini's and BERT-base's shapes, on 1 and 2 threads, plain and with the GELU epilogue;
optionally against other builds of the same library (earlier sources, build-time knobs) in
the same process, so that host noise falls on all of them.

    python benchmarks/x86_amx.py --threads 1,2
    python benchmarks/x86_amx.py --threads 1 --variant old=/tmp/old_x86 \\
        --variant nopipe=:-DPDLKIT_AMX_PIPE=0 --out /tmp/x86_amx_run.md

Engines per shape, timed in interleaved rounds (each round ``--repeats`` calls of each, the
order reversed every other round; medians over all calls): ``onednn``, oneDNN's
``qlinear_pointwise`` with a pre-packed weight and the requantized uint8 output
(``kernels/x86/qlinear_onednn.py``, what PyTorch's int8 path runs); ``amx``, pdlkit's
``qlinear_q_amx`` kernel function (the installed library; what a compiled graph calls); and each
``--variant NAME=[DIR][:DEFINES]``: ``DIR/qgemm_vnni.c`` (default: the installed kernels' folder)
built with ``-D`` flags ``DEFINES`` (comma-separated), its ``qlinear_q_amx`` called through the
C ABI as the installed one is (its own pre-pack of the same weight). Ratios are to ``onednn`` (< 1: faster); ``codes``: the largest difference
between an engine's uint8 output and oneDNN's; a variant whose codes differ from ``amx``'s is
flagged. The limit line: oneDNN's qlinear on a 2048^3 GEMM, TOP/s per core.

The AMX kernels run on tiles only where the host has AMX-INT8 and Linux grants the tile state
(``tiles`` column); elsewhere this measures their VNNI path.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from machine import host_header
from pdlkit.runtime_abi.registry import load_kernel_file

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "x86_amx_engine.md"
SHAPES: list[tuple[int, int, int, str]] = [
    (512, 256, 256, "none"),  # bert-mini 8 x 64: Q, K, V, attention output
    (512, 1024, 256, "none"),  # FFN down
    (512, 256, 1024, "none"),  # FFN up, without and with its GELU
    (512, 256, 1024, "gelu"),
    (128, 768, 768, "none"),  # BERT-base 1 x 128
    (128, 768, 3072, "none"),
    (128, 768, 3072, "gelu"),
    (128, 3072, 768, "none"),
    (1024, 768, 768, "none"),  # BERT-base 8 x 128
    (1024, 768, 3072, "none"),
    (1024, 768, 3072, "gelu"),
    (1024, 3072, 768, "none"),
]


def _kernels() -> dict[str, Any]:
    found = {}
    for f in ("x86/qlinear_vnni.py", "x86/qlinear_onednn.py"):
        found.update({k.name: k for k in load_kernel_file(ROOT / "kernels" / f)})
    return found


def _variant(spec: str) -> tuple[str, Any]:
    """``NAME=[DIR][:DEFINES]`` built as qlinear_vnni.py builds its library: its
    ``qlinear_q_amx`` kernel (a C ABI library: sources of 2026-11-24 14:00 or later)."""
    from pdlkit.kernels.x86 import qlinear_vnni as v
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    name, _, rest = spec.partition("=")
    folder, _, defines = rest.partition(":")
    source = Path(folder) / "qgemm_vnni.c" if folder else v.SOURCE
    flags = tuple(d for d in defines.split(",") if d)
    lib = build_library(source, "x86_64", extra=("-fopenmp", *flags))
    return name, {k.name: k for k in load_native_library(lib)}["qlinear_q_amx"]


def _time(fn: Callable[[], Any], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return out


def _interleaved(
    cases: dict[str, Callable[[], Any]], rounds: int, repeats: int
) -> dict[str, float]:
    times: dict[str, list[float]] = {c: [] for c in cases}
    for f in cases.values():  # warm up
        _time(f, 3)
    for r in range(rounds):
        for c in list(cases) if r % 2 == 0 else list(reversed(cases)):
            times[c] += _time(cases[c], repeats)
    return {c: statistics.median(t) for c, t in times.items()}


def _cases(
    ks: dict[str, Any], variants: list[tuple[str, Any]], m: int, k: int, n: int, post: str
) -> tuple[dict[str, Callable[[], Any]], Any]:
    """The calls to time for one shape and the AMX kernel's pre-pack."""
    g = torch.Generator().manual_seed(m * 7 + k * 3 + n)
    x = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.rand(n, generator=g) * 0.01 + 1e-3
    wz = torch.zeros(n, dtype=torch.int64)
    b = torch.randn(n, generator=g)
    attrs: dict[str, Any] = dict(x_scale=0.02, x_zp=128, out_scale=0.05, out_zp=3, out_qmin=0)
    attrs.update(out_qmax=255, post_op=post, algorithm="none" if post == "gelu" else "")
    tail = (ws, wz, b, 0.05, 3, 0, 255, post, attrs["algorithm"])
    onednn, amx = ks["qlinear_q_onednn"], ks["qlinear_q_amx"]
    po, pa = onednn.prepack(w, attrs), amx.prepack(w, attrs)
    cases: dict[str, Callable[[], Any]] = {
        "onednn": lambda: onednn.fn(x, 0.02, 128, po, *tail),
        "amx": lambda: amx.fn(x, 0.02, 128, pa, *tail),
    }
    for name, decl in variants:
        cases[name] = _call(decl, decl.prepack(w, attrs), x, tail)
    return cases, pa


def _call(decl: Any, packed: Any, x: torch.Tensor, tail: tuple[Any, ...]) -> Any:
    return lambda: decl.fn(x, 0.02, 128, packed, *tail)


def _limit(ks: dict[str, Any], threads: int) -> str:
    onednn = ks["qlinear_onednn"]
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (2048, 2048), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (2048, 2048), generator=g, dtype=torch.int8)
    ws, wz = torch.full((2048,), 1e-3), torch.zeros(2048, dtype=torch.int64)
    po = onednn.prepack(w, {})
    call = {"limit": lambda: onednn.fn(x, 0.02, 128, po, ws, wz, None, "none", "")}
    t = _interleaved(call, 3, 5)["limit"]
    per_core = 2 * 2048**3 / t / 1e6 / threads
    return f"limit: oneDNN qlinear 2048^3 {t:.0f} us = {per_core:.2f} TOP/s per core"


def _table(
    ks: dict[str, Any], variants: list[tuple[str, Any]], args: Any, threads: int
) -> list[str]:
    from pdlkit.kernels.x86 import qlinear_vnni

    torch.set_num_threads(threads)
    names = ["amx", *(v[0] for v in variants)]
    head = f"{'M':>5} {'K':>5} {'N':>5} {'post':>5} {'oneDNN us':>9}"
    head += "".join(f" {c + ' us':>10} {'ratio':>5}" for c in names)
    lines = [
        f"threads {threads}; {_limit(ks, threads)}",
        head + f" {'TOP/s/c':>7} {'tiles':>5} codes",
    ]
    print(*lines, sep="\n", flush=True)
    for m, k, n, post in SHAPES:
        cases, pa = _cases(ks, variants, m, k, n, post)
        outs = {c: f().int() for c, f in cases.items()}
        codes = [int((outs[c] - outs["onednn"]).abs().max()) for c in names]
        odd = [c for c in names if not torch.equal(outs[c], outs["amx"])]
        med = _interleaved(cases, args.rounds, args.repeats)
        line = f"{m:>5} {k:>5} {n:>5} {post:>5} {med['onednn']:>9.1f}"
        line += "".join(f" {med[c]:>10.1f} {med[c] / med['onednn']:>5.2f}" for c in names)
        best = min(med[c] for c in names)
        tiles = "yes" if qlinear_vnni.uses_amx(pa, m) else "no"
        top = 2 * m * n * k / best / 1e6 / threads
        line += f" {top:>7.2f} {tiles:>5} {'/'.join(map(str, codes))}"
        line += f"  (differs from amx: {', '.join(odd)})" if odd else ""
        print(line, flush=True)
        lines.append(line)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--variant", action="append", default=[], help="NAME=[DIR][:DEFINES]")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    ks = _kernels()
    if "qlinear_q_amx" not in ks:
        raise SystemExit("qlinear_q_amx is not declared on this host (needs AVX-512 VNNI)")
    variants = [_variant(s) for s in args.variant]
    text = ["# benchmarks/x86_amx.py", "", *host_header(None), ""]
    text += [f"- variant {s}" for s in args.variant]
    text += ["", "```"]
    for threads in (int(t) for t in args.threads.split(",")):
        text += [*_table(ks, variants, args, threads), ""]
    args.out.write_text("\n".join([*text, "```", ""]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
