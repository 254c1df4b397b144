"""The AMX GEMM engine (``kernels/x86/qgemm_amx_gemm.h``) against oneDNN, at bert-mini's and
BERT-base's shapes, on 1 and 2 threads, plain and with the GELU epilogue: int8 against
oneDNN's qlinear, BF16 against oneDNN's BF16 matmul; optionally against other builds of the
same libraries (earlier sources, build-time knobs) in the same process, so that host noise
falls on all of them.

    python benchmarks/x86_amx.py --threads 1,2
    python benchmarks/x86_amx.py --threads 1 --variant old=/tmp/old_x86 \\
        --variant nopipe=:-DPDLKIT_AMX_PIPE=0 --out /tmp/x86_amx_run.md
    python benchmarks/x86_amx.py --threads 1 --tables bf16 --variant old=@88b666c \\
        --variant l1=:-DPDLKIT_AMX_L1=49152 --out /tmp/x86_amx_bf16.md

``--tables``: which tables (default ``int8,ln,bf16``). ``DIR`` of a variant may be ``@REV``: the
``kernels/x86`` folder of git revision REV of this checkout (``git archive``; needs the
repository's ``.git``), else a folder holding ``qgemm_vnni.c`` / ``gemm_bf16.c`` and the headers
they include (an earlier ``kernels/x86``). Only the sources the chosen tables need are built.

Engines per shape, timed in interleaved rounds (each round ``--repeats`` calls of each, the
order reversed every other round; medians over all calls): ``onednn``, oneDNN's
``qlinear_pointwise`` with a pre-packed weight and the requantized uint8 output
(``kernels/x86/qlinear_onednn.py``, what PyTorch's int8 path runs); ``amx``, pdlkit's
``qlinear_q_amx`` kernel function (the installed library; what a compiled graph calls); and each
``--variant NAME=[DIR][:DEFINES]``: ``DIR/qgemm_vnni.c`` (default: the installed kernels' folder)
built with ``-D`` flags ``DEFINES`` (comma-separated), its ``qlinear_q_amx`` called through the
C ABI as the installed one is (its own pre-pack of the same weight). Ratios are to ``onednn`` (< 1: faster); ``codes``: the largest difference
between an engine's uint8 output and oneDNN's; a variant whose codes differ from ``amx``'s is
flagged. The limit line: oneDNN's qlinear on a 2048^3 GEMM, TOP/s per core. Second table per
thread count: the output projection with its residual add, LayerNorm and codes fused
(``qlinear_add_layer_norm_q_amx``, ``_vnni`` and the variants') against oneDNN's float32 GEMM
alone (what PyTorch's path runs before its add + LayerNorm + quantize kernel, not counted here).
Third table per thread count (``bf16``): ``linear_bf16_amx`` / ``linear_gelu_bf16_amx`` (bf16 in
and out; the installed ``gemm_bf16.c``) and each variant's build of ``DIR/gemm_bf16.c`` against
oneDNN's BF16 matmul with a pre-packed weight and the GELU post-op (``linear_onednn`` /
``linear_gelu_onednn`` of ``kernels/cpu/linear_epilogue.py``, what PyTorch's BF16 path runs
with freezing); ``vs NAME``: ``amx`` time / the variant's (< 1: the installed build faster);
``diff``: the largest difference between ``amx``'s output and oneDNN's; a variant whose output
is not ``amx``'s bit for bit is flagged (the engine's sums are the same in every build).
``--model``: bert-mini 8 x 64 int8, PyTorch's int8 path against pdlkit with every site on its
declared kernel, one thread, in one process (see ``_model``).

The AMX kernels run on tiles only where the host has AMX-INT8 / AMX-BF16 and Linux grants the
tile state (``tiles`` column); elsewhere this measures their VNNI / AVX512_BF16 path. Needs
torch and pdlkit only (no torchao, no torch-mlir).
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


def _kernels(tables: set[str]) -> dict[str, Any]:
    files = ["x86/qlinear_vnni.py", "x86/qlinear_onednn.py"] if tables & {"int8", "ln"} else []
    files += ["x86/linear_bf16.py", "cpu/linear_epilogue.py"] if "bf16" in tables else []
    found = {}
    for f in files:
        found.update({k.name: k for k in load_kernel_file(ROOT / "kernels" / f)})
    return found


def _revision(rev: str) -> Path:
    """``kernels/x86`` of git revision ``rev`` of this checkout, in a private temporary folder."""
    import subprocess
    import tempfile

    out = Path(tempfile.mkdtemp(prefix=f"x86_amx_{rev}_"))
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "kernels/x86"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return out / "kernels" / "x86"


def _variant(spec: str, tables: set[str]) -> tuple[str, dict[str, Any]]:
    """``NAME=[DIR][:DEFINES]`` built as qlinear_vnni.py / linear_bf16.py build their libraries
    (``DIR/qgemm_vnni.c`` for the int8 tables, ``DIR/gemm_bf16.c`` for the BF16 one): their
    kernels by name (C ABI libraries: sources of 2026-11-24 14:00 or later)."""
    from pdlkit.kernels.x86 import linear_bf16, qlinear_vnni
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    name, _, rest = spec.partition("=")
    folder, _, defines = rest.partition(":")
    where = _revision(folder[1:]) if folder.startswith("@") else Path(folder) if folder else None
    flags = tuple(d for d in defines.split(",") if d)
    sources = [qlinear_vnni.SOURCE] if tables & {"int8", "ln"} else []
    sources += [linear_bf16.SOURCE] if "bf16" in tables else []
    found: dict[str, Any] = {}
    for source in sources:
        lib = build_library(
            where / source.name if where else source, "x86_64", extra=("-fopenmp", *flags)
        )
        found.update({k.name: k for k in load_native_library(lib)})
    return name, found


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
    for name, kernels in variants:
        decl = kernels["qlinear_q_amx"]
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


def _head(variants: list[tuple[str, Any]]) -> tuple[list[str], str]:
    """The engines a GEMM table compares (``amx``, then the variants) and its header's columns
    up to their times and ratios to oneDNN."""
    names = ["amx", *(v[0] for v in variants)]
    head = f"{'M':>5} {'K':>5} {'N':>5} {'post':>5} {'oneDNN us':>9}"
    return names, head + "".join(f" {c + ' us':>10} {'ratio':>5}" for c in names)


def _table(
    ks: dict[str, Any], variants: list[tuple[str, Any]], args: Any, threads: int
) -> list[str]:
    from pdlkit.kernels.x86 import qlinear_vnni

    torch.set_num_threads(threads)
    names, head = _head(variants)
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


LN_SHAPES = [(512, 256, 256), (512, 1024, 256), (128, 768, 768), (128, 3072, 768)]
LN_SHAPES += [(1024, 768, 768), (1024, 3072, 768)]


def _ln_cases(
    ks: dict[str, Any], variants: list[tuple[str, Any]], m: int, k: int, n: int
) -> dict[str, Callable[[], Any]]:
    """The output projection with its residual add, LayerNorm and codes: oneDNN's float32 GEMM
    alone (``onednn``), the same followed by the add, LayerNorm and codes as Inductor compiles
    them (``onednn+ln``: what PyTorch's int8 path runs), pdlkit's fused AMX kernel (``amx``),
    its VNNI one (``vnni``), each variant's ``qlinear_add_layer_norm_q_amx``; the callables
    return the codes (``onednn`` the GEMM's float output)."""
    g = torch.Generator().manual_seed(m + k + n)
    x = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws, wz = torch.rand(n, generator=g) * 0.01 + 1e-3, torch.zeros(n, dtype=torch.int64)
    b, res = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    gamma, beta = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g) * 0.1
    attrs = dict(x_scale=0.02, x_zp=128, normalized_shape=[n], eps=1e-12, out_scale=8 / 255)
    attrs.update(out_zp=128, out_qmin=0, out_qmax=255)
    onednn = ks["qlinear_onednn"]
    po = onednn.prepack(w, dict(x_scale=0.02, x_zp=128, post_op="none", algorithm=""))
    tail = (ws, wz, b, res, [n], gamma, beta, 1e-12, 8 / 255, 128, 0, 255)
    epilogue = _add_ln_codes(n)
    cases: dict[str, Callable[[], Any]] = {
        "onednn": lambda: onednn.fn(x, 0.02, 128, po, ws, wz, b, "none", ""),
        "onednn+ln": lambda: epilogue(
            onednn.fn(x, 0.02, 128, po, ws, wz, b, "none", ""), res, gamma, beta
        ),
    }
    decls = {"amx": ks["qlinear_add_layer_norm_q_amx"], "vnni": ks["qlinear_add_layer_norm_q_vnni"]}
    decls.update({name: kernels["qlinear_add_layer_norm_q_amx"] for name, kernels in variants})
    for name, decl in decls.items():
        cases[name] = _ln_call(decl, decl.prepack(w, attrs), x, tail)
    return cases


def _add_ln_codes(n: int) -> Callable[..., torch.Tensor]:
    """The residual add, LayerNorm and u8 codes after a float GEMM, compiled by Inductor (one
    fused C++ loop, as in PyTorch's int8 graph)."""

    def f(y: torch.Tensor, res: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> Any:
        z = torch.nn.functional.layer_norm(y + res, [n], gamma, beta, 1e-12)
        return torch.clamp(torch.round(z / (8 / 255)) + 128, 0, 255).to(torch.uint8)

    return torch.compile(f, dynamic=False)


def _ln_call(decl: Any, packed: Any, x: torch.Tensor, tail: tuple[Any, ...]) -> Any:
    return lambda: decl.fn(x, 0.02, 128, packed, *tail)[1]


def _ln_table(
    ks: dict[str, Any], variants: list[tuple[str, Any]], args: Any, threads: int
) -> list[str]:
    torch.set_num_threads(threads)
    names = ["amx", "vnni", *(v[0] for v in variants)]
    head = f"{'M':>5} {'K':>5} {'N':>5} {'oneDNN GEMM us':>14} {'+add+LN+codes us':>16}"
    head += f" {'amx / that':>10}"
    lines = [f"threads {threads}", head + "".join(f" {c + ' us':>10} {'ratio':>5}" for c in names)]
    print(*lines, sep="\n", flush=True)
    for m, k, n in LN_SHAPES:
        cases = _ln_cases(ks, variants, m, k, n)
        outs = {c: f() for c, f in cases.items()}
        odd = [c for c in names if not torch.equal(outs[c], outs["amx"])]
        off = int((outs["onednn+ln"].int() - outs["amx"].int()).abs().max())
        med = _interleaved(cases, args.rounds, args.repeats)
        line = f"{m:>5} {k:>5} {n:>5} {med['onednn']:>14.1f} {med['onednn+ln']:>16.1f}"
        line += f" {med['amx'] / med['onednn+ln']:>10.2f}"
        line += "".join(f" {med[c]:>10.1f} {med[c] / med['onednn']:>5.2f}" for c in names)
        line += f"  (codes differ from amx: {', '.join(odd)})" if odd else ""
        line += f"  (onednn+ln codes within {off} of amx's)"
        print(line, flush=True)
        lines.append(line)
    return lines


def _bf16_cases(
    ks: dict[str, Any], variants: list[tuple[str, Any]], m: int, k: int, n: int, post: str
) -> tuple[dict[str, Callable[[], Any]], Any]:
    """The BF16 calls to time for one shape (``onednn``, ``amx``, the variants') and the AMX
    kernel's pre-pack; GELU is erf GELU (BERT's)."""
    g = torch.Generator().manual_seed(m * 7 + k * 3 + n)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    gelu = post == "gelu"
    attrs = {"approximate": "none"} if gelu else {}
    extra = ("none",) if gelu else ()
    onednn = ks["linear_gelu_onednn" if gelu else "linear_onednn"]
    name = "linear_gelu_bf16_amx" if gelu else "linear_bf16_amx"
    decls = {"onednn": onednn, "amx": ks[name]}
    decls.update({v: kernels[name] for v, kernels in variants})
    cases: dict[str, Callable[[], Any]] = {}
    packed = {}
    for c, decl in decls.items():
        packed[c] = decl.prepack(w, attrs)
        cases[c] = partial(decl.fn, x, packed[c], b, *extra)
    return cases, packed["amx"]


def _bf16_table(
    ks: dict[str, Any], variants: list[tuple[str, Any]], args: Any, threads: int
) -> list[str]:
    """linear_bf16_amx / linear_gelu_bf16_amx (and the variants') against oneDNN's BF16 matmul."""
    from pdlkit.kernels.x86 import linear_bf16

    torch.set_num_threads(threads)
    names, head = _head(variants)
    head += "".join(f" {'vs ' + v[0]:>8}" for v in variants)
    lines = [f"BF16, threads {threads}", head + f" {'TFLOP/s/c':>9} {'tiles':>5} diff"]
    print(*lines, sep="\n", flush=True)
    for m, k, n, post in SHAPES:
        cases, pa = _bf16_cases(ks, variants, m, k, n, post)
        outs = {c: f().float() for c, f in cases.items()}
        diff = float((outs["amx"] - outs["onednn"]).abs().max())
        odd = [c for c in names if not torch.equal(outs[c], outs["amx"])]
        med = _interleaved(cases, args.rounds, args.repeats)
        line = f"{m:>5} {k:>5} {n:>5} {post:>5} {med['onednn']:>9.1f}"
        line += "".join(f" {med[c]:>10.1f} {med[c] / med['onednn']:>5.2f}" for c in names)
        line += "".join(f" {med['amx'] / med[v[0]]:>8.2f}" for v in variants)
        tflops = 2 * m * n * k / min(med[c] for c in names) / 1e6 / threads
        tiles = "yes" if linear_bf16.uses_amx(pa, m) else "no"
        line += f" {tflops:>9.2f} {tiles:>5} {diff:.3g}"
        line += f"  (differs from amx: {', '.join(odd)})" if odd else ""
        print(line, flush=True)
        lines.append(line)
    return lines


def _model(args: Any) -> list[str]:
    """bert-mini 8 x 64 int8 (PT2E, X86InductorQuantizer) through PyTorch's int8 path
    (``torch.compile`` with freezing: ``peer``) and ``pdlkit.optimize(autotune="off")`` (every
    site on its declared kernel, the AMX ones on an AMX host: ``pdlkit``), one thread, in
    alternating windows of ``--calls`` calls (order rotated per window): per configuration the
    median and 10th percentile of the per-call times, and the median of per-window ratios to
    ``peer``."""
    import torch._inductor.config as ic
    import x86_models as xm

    torch.set_num_threads(1)
    model, x = xm.prepare(*xm.build("bert-mini"), "int8-static")
    ic.freezing = True
    fns: dict[str, Callable[[], Any]] = {}
    with torch.no_grad():
        for conf, label in (("peer", "peer"), ("pdlkit-off", "pdlkit")):
            torch._dynamo.reset()
            f = xm.maker(conf, model)()
            f(x)
            fns[label] = partial(f, x)
        names, ms = list(fns), {c: list[float]() for c in fns}
        for w in range(args.windows):
            k = w % len(names)
            for c in names[k:] + names[:k]:
                ms[c].append(statistics.median(_time(fns[c], args.calls)) / 1e3)
    lines = [f"bert-mini 8x64 int8-static, 1 thread, {args.windows} windows x {args.calls} calls"]
    lines.append(f"{'config':>8} {'ms':>7} {'p10 ms':>7} {'/ peer':>7}")
    for c in names:
        ratio = statistics.median(a / b for a, b in zip(ms[c], ms["peer"], strict=True))
        p10 = sorted(ms[c])[len(ms[c]) // 10]
        lines.append(f"{c:>8} {statistics.median(ms[c]):>7.2f} {p10:>7.2f} {ratio:>7.3f}")
    print(*lines, sep="\n", flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--variant", action="append", default=[], help="NAME=[DIR][:DEFINES]")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--model", action="store_true", help="also bert-mini int8 (needs transformers)")
    ap.add_argument("--windows", type=int, default=30, help="--model: windows per configuration")
    ap.add_argument("--calls", type=int, default=3, help="--model: calls per window")
    ap.add_argument("--tables", default="int8,ln,bf16", help="comma-separated: int8, ln, bf16")
    args = ap.parse_args()
    tables = {t for t in args.tables.split(",") if t}
    if tables - {"int8", "ln", "bf16"}:
        raise SystemExit(f"--tables: unknown {sorted(tables - {'int8', 'ln', 'bf16'})}")
    ks = _kernels(tables)
    if tables & {"int8", "ln"} and "qlinear_q_amx" not in ks:
        raise SystemExit("qlinear_q_amx is not declared on this host (needs AVX-512 VNNI)")
    if "bf16" in tables and not {"linear_bf16_amx", "linear_onednn"} <= set(ks):
        raise SystemExit("linear_bf16_amx / linear_onednn not declared (needs AVX512_BF16, mkldnn)")
    variants = [_variant(s, tables) for s in args.variant]
    text = ["# benchmarks/x86_amx.py", "", *host_header(None), ""]
    text += [f"- variant {s}" for s in args.variant]
    text += ["", "```"]
    for threads in (int(t) for t in args.threads.split(",") if t):
        if "int8" in tables:
            text += [*_table(ks, variants, args, threads), ""]
        if "ln" in tables:
            text += [*_ln_table(ks, variants, args, threads), ""]
        if "bf16" in tables:
            text += [*_bf16_table(ks, variants, args, threads), ""]
    if args.model:
        text += _model(args)
    args.out.write_text("\n".join([*text, "```", ""]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
