"""PDLL pattern files (``*.pdll``) -> PDL, with ``mlir-pdll``.

A ``.pdll`` file is compiled when it is loaded. The native function library is declared
for it automatically (every constraint of :mod:`pdlkit.matcher.natives`, and
``pdlkit_call``), so a pattern file holds only patterns. Before (PDL)::

    pdl.pattern @linear_relu : benefit(2) {
      %x = pdl.operand ...   (12 lines)

After (PDLL)::

    Pattern linear_relu with benefit(2) {
      let lin = op<torch.aten.linear>(x: Value, w: Value, b: Value);
      let root = op<torch.aten.relu>(lin);
      is_float_tensor(x);
      single_use(lin);
      rewrite root with { pdlkit_call(attr<"\\"linear_relu\\"">, (x, w, b), root); };
    }

``pdlkit_call(op, (operands...), root)`` replaces ``root`` with a call of the kernel for
logical op ``op``; ``pdlkit_call_attrs(op, (operands...), attr<"[...]">, root)`` passes
constant arguments (an array attribute) after the operands. Both compile to the same flat
``pdl.apply_native_rewrite "pdlkit_call"`` a ``.pdl.mlir`` file spells out, so a pattern
behaves the same in either form. Errors name the ``.pdll`` file and line.

``mlir-pdll`` is looked up in ``$PDLKIT_MLIR_PDLL`` (a path; empty = none), then on
``PATH``, then in ``/usr/lib/llvm-*/bin`` (Debian's ``mlir-16-tools``).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from pdlkit.matcher.pdl_checks import nested_ops, nesting_problem

from pdlkit.errors import PdlkitError

ENV = "PDLKIT_MLIR_PDLL"
INSTALL_HINT = (
    "install mlir-pdll (Debian/Ubuntu: apt-get install mlir-16-tools; any LLVM build with MLIR "
    f"works), put it on PATH or set {ENV}=/path/to/mlir-pdll"
)
_CALL_FORMS = {"pdlkit_call", "pdlkit_call_attrs"}


class PdllError(PdlkitError, ValueError):
    """A .pdll file does not compile (message: ``file:line:col: ...``) or mlir-pdll is missing."""


def find_mlir_pdll() -> str | None:
    """The ``mlir-pdll`` executable to use, or None."""
    env = os.environ.get(ENV)
    if env is not None:
        return env if env and os.access(env, os.X_OK) and Path(env).is_file() else None
    found = shutil.which("mlir-pdll")
    if found:
        return found
    for cand in sorted(Path("/usr/lib").glob("llvm-*/bin/mlir-pdll"), reverse=True):
        if os.access(cand, os.X_OK):
            return str(cand)
    return None


def prelude() -> str:
    """PDLL declarations of the native function library (what every .pdll file sees)."""
    from pdlkit.matcher.natives import CONSTRAINTS

    lines = ["// pdlkit's native function library (generated from pdlkit.matcher.natives)"]
    for name, fn in CONSTRAINTS.items():
        params = []
        for p in inspect.signature(fn).parameters.values():
            kind = "Value" if "Value" in str(p.annotation) else "Attr"
            params.append(f"{p.name}: {kind}")
        lines.append(f"Constraint {name}({', '.join(params)});")
    lines += [
        "Rewrite pdlkit_call(op: Attr, args: ValueRange, root: Op);",
        "Rewrite pdlkit_call_attrs(op: Attr, args: ValueRange, consts: Attr, root: Op);",
    ]
    return "\n".join(lines) + "\n"


_CACHE: dict[str, str] = {}
_LOCK = threading.Lock()


def compile_pdll(path: Path) -> str:
    """PDL text (with the .pdll's file:line:col locations) for one .pdll file."""
    path = Path(path).resolve()
    if not path.is_file():
        raise PdllError(f"{path}:1:1: pattern file does not exist")
    tool = find_mlir_pdll()
    if tool is None:
        raise PdllError(f"{path}:1:1: loading a .pdll pattern needs mlir-pdll: {INSTALL_HINT}")
    source = path.read_bytes()
    deep = nesting_problem(source.decode(errors="replace"), in_strings=True)
    if deep is not None:  # mlir-pdll recurses per level too; its output would crash our parser
        raise PdllError(f"{path}:{deep[0]}:{deep[1]}: {deep[2]}")
    key = hashlib.sha256(str(path).encode() + b"\0" + tool.encode() + b"\0" + source).hexdigest()
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    with tempfile.TemporaryDirectory(prefix="pdlkit-pdll-") as tmp:
        # The user's file is #included, not pasted: its diagnostics and locations keep their
        # own file and line numbers.
        (Path(tmp) / "pdlkit_natives.pdll").write_text(prelude())
        main = Path(tmp) / "main.pdll"
        main.write_text(f'#include "pdlkit_natives.pdll"\n#include "{path}"\n')
        r = subprocess.run(
            [tool, str(main), "-x", "mlir", "-I", tmp, "-I", str(path.parent)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    if r.returncode < 0:  # killed by a signal: its stderr is a stack dump, not a diagnostic
        raise PdllError(f"{path}:1:1: mlir-pdll crashed (signal {-r.returncode}) on this file")
    if r.returncode != 0:
        raise PdllError(_errors(r.stderr, path))
    text = _flatten_calls(r.stdout, path)
    with _LOCK:
        _CACHE[key] = text
    return text


def _errors(stderr: str, path: Path) -> str:
    """mlir-pdll's diagnostics without the wrapper's include lines; file:line:col first."""
    lines = [ln for ln in stderr.splitlines() if not ln.startswith("Included from ")]
    msg = "\n".join(lines).strip()
    if "pdlkit_natives.pdll" in msg and str(path) not in msg:
        msg = f"{path}:1:1: conflicts with pdlkit's native declarations: {msg}"
    return msg or f"{path}:1:1: mlir-pdll failed without a message"


def _flatten_calls(pdl_text: str, path: Path) -> str:
    """``pdlkit_call(op, range(args), [consts,] root)`` -> the flat PDL form:
    ``pdlkit_call(op, args..., consts..., root)``, which the matcher and tools read."""
    from torch_mlir import ir

    deep = nesting_problem(pdl_text)  # an #include'd file was not scanned above
    if deep is not None:
        raise PdllError(f"{path}:1:1: mlir-pdll's output: {deep[2]}")
    ctx = ir.Context()
    try:
        module = ir.Module.parse(pdl_text, ctx)
    except ir.MLIRError as e:
        raise PdllError(f"{path}:1:1: mlir-pdll's output does not parse: {e}") from e
    calls = [
        o
        for o in nested_ops(module.operation)
        if o.name == "pdl.apply_native_rewrite" and o.attributes["name"].value in _CALL_FORMS
    ]
    attr_type = ir.Type.parse("!pdl.attribute", ctx)
    for call in calls:
        ops = list(call.operands)
        with_consts = call.attributes["name"].value == "pdlkit_call_attrs"
        rng = ops[1].owner
        where = _where(call, path)
        if not isinstance(rng, ir.Operation | ir.OpView) or rng.operation.name != "pdl.range":
            raise PdllError(
                f"{where}: pdlkit_call's operands must be a tuple of values, e.g. (x, w, b)"
            )
        rng = rng.operation
        new_operands = [ops[0], *rng.operands]
        dead = [rng]
        with ctx, call.location, ir.InsertionPoint(call):
            if with_consts:
                holder = ops[2].owner.operation
                arr = holder.attributes["value"] if "value" in holder.attributes else None
                if not isinstance(arr, ir.ArrayAttr):
                    raise PdllError(
                        f'{where}: pdlkit_call_attrs takes its constants as an array, e.g. attr<"[\\"none\\", 0]">'
                    )
                for a in ir.ArrayAttr(arr):
                    new_operands.append(
                        ir.Operation.create(
                            "pdl.attribute", results=[attr_type], attributes={"value": a}
                        ).result
                    )
                dead.append(holder)
            new_operands.append(ops[-1])
            ir.Operation.create(
                "pdl.apply_native_rewrite",
                results=[],
                operands=new_operands,
                attributes={"name": ir.StringAttr.get("pdlkit_call")},
            )
        call.erase()
        for d in dead:
            if not any(True for r in d.results for _ in r.uses):
                d.erase()
    return str(module.operation.get_asm(enable_debug_info=True))


def _where(op: Any, path: Path) -> str:
    loc = op.location
    if hasattr(loc, "start_line"):
        return f"{path}:{loc.start_line}:{loc.start_col}"
    return f"{path}:1:1"
