"""The ``pdlkit`` command: every command, its options and an example are in ``pdlkit --help``.

``main(argv)`` runs one command and returns its exit status (0 ok, 1 a problem found or an
error, with one line on stderr saying which). Messages that torchao and torch print when
they are imported (optional extension libraries that did not load, deprecations) are not
shown: they say nothing about the command's result.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pdlkit.errors import ConfigError


def _load_example(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """``module:function`` or ``file.py[:function]``; the function returns ``(model, inputs)``."""
    from pdlkit.targets import TargetError, load_example

    try:
        return load_example(spec)
    except TargetError as e:
        raise SystemExit(f"pdlkit: {e}") from None


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """optimize()'s options from the command line (the ones not given stay None)."""
    return dict(
        patterns=args.patterns,
        kernels=args.kernels,
        target=args.target,
        autotune=args.autotune,
        default_codegen=args.codegen,
        allow_world_writable=True if args.allow_world_writable else None,
    )


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
        model, *inputs, why=tuple(args.why or ()), dynamic=args.dynamic or None, **_options(args)
    )
    print(report.format(verbose=args.verbose))
    if args.html:
        report.to_html(args.html)
        print(f"wrote {args.html}")
    if args.graphs:
        for g in report.graphs:
            print(f"\n--- graph {g.index} after substitution ---\n{g.graph_after}")
    return 0


def cmd_gen_pattern(args: argparse.Namespace) -> int:
    from pdlkit.matcher.gen_pattern import GenPatternError
    from pdlkit.matcher.gen_pattern_io import write_pattern

    try:
        written = write_pattern(
            args.function,
            args.example_shapes,
            op=args.op,
            out=args.output,
            name=args.name,
            benefit=args.benefit,
            dtype=args.dtype,
            commutative=args.commutative,
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
    result = pdlkit.bisect(model, *inputs, **_options(args))
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


def cmd_demo(args: argparse.Namespace) -> int:
    from pdlkit.demo import run

    return run(threads=args.threads, repeat=args.repeat, verbose=args.verbose)


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


# -- the parser: one entry per command, in the order `pdlkit --help` lists them -------------------

_EPILOG = """examples:
  pdlkit demo
  pdlkit explain examples/mlp.py:example --why linear_relu
  pdlkit explain mymodels:example --patterns my/patterns --kernels my/kernels:@shipped
  pdlkit gen-pattern refs.py:linear_relu --example-shapes 4x8,6x8,6 --op linear_relu -o p.pdl.mlir

MODULE:FUNCTION targets are imported with the current directory first on the path; the
function returns (model, example_inputs). FILE.py[:FUNCTION] works too.
Folders: --patterns / --kernels (repeat them, or join folders with ':'; '@shipped' is the
shipped folder), else PDLKIT_PATTERN_PATH / PDLKIT_KERNEL_PATH, else the shipped folders."""

_MODEL_HELP = "MODULE:FUNCTION or FILE.py[:FUNCTION] (default function: example) returning (model, example_inputs)"


def _add_folders(p: argparse.ArgumentParser, patterns: bool = True) -> None:
    if patterns:
        p.add_argument(
            "--patterns",
            action="append",
            metavar="FOLDER",
            help="pattern folder or file; repeat it, or join several with ':'; "
            "@shipped = the shipped folder (default: PDLKIT_PATTERN_PATH, else shipped)",
        )
    p.add_argument(
        "--kernels",
        action="append",
        metavar="FOLDER",
        help="kernel folder or file; repeat it, or join several with ':'; "
        "@shipped = the shipped folder (default: PDLKIT_KERNEL_PATH, else shipped)",
    )


def _add_optimize_options(p: argparse.ArgumentParser, codegen_default: str) -> None:
    """The options of pdlkit.optimize(), shared by explain and bisect."""
    _add_folders(p)
    p.add_argument(
        "--target",
        default=None,
        help="machine to plan for: this host (default), yitian, aarch64, x86-avx512-vnni, cuda-sm90, ...",
    )
    p.add_argument(
        "--autotune",
        choices=("cached", "full", "off"),
        default=None,
        help="choose kernels by measurement: cached decisions (default; PDLKIT_AUTOTUNE), "
        "measure again (full), or by static priority (off)",
    )
    p.add_argument(
        "--codegen",
        choices=("inductor", "eager"),
        default=None,
        help=f"code for what no kernel replaces (default: {codegen_default})",
    )
    p.add_argument(
        "--allow-world-writable",
        action="store_true",
        help="load pattern and kernel folders others can write to (PDLKIT_ALLOW_WORLD_WRITABLE=1)",
    )


def _add_demo_check_explain(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="compile a small model with the shipped patterns; compare with Inductor"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per variant (default 20)")
    p.add_argument("--verbose", action="store_true", help="also list the patterns and pass times")
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser(
        "check",
        help="validate pattern files, manifests and kernel files; file:line:col errors, exit 1",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="pattern / kernel files or folders")
    p.add_argument(
        "--kernels",
        action="append",
        metavar="FOLDER",
        help="kernel folders to resolve manifest pins against (repeatable)",
    )
    p.set_defaults(fn=cmd_check)

    p = sub.add_parser(
        "explain", help="what would be substituted in a model, and why not elsewhere"
    )
    p.add_argument("model", help=_MODEL_HELP)
    _add_optimize_options(p, "inductor")
    p.add_argument(
        "--why",
        action="append",
        metavar="PATTERN",
        help="for each candidate root of PATTERN, the closest match and its first failure (repeatable)",
    )
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="the long report: every pattern and kernel loaded, kernels passed over, pass times",
    )
    p.add_argument("--graphs", action="store_true", help="also print the rewritten graphs")
    p.add_argument(
        "--html", metavar="FILE", default=None, help="also write the report as one HTML page"
    )
    p.add_argument(
        "--dynamic",
        action="store_true",
        help="trace with dynamic shapes, as optimize(..., dynamic=True) compiles: the "
        "whole-graph verdict shown is the one for the example's shape bucket",
    )
    p.set_defaults(fn=cmd_explain)


def _add_authoring(sub: Any) -> None:
    p = sub.add_parser(
        "gen-pattern", help="write the PDL pattern (and reference) of a Python function"
    )
    p.add_argument(
        "function", help="MODULE:FUNCTION or FILE.py:FUNCTION, the reference computation"
    )
    p.add_argument(
        "--example-shapes",
        required=True,
        metavar="SHAPES",
        help="one per parameter: 4x8,6x8,6[:int8]; float, int, str=tanh, bool=true for scalar parameters",
    )
    p.add_argument("--op", required=True, help="the logical op the pattern's kernel call names")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        default=None,
        help="FILE.pdl.mlir, and FILE.reference.py beside it (folders are created); default: print the pattern",
    )
    p.add_argument("--name", default=None, help="pattern name (default: the function's)")
    p.add_argument(
        "--benefit", type=int, default=1, help="priority where patterns compete (default 1)"
    )
    p.add_argument(
        "--dtype", default="float32", help="dtype of shapes given without one (default float32)"
    )
    p.add_argument(
        "--commutative",
        action="store_true",
        help="also a pattern per operand order of mul / add / maximum / minimum",
    )
    p.set_defaults(fn=cmd_gen_pattern)

    p = sub.add_parser("lint", help="overlapping, shadowed or dangling patterns; exit 1 on errors")
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="pattern / kernel files or folders (default: the configured ones)",
    )
    _add_folders(p, patterns=False)
    p.set_defaults(fn=cmd_lint)

    p = sub.add_parser(
        "bisect", help="find the substitution that makes a model's output diverge from eager"
    )
    p.add_argument("model", help=_MODEL_HELP)
    _add_optimize_options(p, "eager: only kernels can make a difference")
    p.set_defaults(fn=cmd_bisect)


def _add_kernel_tools(sub: Any) -> None:
    p = sub.add_parser("kernels", help="list the kernels found in the kernel folders")
    _add_folders(p, patterns=False)
    p.set_defaults(fn=cmd_kernels)

    p = sub.add_parser(
        "abi-check", help="check kernels against their declaration, opcheck and reference"
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="kernel files (.py, .so) or folders")
    p.add_argument("--target", default=None, help="plan for a named target instead of this host")
    p.set_defaults(fn=cmd_abi_check)

    p = sub.add_parser(
        "build-kernels", help="build the AArch64 kernel library (natively, or cross on x86)"
    )
    p.add_argument("--arch", default="aarch64", choices=["aarch64"], help="architecture (aarch64)")
    p.add_argument(
        "--out",
        metavar="FOLDER",
        default=None,
        help="folder (default: PDLKIT_BUILD_DIR or ~/.cache/pdlkit/native)",
    )
    p.add_argument("--driver", action="store_true", help="also build the qemu ABI driver")
    p.set_defaults(fn=cmd_build_kernels)

    p = sub.add_parser(
        "pin", help="pin a kernel folder's files by sha256 (writes its kernels.yaml)"
    )
    p.add_argument("folder", help="the kernel folder")
    p.set_defaults(fn=cmd_pin)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="pdlkit",
        description="Substitute subgraphs of PyTorch models matched by PDL patterns with kernels.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _add_demo_check_explain(sub)
    _add_authoring(sub)
    _add_kernel_tools(sub)
    return top


def quiet_imports() -> None:
    """Keep torchao's and torch's import-time chatter (extension libraries that failed to
    load, pytree deprecations) off the command's output; errors still show."""
    import logging

    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    quiet_imports()
    try:
        return int(args.fn(args))
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
