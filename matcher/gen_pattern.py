"""Patterns from Python: trace a reference function, write the PDL pattern that matches it.

The function is traced exactly as the pdlkit pass sees a model (``make_fx`` at the
pre-dispatch ATen level, then torch-mlir's FxImporter into the Torch dialect), so the
pattern names the ops the pass will meet. Before::

    def linear_relu(x, w, b):
        return torch.relu(torch.nn.functional.linear(x, w, b))

After ``pattern_from_function(linear_relu, (x, w, b), op="linear_relu")``::

    pdl.pattern @linear_relu : benefit(1) {
      %x = pdl.operand
      ...
      %linear = pdl.operation "torch.aten.linear"(%x, %w, %b : ...) -> (%linear_t : !pdl.type)
      %linear_out = pdl.result 0 of %linear
      %relu = pdl.operation "torch.aten.relu"(%linear_out : !pdl.value) -> (%relu_t : !pdl.type)
      pdl.apply_native_constraint "has_dtype"(%x, %x_dtype : !pdl.value, !pdl.attribute)
      pdl.apply_native_constraint "single_use"(%linear_out : !pdl.value)
      pdl.rewrite %relu { ... pdlkit_call("linear_relu", %x, %w, %b, %relu) }
    }

Operands are named after the function's parameters and the kernel receives them in the
same order. Every tensor parameter gets a dtype constraint (the example's dtype), every
literal in the function a ``constant_equals`` (or ``is_none``) constraint, every
intermediate value ``single_use``. :func:`reference_source` writes the function beside
the pattern as a ``@pdlkit.reference`` for its logical op: the semantics kernels are
verified against (``pdlkit abi-check``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import math
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_CONSTANT_OPS = {
    "torch.constant.int",
    "torch.constant.float",
    "torch.constant.str",
    "torch.constant.bool",
    "torch.constant.none",
    "torch.constant.device",
    "torch.constant.number",
}
_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
}


_INT_SENTINEL = 1_000_003
_FLOAT_SENTINEL = 0.123456789


class GenPatternError(ValueError):
    """The function cannot become a pattern (the message says which part, and why)."""


def trace(fn: Callable[..., Any], example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """``fn`` at the level the pass matches: pre-dispatch ATen, with ``meta["val"]``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        return make_fx(fn, pre_dispatch=True, tracing_mode="fake")(*example_inputs)


def _ident(text: str) -> str:
    s = re.sub(r"\W", "_", text)
    return s if s and not s[0].isdigit() else f"v{s}"


def _attr(value: Any) -> str:
    """A Python constant as an MLIR attribute that ``natives.py_attr`` reads back equal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value} : i64"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise GenPatternError(f"constant {value!r} has no exact attribute spelling")
        return f"{value!r} : f64"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_attr(v) for v in value) + "]"
    raise GenPatternError(f"constant {value!r} ({type(value).__name__}) is not supported")


@dataclass
class _Writer:
    lines: list[str]
    names: set[str]

    def fresh(self, want: str) -> str:
        name, i = _ident(want), 1
        while name in self.names:
            i += 1
            name = f"{_ident(want)}_{i}"
        self.names.add(name)
        return name

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)


def pattern_from_function(
    fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    *,
    op: str,
    name: str | None = None,
    benefit: int = 1,
    source: str = "",
) -> str:
    """The PDL text of a pattern that matches ``fn``'s computation and calls logical op ``op``.

    ``example_inputs`` hold one value per parameter of ``fn``: a tensor (its dtype becomes a
    constraint; its shape only guides the trace) or a Python scalar, for an argument that is
    a constant in the model's graph (a quantization scale, a zero point): the pattern then
    requires a constant there (``is_constant``) and passes it on. ``source`` is noted in
    the header.
    """
    from pdlkit.matcher import natives
    from pdlkit.matcher.to_mlir import import_graph, new_context
    from torch_mlir import ir

    params = list(inspect.signature(fn).parameters)
    if len(params) != len(example_inputs):
        raise GenPatternError(
            f"{fn.__name__} takes {len(params)} parameter(s) ({', '.join(params)}), "
            f"{len(example_inputs)} example input(s) given"
        )
    # Scalar parameters are traced with a value nothing else in the function is likely to
    # hold, then found again among the graph's constants.
    traced_inputs: list[Any] = []
    scalars: dict[str, Any] = {}  # parameter -> the value it was traced with
    for k, (p, x) in enumerate(zip(params, example_inputs, strict=True)):
        if isinstance(x, bool | str):
            scalars[p] = x
        elif isinstance(x, int):
            scalars[p] = _INT_SENTINEL + k
        elif isinstance(x, float):
            scalars[p] = _FLOAT_SENTINEL + k
        elif not isinstance(x, torch.Tensor):
            raise GenPatternError(
                f"parameter {p!r}: example inputs are tensors or Python scalars (int, float, "
                f"bool, str), got {type(x).__name__}"
            )
        traced_inputs.append(scalars.get(p, x))
    try:
        gm = trace(fn, traced_inputs)
    except Exception as e:  # the user's function, on the user's examples
        raise GenPatternError(
            f"tracing {fn.__name__} failed: {type(e).__name__}: {str(e).splitlines()[0]}"
        ) from e
    nodes = {n.name: n for n in gm.graph.nodes}
    ctx = new_context()
    imported = import_graph(gm, ctx)
    block = imported.func.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    ret = ops[-1]
    if ret.name != "func.return" or len(ret.operands) != 1:
        raise GenPatternError(f"{fn.__name__} must return one tensor (a pattern has one root)")
    root_val = ret.operands[0]
    if isinstance(root_val, ir.BlockArgument):
        raise GenPatternError(f"{fn.__name__} returns its input unchanged: nothing to match")

    def loc(o: Any) -> str:
        return getattr(o.location, "name_str", "") or o.name

    # the ops the result depends on, in graph order (constants become constraints instead)
    needed: set[int] = set()
    by_hash = {hash(o): o for o in ops}
    stack = [root_val.owner.operation]
    while stack:
        o = stack.pop()
        if hash(o) in needed or o.name in _CONSTANT_OPS:
            continue
        if o.name == "torch.prim.ListConstruct" and natives.is_constant(o.results[0]):
            continue
        needed.add(hash(o))
        stack.extend(v.owner.operation for v in o.operands if isinstance(v, ir.OpResult))
    body = [o for o in ops if hash(o) in needed and hash(o) in by_hash]

    w = _Writer([], set())
    param_of_arg: dict[int, str] = {}
    used_params: set[str] = set()
    for i, p in enumerate(params):
        param_of_arg[i] = w.fresh(p)
    scalar_param = {param_of_arg[params.index(p)]: v for p, v in scalars.items()}
    for pname in param_of_arg.values():
        w.emit(f"%{pname} = pdl.operand")
    constraints: list[str] = []
    result_name: dict[tuple[int, int], str] = {}
    op_name: dict[int, str] = {}
    for o in body:
        node = nodes.get(loc(o))
        arg_names = (
            [a.name for a in node.target._schema.arguments]
            if node is not None and hasattr(node.target, "_schema")
            else []
        )
        operands = []
        for j, v in enumerate(o.operands):
            if isinstance(v, ir.BlockArgument):
                number = ir.BlockArgument(v).arg_number
                if number not in param_of_arg:  # a get_attr: a tensor made inside fn
                    raise GenPatternError(
                        f"{loc(o)} reads a tensor constant made inside {fn.__name__} "
                        f"({imported.inputs[number].name}); pass it as a parameter instead"
                    )
                pname = param_of_arg[number]
                used_params.add(pname)
                operands.append(pname)
                continue
            res = ir.OpResult(v)
            key = (hash(res.owner.operation), res.result_number)
            if key in result_name:
                operands.append(result_name[key])
                continue
            value = natives.constant_value(v)
            if value is natives.NOT_CONSTANT:
                raise GenPatternError(f"operand {j} of {loc(o)} comes from outside the function")
            param = next(
                (q for q, sv in scalar_param.items() if type(sv) is type(value) and sv == value),
                None,
            )
            if param is not None:
                if param in used_params:
                    raise GenPatternError(
                        f"scalar parameter {param!r} is used more than once; a pattern binds it once"
                    )
                used_params.add(param)
                constraints.append(
                    f'pdl.apply_native_constraint "is_constant"(%{param} : !pdl.value)'
                )
                operands.append(param)
                continue
            arg = arg_names[j] if j < len(arg_names) else f"arg{j}"
            cname = w.fresh(arg if arg not in w.names else f"{loc(o)}_{arg}")
            w.emit(f"%{cname} = pdl.operand")
            if value is None:
                constraints.append(f'pdl.apply_native_constraint "is_none"(%{cname} : !pdl.value)')
            else:
                aname = w.fresh(f"{cname}_value")
                constraints.append(f"%{aname} = pdl.attribute = {_attr(value)}")
                constraints.append(
                    f'pdl.apply_native_constraint "constant_equals"(%{cname}, %{aname} : !pdl.value, !pdl.attribute)'
                )
            operands.append(cname)
        oname = w.fresh(loc(o))
        op_name[hash(o)] = oname
        types = [
            w.fresh(f"{oname}_t" if len(o.results) == 1 else f"{oname}_t{k}")
            for k in range(len(o.results))
        ]
        for t in types:
            w.emit(f"%{t} = pdl.type")
        ins = ", ".join(f"%{x}" for x in operands)
        in_types = ", ".join("!pdl.value" for _ in operands)
        sig = f"({ins} : {in_types})" if operands else ""
        outs = ", ".join(f"%{t}" for t in types)
        out_types = ", ".join("!pdl.type" for _ in types)
        w.emit(f'%{oname} = pdl.operation "{o.name}"{sig} -> ({outs} : {out_types})')
        if hash(o) != hash(root_val.owner.operation):
            for k, r in enumerate(o.results):
                uses = sum(1 for _ in r.uses)
                if uses:
                    rname = w.fresh(f"{oname}_out" if len(o.results) == 1 else f"{oname}_out{k}")
                    w.emit(f"%{rname} = pdl.result {k} of %{oname}")
                    result_name[(hash(o), k)] = rname
                if uses == 1:  # read only inside the pattern: the kernel call makes it dead
                    constraints.append(
                        f'pdl.apply_native_constraint "single_use"(%{rname} : !pdl.value)'
                    )
    unused = [p for p in param_of_arg.values() if p not in used_params]
    if unused:
        raise GenPatternError(
            f"parameter(s) {', '.join(unused)} of {fn.__name__} do not reach its result"
        )
    dtype_lines = []
    for i, x in enumerate(example_inputs):
        p = param_of_arg[i]
        if not isinstance(x, torch.Tensor):
            continue
        dt = _DTYPE_NAMES.get(x.dtype, str(x.dtype).removeprefix("torch."))
        a = w.fresh(f"{p}_dtype")
        dtype_lines.append(f'%{a} = pdl.attribute = "{dt}"')
        dtype_lines.append(
            f'pdl.apply_native_constraint "has_dtype"(%{p}, %{a} : !pdl.value, !pdl.attribute)'
        )
    for line in dtype_lines + constraints:
        w.emit(line)
    root = op_name[hash(root_val.owner.operation)]
    args = [param_of_arg[i] for i in range(len(params))]
    w.emit(f"pdl.rewrite %{root} {{")
    w.emit(f'  %op = pdl.attribute = "{op}"')
    call_args = ", ".join(["%op", *(f"%{a}" for a in args), f"%{root}"])
    call_types = ", ".join(["!pdl.attribute", *("!pdl.value" for _ in args), "!pdl.operation"])
    w.emit(f'  pdl.apply_native_rewrite "pdlkit_call"({call_args} : {call_types})')
    w.emit("}")

    chain = " -> ".join(o.name.removeprefix("torch.aten.") for o in body)
    shown = ", ".join(
        f"{p}: {_DTYPE_NAMES.get(x.dtype, x.dtype)}{list(x.shape)}"
        if isinstance(x, torch.Tensor)
        else f"{p}: {type(x).__name__}"
        for p, x in zip(params, example_inputs, strict=True)
    )
    header = [
        f"// {chain}   ->   pdlkit_call({op!r}, {', '.join(args)})",
        f"// Generated by pdlkit gen-pattern from {source or fn.__qualname__}({shown}).",
    ]
    pname = _ident(name or fn.__name__)
    return "\n".join([*header, f"pdl.pattern @{pname} : benefit({benefit}) {{", *w.lines, "}", ""])


# -- the reference stored beside the pattern ----------------------------------------------------


def reference_source(fn: Callable[..., Any], example_inputs: Sequence[Any], *, op: str) -> str:
    """A Python file registering ``fn`` as ``@pdlkit.reference(op)``, with example inputs of
    the traced shapes: self-contained (the function's module imports come along)."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise GenPatternError(
            f"cannot read the source of {fn.__qualname__}: define it in a .py file"
        ) from None
    imports: list[str] = []
    module = inspect.getmodule(fn)
    try:
        tree = ast.parse(inspect.getsource(module)) if module is not None else None
    except (OSError, TypeError):
        tree = None
    if tree is not None:
        for stmt in tree.body:
            if isinstance(stmt, ast.Import | ast.ImportFrom) and not (
                isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
            ):
                imports.append(ast.unparse(stmt))
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Attribute):
                imports.append(ast.unparse(stmt))  # aliases such as F = torch.nn.functional
    shapes = []
    for x in example_inputs:
        if not isinstance(x, torch.Tensor):
            shapes.append(repr(x))
        elif x.dtype.is_floating_point:
            shapes.append(f"torch.randn({tuple(x.shape)}, generator=g).to(dtype or {x.dtype})")
        elif x.dtype == torch.bool:
            shapes.append(f"torch.rand({tuple(x.shape)}, generator=g) > 0.5")
        else:
            lo, hi = (0, 256) if x.dtype == torch.uint8 else (-128, 128)
            shapes.append(
                f"torch.randint({lo}, {hi}, {tuple(x.shape)}, generator=g, dtype={x.dtype})"
            )
    lines = [
        f'"""Reference semantics of logical op {op!r}: kernels for it are verified against',
        f"{fn.__name__} (written by pdlkit gen-pattern next to the pattern it generated).",
        '"""',
        "",
        *dict.fromkeys(["import torch", "import pdlkit", *imports]),
        "",
        "",
        "def _examples(dtype):",
        "    g = torch.Generator().manual_seed(0)",
        f"    return [({', '.join(shapes)},)]",
        "",
        "",
        f"@pdlkit.reference({op!r}, examples=_examples)",
        src.rstrip(),
        "",
    ]
    return "\n".join(lines)


def reference_path(pattern_path: Path) -> Path:
    """``linear_relu.pdl.mlir`` -> ``linear_relu.reference.py`` (same folder)."""
    stem = pattern_path.name.removesuffix(".pdl.mlir").removesuffix(".pdll")
    return pattern_path.with_name(f"{stem}.reference.py")


# -- command line helpers -----------------------------------------------------------------------


def load_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` or ``path/to/file.py:function``."""
    target, _, fn_name = spec.rpartition(":")
    if not target or not fn_name:
        raise GenPatternError(f"{spec!r}: expected MODULE:FUNCTION or FILE.py:FUNCTION")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise GenPatternError(f"{target}: no such file")
        mspec = importlib.util.spec_from_file_location(path.stem, path)
        assert mspec is not None and mspec.loader is not None
        module = importlib.util.module_from_spec(mspec)
        sys.modules.setdefault(path.stem, module)
        mspec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise GenPatternError(f"{target}: cannot import: {e}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise GenPatternError(f"{target} has no function {fn_name!r}")
    return fn


_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()} | {"f32": torch.float32, "bf16": torch.bfloat16}


_SCALARS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": lambda t: _bool(t),
}


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


_SCALAR_DEFAULTS: dict[str, Any] = {"int": 0, "float": 1.0, "str": "", "bool": False}


def parse_shapes(text: str, default_dtype: str = "float32") -> list[Any]:
    """``"4x8,6x8,6"`` (one shape per parameter, ``x`` between dims, ``:int8`` for a dtype)
    -> example tensors; ``float``, ``int``, ``str=tanh``, ``bool=true`` give Python scalars."""
    out: list[Any] = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        kind, eq, literal = item.partition("=")
        if kind in _SCALARS:
            try:
                out.append(_SCALARS[kind](literal) if eq else _SCALAR_DEFAULTS[kind])
            except ValueError:
                raise GenPatternError(f"example {item!r}: {literal!r} is not a {kind}") from None
            continue
        dims, _, dt = item.partition(":")
        dtype = _DTYPES.get(dt or default_dtype)
        if dtype is None:
            raise GenPatternError(
                f"example shape {item!r}: unknown dtype {dt!r} (known: {', '.join(_DTYPES)})"
            )
        try:
            shape = [int(d) for d in dims.split("x")] if dims not in ("", "scalar") else []
        except ValueError:
            raise GenPatternError(
                f"example shape {item!r}: expected dims like 4x8, e.g. --example-shapes 4x8,6x8,6"
            ) from None
        if dtype.is_floating_point:
            out.append(torch.randn(shape).to(dtype))
        else:
            out.append(torch.zeros(shape, dtype=dtype))
    return out


def write_pattern(
    function: str,
    example_shapes: str,
    *,
    op: str,
    out: str | Path | None = None,
    name: str | None = None,
    benefit: int = 1,
    dtype: str = "float32",
) -> list[Path]:
    """``pdlkit gen-pattern``: the pattern to ``out`` (and its reference beside it), or to stdout."""
    fn = load_function(function)
    inputs = parse_shapes(example_shapes, dtype)
    text = pattern_from_function(
        fn, inputs, op=op, name=name, benefit=benefit, source=function.rsplit("/", 1)[-1]
    )
    if out is None:
        print(text, end="")
        return []
    path = Path(out)
    if not path.name.endswith(".pdl.mlir"):
        raise GenPatternError(f"{out}: the output file's name must end in .pdl.mlir")
    ref = reference_path(path)
    text = text.replace(
        "\npdl.pattern",
        f"\n// Reference semantics: {ref.name} (@pdlkit.reference({op!r})).\npdl.pattern",
        1,
    )
    path.write_text(text)
    ref.write_text(reference_source(fn, inputs, op=op))
    return [path, ref]
