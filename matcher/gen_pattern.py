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

import inspect
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pdlkit.matcher.canonicalize import canonicalize
from pdlkit.matcher.cse import eliminate_common_subexpressions
from pdlkit.matcher.patterns import load_patterns
from pdlkit.matcher.pdl_checks import CONSTANT_OPS as _CONSTANT_OPS
from pdlkit.runtime_abi.capability import host
from pdlkit.runtime_abi.dtypes import short_name
from pdlkit.runtime_abi.kernel import declare
from pdlkit.runtime_abi.registry import KernelRegistry

from pdlkit.errors import PdlkitError

_INT_SENTINEL = 1_000_003
_FLOAT_SENTINEL = 0.123456789


class GenPatternError(PdlkitError, ValueError):
    """The function cannot become a pattern (the message says which part, and why)."""


def trace(fn: Callable[..., Any], example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """``fn`` exactly as the pass meets a model: pre-dispatch ATen with ``meta["val"]``,
    duplicate pure ops merged (``matcher/cse.py``) and spellings made canonical
    (``matcher/canonicalize.py``: ``mm`` / ``addmm`` / ``matmul`` with a weight operand
    become ``linear``, ``view`` becomes ``reshape``, ...). The canonicalization rules that
    applied are in ``gm.meta["pdlkit_canonical"]``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        gm = make_fx(fn, pre_dispatch=True, tracing_mode="fake")(*example_inputs)
    eliminate_common_subexpressions(gm)
    gm.meta["pdlkit_canonical"] = canonicalize(gm)
    return gm


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


# Ops whose first two operands may be exchanged (add only with alpha = 1, checked below).
COMMUTATIVE = {
    "torch.aten.mul.Tensor",
    "torch.aten.add.Tensor",
    "torch.aten.maximum",
    "torch.aten.minimum",
}


@dataclass
class _Traced:
    """A reference function traced and imported, ready to be written as patterns."""

    fn: Callable[..., Any]
    params: list[str]
    example_inputs: Sequence[Any]
    scalars: dict[str, Any]  # parameter -> the value it was traced with
    nodes: dict[str, torch.fx.Node]
    imported: Any
    body: list[Any]  # the MLIR ops the result depends on, in graph order
    root: Any
    canonical: dict[str, int]

    def loc(self, o: Any) -> str:
        return getattr(o.location, "name_str", "") or o.name

    def commutative(self) -> list[int]:
        """Positions in ``body`` of ops whose two operands could be written either way."""
        from pdlkit.matcher import natives

        out = []
        for i, o in enumerate(self.body):
            if o.name not in COMMUTATIVE or len(o.operands) < 2:
                continue
            if o.name == "torch.aten.add.Tensor" and natives.constant_value(o.operands[2]) != 1:
                continue
            if o.operands[0] != o.operands[1]:
                out.append(i)
        return out


def _trace_inputs(
    fn: Callable[..., Any], params: list[str], example_inputs: Sequence[Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Scalar parameters are traced with a value nothing else in the function is likely to
    hold, then found again among the graph's constants."""
    if len(params) != len(example_inputs):
        raise GenPatternError(
            f"{fn.__name__} takes {len(params)} parameter(s) ({', '.join(params)}), "
            f"{len(example_inputs)} example input(s) given"
        )
    traced_inputs: list[Any] = []
    scalars: dict[str, Any] = {}
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
    return traced_inputs, scalars


def _prepare(fn: Callable[..., Any], example_inputs: Sequence[Any]) -> _Traced:
    from pdlkit.matcher import natives
    from pdlkit.matcher.to_mlir import import_graph, new_context
    from torch_mlir import ir

    params = list(inspect.signature(fn).parameters)
    traced_inputs, scalars = _trace_inputs(fn, params, example_inputs)
    try:
        gm = trace(fn, traced_inputs)
    except Exception as e:  # the user's function, on the user's examples
        raise GenPatternError(
            f"tracing {fn.__name__} failed: {type(e).__name__}: {str(e).splitlines()[0]}"
        ) from e
    imported = import_graph(gm, new_context())
    ops = [o.operation for o in imported.func.regions[0].blocks[0].operations]
    ret = ops[-1]
    if ret.name != "func.return" or len(ret.operands) != 1:
        raise GenPatternError(f"{fn.__name__} must return one tensor (a pattern has one root)")
    root_val = ret.operands[0]
    if isinstance(root_val, ir.BlockArgument):
        raise GenPatternError(f"{fn.__name__} returns its input unchanged: nothing to match")
    # the ops the result depends on, in graph order (constants become constraints instead)
    needed: set[int] = set()
    stack = [root_val.owner.operation]
    while stack:
        o = stack.pop()
        if hash(o) in needed or o.name in _CONSTANT_OPS:
            continue
        if o.name == "torch.prim.ListConstruct" and natives.is_constant(o.results[0]):
            continue
        needed.add(hash(o))
        stack.extend(v.owner.operation for v in o.operands if isinstance(v, ir.OpResult))
    canonical = {k: n for k, n in gm.meta["pdlkit_canonical"].items() if k != "spell_defaults"}
    return _Traced(
        fn=fn,
        params=params,
        example_inputs=example_inputs,
        scalars=scalars,
        nodes={n.name: n for n in gm.graph.nodes},
        imported=imported,
        body=[o for o in ops if hash(o) in needed],
        root=root_val.owner.operation,
        canonical=canonical,
    )


class _Emitter:
    """Writes one ``pdl.pattern`` body for a traced function; ``swap`` holds positions in
    ``t.body`` of commutative ops whose two operands are written the other way round."""

    def __init__(self, t: _Traced, swap: frozenset[int] = frozenset()):
        self.t, self.swap = t, swap
        self.w = _Writer([], set())
        self.param_of_arg = {i: self.w.fresh(p) for i, p in enumerate(t.params)}
        self.scalar_param = {self.param_of_arg[t.params.index(p)]: v for p, v in t.scalars.items()}
        self.used: set[str] = set()
        self.constraints: list[str] = []
        self.result_name: dict[tuple[int, int], str] = {}
        self.op_name: dict[int, str] = {}

    def operand(self, o: Any, j: int, v: Any, arg_names: list[str]) -> str:
        """The pattern name of operand ``j`` of ``o`` (a new constrained operand for a constant)."""
        from pdlkit.matcher import natives
        from torch_mlir import ir

        t, w = self.t, self.w
        if isinstance(v, ir.BlockArgument):
            number = ir.BlockArgument(v).arg_number
            if number not in self.param_of_arg:  # a get_attr: a tensor made inside fn
                raise GenPatternError(
                    f"{t.loc(o)} reads a tensor constant made inside {t.fn.__name__} "
                    f"({t.imported.inputs[number].name}); pass it as a parameter instead"
                )
            self.used.add(self.param_of_arg[number])
            return self.param_of_arg[number]
        res = ir.OpResult(v)
        key = (hash(res.owner.operation), res.result_number)
        if key in self.result_name:
            return self.result_name[key]
        value = natives.constant_value(v)
        if value is natives.NOT_CONSTANT:
            raise GenPatternError(f"operand {j} of {t.loc(o)} comes from outside the function")
        param = next(
            (q for q, sv in self.scalar_param.items() if type(sv) is type(value) and sv == value),
            None,
        )
        if param is not None:
            if param in self.used:
                raise GenPatternError(
                    f"scalar parameter {param!r} is used more than once; a pattern binds it once"
                )
            self.used.add(param)
            self.constraints.append(
                f'pdl.apply_native_constraint "is_constant"(%{param} : !pdl.value)'
            )
            return param
        arg = arg_names[j] if j < len(arg_names) else f"arg{j}"
        cname = w.fresh(arg if arg not in w.names else f"{t.loc(o)}_{arg}")
        w.emit(f"%{cname} = pdl.operand")
        if value is None:
            self.constraints.append(f'pdl.apply_native_constraint "is_none"(%{cname} : !pdl.value)')
        else:
            aname = w.fresh(f"{cname}_value")
            self.constraints.append(f"%{aname} = pdl.attribute = {_attr(value)}")
            self.constraints.append(
                f'pdl.apply_native_constraint "constant_equals"(%{cname}, %{aname} : '
                "!pdl.value, !pdl.attribute)"
            )
        return cname

    def operation(self, i: int, o: Any) -> None:
        t, w = self.t, self.w
        node = t.nodes.get(t.loc(o))
        target = getattr(node, "target", None)
        schema = getattr(target, "_schema", None)
        arg_names = [a.name for a in schema.arguments] if schema is not None else []
        operands = [self.operand(o, j, v, arg_names) for j, v in enumerate(o.operands)]
        if i in self.swap:
            operands[0], operands[1] = operands[1], operands[0]
        oname = w.fresh(t.loc(o))
        self.op_name[hash(o)] = oname
        types = [
            w.fresh(f"{oname}_t" if len(o.results) == 1 else f"{oname}_t{k}")
            for k in range(len(o.results))
        ]
        for ty in types:
            w.emit(f"%{ty} = pdl.type")
        ins = ", ".join(f"%{x}" for x in operands)
        in_types = ", ".join("!pdl.value" for _ in operands)
        sig = f"({ins} : {in_types})" if operands else ""
        outs = ", ".join(f"%{ty}" for ty in types)
        out_types = ", ".join("!pdl.type" for _ in types)
        w.emit(f'%{oname} = pdl.operation "{o.name}"{sig} -> ({outs} : {out_types})')
        if hash(o) == hash(t.root):
            return
        for k, r in enumerate(o.results):
            uses = sum(1 for _ in r.uses)
            if not uses:
                continue
            rname = w.fresh(f"{oname}_out" if len(o.results) == 1 else f"{oname}_out{k}")
            w.emit(f"%{rname} = pdl.result {k} of %{oname}")
            self.result_name[(hash(o), k)] = rname
            if uses == 1:  # read only inside the pattern: the kernel call makes it dead
                self.constraints.append(
                    f'pdl.apply_native_constraint "single_use"(%{rname} : !pdl.value)'
                )

    def pattern(self, op: str, name: str, benefit: int) -> list[str]:
        t, w = self.t, self.w
        for pname in self.param_of_arg.values():
            w.emit(f"%{pname} = pdl.operand")
        for i, o in enumerate(t.body):
            self.operation(i, o)
        unused = [p for p in self.param_of_arg.values() if p not in self.used]
        if unused:
            raise GenPatternError(
                f"parameter(s) {', '.join(unused)} of {t.fn.__name__} do not reach its result"
            )
        for i, x in enumerate(t.example_inputs):
            if isinstance(x, torch.Tensor):
                p = self.param_of_arg[i]
                a = w.fresh(f"{p}_dtype")
                dt = short_name(x.dtype)
                w.emit(f'%{a} = pdl.attribute = "{dt}"')
                w.emit(
                    f'pdl.apply_native_constraint "has_dtype"(%{p}, %{a} : !pdl.value, !pdl.attribute)'
                )
        for line in self.constraints:
            w.emit(line)
        args = [self.param_of_arg[i] for i in range(len(t.params))]
        root = self.op_name[hash(t.root)]
        call_args = ", ".join(["%op", *(f"%{a}" for a in args), f"%{root}"])
        call_types = ", ".join(["!pdl.attribute", *("!pdl.value" for _ in args), "!pdl.operation"])
        w.emit(f"pdl.rewrite %{root} {{")
        w.emit(f'  %op = pdl.attribute = "{op}"')
        w.emit(f'  pdl.apply_native_rewrite "pdlkit_call"({call_args} : {call_types})')
        w.emit("}")
        return [f"pdl.pattern @{name} : benefit({benefit}) {{", *w.lines, "}"]


def _header(t: _Traced, op: str, source: str, variants: int) -> list[str]:
    def chain(o: Any) -> str:
        return str(o.name).removeprefix("torch.aten.")

    args = ", ".join(_ident(p) for p in t.params)
    shown = ", ".join(
        f"{p}: {short_name(x.dtype)}{list(x.shape)}"
        if isinstance(x, torch.Tensor)
        else f"{p}: {type(x).__name__}"
        for p, x in zip(t.params, t.example_inputs, strict=True)
    )
    lines = [
        f"// {' -> '.join(chain(o) for o in t.body)}   ->   pdlkit_call({op!r}, {args})",
        f"// Generated by pdlkit gen-pattern from {source or t.fn.__qualname__}({shown}).",
    ]
    if t.canonical:
        rules = ", ".join(f"{k} x{n}" for k, n in t.canonical.items())
        lines += [
            f"// Written in the canonical form the pass matches ({rules}; matcher/canonicalize.py):",
            "// mm / addmm / matmul whose right operand is a weight (a parameter or graph input)",
            "// become linear; a product of two computed activations stays mm and does not match.",
        ]
    if variants > 1:
        lines.append(
            f"// {variants} patterns: every order of the operands of commutative ops (--commutative)."
        )
    return lines


def pattern_from_function(
    fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    *,
    op: str,
    name: str | None = None,
    benefit: int = 1,
    source: str = "",
    commutative: bool = False,
    max_variants: int = 8,
) -> str:
    """The PDL text of a pattern that matches ``fn``'s computation and calls logical op ``op``.

    ``example_inputs`` hold one value per parameter of ``fn``: a tensor (its dtype becomes a
    constraint; its shape only guides the trace) or a Python scalar, for an argument that is
    a constant in the model's graph (a quantization scale, a zero point): the pattern then
    requires a constant there (``is_constant``) and passes it on. ``source`` is noted in
    the header.

    The function is seen exactly as the pass sees a model (:func:`trace`), and the pattern
    is checked to substitute on that graph before it is returned. Patterns match operand
    order as written: ``x * sigmoid(x)`` does not match ``sigmoid(x) * x``. With
    ``commutative=True`` the text holds one pattern per order of the operands of each
    ``mul`` / ``add`` / ``maximum`` / ``minimum`` (at most ``max_variants``; the others are
    named ``<name>_swapped_<k>``).
    """
    t = _prepare(fn, example_inputs)
    pname = _ident(name or fn.__name__)
    base = _Emitter(t).pattern(op, pname, benefit)
    bodies = [base]
    if commutative:
        import itertools

        spots = t.commutative()
        subsets = itertools.chain.from_iterable(
            itertools.combinations(spots, r) for r in range(1, len(spots) + 1)
        )
        for k, subset in enumerate(itertools.islice(subsets, max_variants - 1), start=1):
            bodies.append(
                _Emitter(t, frozenset(subset)).pattern(op, f"{pname}_swapped_{k}", benefit)
            )
    text = "\n".join([*_header(t, op, source, len(bodies)), *(ln for b in bodies for ln in b), ""])
    _check_matches_itself(t, text, pname, op)
    return text


def _probe(t: _Traced, op: str) -> Any:
    """A kernel declaration for ``op`` with ``fn``'s parameters (typed from the examples)
    and ``fn`` as its meta function: enough for the matcher to substitute, never run."""

    def probe(*args: Any) -> Any:
        raise AssertionError("gen-pattern's probe kernel is never called")

    kinds = {bool: bool, int: int, float: float, str: str}
    probe.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                _ident(p),
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=kinds.get(type(x), torch.Tensor),
            )
            for p, x in zip(t.params, t.example_inputs, strict=True)
        ],
        return_annotation=torch.Tensor,
    )
    return declare(
        probe, op=op, meta=t.fn, name="gen_pattern_probe", source="gen-pattern", digest="-"
    )


def _check_matches_itself(t: _Traced, text: str, name: str, op: str) -> None:
    """The first pattern must substitute on the graph it was written from: the guarantee
    that it names what the pass will meet (a failure is pdlkit's bug, and says so)."""
    import tempfile

    from pdlkit.matcher.substitute import substitute

    gm = trace(t.fn, [t.scalars.get(p, x) for p, x in zip(t.params, t.example_inputs, strict=True)])
    registry = KernelRegistry()
    registry.add(_probe(t, op))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "self_check.pdl.mlir"
        path.write_text(text)
        outcome = substitute(gm, load_patterns([path]), registry, host(), rewrite_fx=False)
    if not any(r.pattern.name == name for r in outcome.records):
        misses = "; ".join(m.reason for m in outcome.report.near_misses if m.pattern == name)
        raise GenPatternError(
            f"the pattern written for {t.fn.__name__} does not substitute on {t.fn.__name__} "
            f"itself ({misses or outcome.report.silent.get(name, 'no match')}); "
            "this is a pdlkit bug: please report it with the function"
        )
