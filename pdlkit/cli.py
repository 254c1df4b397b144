"""``pdlkit`` command line: demo, check, explain, kernels.

pdlkit demo                                   # compile a small model with the shipped patterns
pdlkit check patterns/ kernels/ my.yaml       # validate without running a model
pdlkit explain examples/mlp.py:example        # what would be substituted, and why not
pdlkit explain mypkg.models:bert --target yitian
pdlkit explain examples/mlp.py:example --html report.html   # the same, as a picture
pdlkit kernels                                # the kernels pdlkit can choose from
pdlkit gen-pattern mymod:linear_relu --example-shapes 4x8,6x8,6 --op linear_relu -o lr.pdl.mlir
pdlkit lint patterns/ kernels/                # overlapping, shadowed or dangling patterns
pdlkit build-kernels --arch aarch64           # build the AArch64 kernel library (cross on x86)
pdlkit explain mypkg.models:bert --why qlinear_gelu   # why that pattern did not match
pdlkit bisect mypkg.models:factory            # which substitution makes the output diverge
pdlkit pin my/kernels                         # pin its kernel files' sha256 (kernels.yaml)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def _load_example(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """``module:function`` or ``file.py[:function]``; the function returns ``(model, example_inputs)``."""
    target, _, fn_name = spec.partition(":")
    fn_name = fn_name or "example"
    if target.endswith(".py") or Path(target).is_file():
        path = Path(target).resolve()
        if not path.is_file():
            raise SystemExit(f"pdlkit explain: {target}: no such file")
        mspec = importlib.util.spec_from_file_location(path.stem, path)
        assert mspec is not None and mspec.loader is not None
        module = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise SystemExit(
            f"pdlkit explain: {target} has no function {fn_name!r} returning (model, inputs)"
        )
    model, inputs = fn()
    return model, tuple(inputs) if isinstance(inputs, list | tuple) else (inputs,)


def cmd_check(args: argparse.Namespace) -> int:
    from pdlkit.check import check_paths

    problems, summary = check_paths([Path(p) for p in args.paths], kernels=args.kernels)
    for p in problems:
        print(p)
    print(
        summary if not problems else f"{len(problems)} problem(s)",
        file=sys.stderr if problems else sys.stdout,
    )
    return 1 if problems else 0


def cmd_explain(args: argparse.Namespace) -> int:
    import pdlkit

    model, inputs = _load_example(args.model)
    report = pdlkit.explain(
        model,
        *inputs,
        patterns=args.patterns,
        kernels=args.kernels,
        target=args.target,
        why=tuple(args.why or ()),
    )
    print(report)
    if args.html:
        report.to_html(args.html)
        print(f"wrote {args.html}")
    if args.graphs:
        for g in report.graphs:
            print(f"\n--- graph {g.index} after substitution ---\n{g.graph_after}")
    return 0


def cmd_gen_pattern(args: argparse.Namespace) -> int:
    from pdlkit.matcher.gen_pattern import GenPatternError, write_pattern

    try:
        written = write_pattern(
            args.function,
            args.example_shapes,
            op=args.op,
            out=args.output,
            name=args.name,
            benefit=args.benefit,
            dtype=args.dtype,
        )
    except GenPatternError as e:
        print(f"pdlkit gen-pattern: {e}", file=sys.stderr)
        return 1
    if written:
        print("wrote " + ", ".join(map(str, written)))
    return 0


def cmd_lint(args: argparse.Namespace) -> int:
    from pdlkit.matcher.lint import lint_paths

    findings = lint_paths([Path(p) for p in args.paths], kernels=args.kernels)
    for f in findings:
        print(f)
    errors = sum(1 for f in findings if f.severity == "error")
    print(f"{errors} error(s), {len(findings) - errors} warning(s)", file=sys.stderr)
    return 1 if errors else 0


def cmd_bisect(args: argparse.Namespace) -> int:
    import pdlkit

    model, inputs = _load_example(args.model)
    result = pdlkit.bisect(
        model,
        *inputs,
        patterns=args.patterns,
        kernels=args.kernels,
        target=args.target,
        default_codegen=args.codegen,
    )
    print(result)
    return 1 if result.culprits else 0


def cmd_abi_check(args: argparse.Namespace) -> int:
    from pdlkit.runtime_abi.abi_check import check_paths, format_rows
    from pdlkit.runtime_abi.capability import resolve

    rows = check_paths([Path(p) for p in args.paths], resolve(args.target))
    print(format_rows(rows))
    failed = [r for r in rows if r.result == "FAIL"]
    print(f"{len(rows) - len(failed)} passed or skipped, {len(failed)} failed")
    return 1 if failed or not rows else 0


def cmd_kernels(args: argparse.Namespace) -> int:
    from pdlkit import config
    from pdlkit.runtime_abi.registry import KernelRegistry

    reg = KernelRegistry.from_folders(config.kernel_paths(args.kernels))
    for k in reg.kernels.values():
        dts = "; ".join(
            f"{a}: {', '.join(str(d).removeprefix('torch.') for d in v)}"
            for a, v in k.dtypes.items()
        )
        req = ", ".join(sorted(k.requires)) or "-"
        print(
            f"{k.name}  v{k.version}  op={k.op}  device={k.device}  requires={req}  dtypes=[{dts}]  {k.source}"
        )
    return 0


def _demo_model() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, d: int = 256, h: int = 1024):
            super().__init__()
            self.norm = torch.nn.LayerNorm(d)
            self.up = torch.nn.Linear(d, h)
            self.down = torch.nn.Linear(h, d)
            self.gate = torch.nn.Linear(d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
            return x + y + torch.relu(self.gate(x))

    model = torch.nn.Sequential(Block(), Block()).eval()
    return model, torch.randn(8, 64, 256)


def cmd_demo(args: argparse.Namespace) -> int:
    import torch

    import pdlkit
    from pdlkit.backend import PdlkitBackend

    torch.set_num_threads(max(1, args.threads))
    model, x = _demo_model()
    reports: list[Any] = []
    backend = PdlkitBackend(on_report=lambda r, plan: reports.append((r, plan)))
    pdlkit.stats(reset=True)
    print(
        "pdlkit demo: 2 transformer-style MLP blocks (LayerNorm, Linear+GELU, Linear+ReLU), input [8, 64, 256]"
    )
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model, backend=backend)
        t0 = time.perf_counter()
        got = compiled(x)
        compile_s = time.perf_counter() - t0
        inductor = torch.compile(model)  # the peer: the same model under plain Inductor
        inductor(x)
        eager_t: list[float] = []
        comp_t: list[float] = []
        ind_t: list[float] = []
        for _ in range(args.repeat):
            for fn, times in ((model, eager_t), (compiled, comp_t), (inductor, ind_t)):
                t = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - t)
    report, plan = reports[-1]
    print(f"target: {plan.target.describe()}")
    print(
        f"patterns loaded: {', '.join(p.name + ' (' + p.where + ')' for p in plan.patterns.patterns)}"
    )
    fired: dict[str, int] = {}
    for s in report.substitutions:
        fired[f"{s.pattern} -> {s.kernel}"] = fired.get(f"{s.pattern} -> {s.kernel}", 0) + 1
    print("patterns fired:")
    for k, n in fired.items():
        print(f"  {k}: {n}x")
    st = pdlkit.stats()
    print("kernels ran:")
    for name, c in st["by_kernel"].items():
        print(f"  {name}: {c['kernel_calls']} call(s), {c['fallbacks']} fallback(s)")
    err = (got - expected).abs().max().item()
    print(f"max abs error vs eager: {err:.3e}")
    print(
        f"compile (pdlkit pass + Inductor): {compile_s:.1f} s; pass: "
        + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in report.timings.items())
    )
    e, c, i = (statistics.median(t) for t in (eager_t, comp_t, ind_t))
    print(
        f"median latency over {args.repeat} runs, {args.threads} thread(s): eager {e * 1e3:.2f} ms, "
        f"Inductor {i * 1e3:.2f} ms, pdlkit {c * 1e3:.2f} ms ({i / c:.2f}x Inductor)"
    )
    if err > 1e-3 or not report.substitutions:
        print(
            "demo FAILED: " + ("no substitution" if not report.substitutions else "error too large")
        )
        return 1
    return 0


def cmd_build_kernels(args: argparse.Namespace) -> int:
    from pdlkit.config import PathError
    from pdlkit.runtime_abi import native_build as nb
    from pdlkit.runtime_abi.trust import TrustError

    try:
        lib = nb.build_library(nb.A64_GEMM_SOURCE, args.arch, Path(args.out) if args.out else None)
        driver = nb.build_driver(args.arch, lib.parent) if args.driver else None
    except (nb.BuildError, TrustError, PathError) as e:  # a refused cache or source
        print(f"pdlkit build-kernels: {e}", file=sys.stderr)
        return 1
    print(" ".join(nb.library_command(nb.A64_GEMM_SOURCE, lib, args.arch)))
    print(lib)
    if driver is not None:
        print(driver)
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    from pdlkit.runtime_abi.trust import code_files, write_pins

    folder = Path(args.folder).resolve()
    files = code_files(folder) if folder.is_dir() else []  # C sources and headers too
    if not files:
        print(
            f"pdlkit pin: {folder}: no kernel files (*.py, *.so, C sources, headers) in it",
            file=sys.stderr,
        )
        return 1
    print(f"{write_pins(folder, files)}: pinned {len(files)} kernel file(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pdlkit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("demo", help="compile a small model with the shipped patterns and report")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=20)
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("check", help="validate pattern files, manifests and kernel files")
    p.add_argument("paths", nargs="+")
    p.add_argument(
        "--kernels", action="append", help="kernel folders to resolve manifest pins against"
    )
    p.set_defaults(fn=cmd_check)

    p = sub.add_parser("explain", help="show substitutions and near misses for a model")
    p.add_argument("model", help="module:function or file.py[:function] returning (model, inputs)")
    p.add_argument("--target", default=None, help="host (default), a named target such as yitian")
    p.add_argument("--patterns", action="append", default=None)
    p.add_argument("--kernels", action="append", default=None)
    p.add_argument("--graphs", action="store_true", help="print the rewritten graphs")
    p.add_argument("--html", default=None, help="also write the report as one HTML page")
    p.add_argument(
        "--why",
        action="append",
        metavar="PATTERN",
        help="for each candidate root of PATTERN, the closest match and its first failure",
    )
    p.set_defaults(fn=cmd_explain)

    p = sub.add_parser("gen-pattern", help="write the PDL pattern of a Python reference function")
    p.add_argument("function", help="module:function or file.py:function")
    p.add_argument(
        "--example-shapes",
        required=True,
        help="one per parameter: 4x8,6x8,6[:int8]; float, int, str=tanh for scalar parameters",
    )
    p.add_argument("--op", required=True, help="the logical op the pattern's kernel call names")
    p.add_argument("-o", "--output", default=None, help="FILE.pdl.mlir (+ FILE.reference.py)")
    p.add_argument("--name", default=None, help="pattern name (default: the function's)")
    p.add_argument("--benefit", type=int, default=1)
    p.add_argument("--dtype", default="float32", help="dtype of shapes given without one")
    p.set_defaults(fn=cmd_gen_pattern)

    p = sub.add_parser("lint", help="static checks over a pattern set (and its kernels)")
    p.add_argument("paths", nargs="*", help="pattern/kernel files or folders (default: configured)")
    p.add_argument("--kernels", action="append", default=None, help="kernel folders")
    p.set_defaults(fn=cmd_lint)

    p = sub.add_parser(
        "bisect", help="find the substitution that makes a model's output diverge from eager"
    )
    p.add_argument("model", help="module:function or file.py[:function] returning (model, inputs)")
    p.add_argument("--target", default=None)
    p.add_argument("--patterns", action="append", default=None)
    p.add_argument("--kernels", action="append", default=None)
    p.add_argument("--codegen", choices=("eager", "inductor"), default="eager")
    p.set_defaults(fn=cmd_bisect)

    p = sub.add_parser("abi-check", help="check kernels against their declaration and reference")
    p.add_argument("paths", nargs="+", help="kernel files (.py, .so) or folders")
    p.add_argument("--target", default=None, help="plan for a named target instead of this host")
    p.set_defaults(fn=cmd_abi_check)

    p = sub.add_parser("kernels", help="list the kernels found in the kernel folders")
    p.add_argument("--kernels", action="append", default=None)
    p.set_defaults(fn=cmd_kernels)

    p = sub.add_parser(
        "build-kernels", help="build the AArch64 kernel library (natively, or cross on x86)"
    )
    p.add_argument("--arch", default="aarch64", choices=["aarch64"])
    p.add_argument("--out", default=None, help="folder (default: PDLKIT_BUILD_DIR or ~/.cache)")
    p.add_argument("--driver", action="store_true", help="also build the qemu ABI driver")
    p.set_defaults(fn=cmd_build_kernels)

    p = sub.add_parser("pin", help="pin a kernel folder's files by sha256 (writes kernels.yaml)")
    p.add_argument("folder")
    p.set_defaults(fn=cmd_pin)

    args = parser.parse_args(argv)
    from pdlkit.backend import PdlkitError

    try:
        return int(args.fn(args))
    except PdlkitError as e:
        print(e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
