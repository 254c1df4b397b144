"""The 50-pattern folder of compile_overhead.py's synthetic model: the two shipped CPU
patterns that can match, and 48 generated ones that fail on native constraints.

Imported by benchmarks/compile_overhead.py (run by path: this folder is on ``sys.path``).
"""

from __future__ import annotations

from pathlib import Path

_FAILING = {
    # name prefix: (operands, ops as "aten_op(args)", native constraints as "name(values; attributes)",
    # the call the rewrite makes) -- what makes it fail is its constraint
    "linear_gelu_rank5": (
        "x w b approximate",
        ["linear(x, w, b)", "gelu(linear, approximate)"],
        ["has_rank(x; 5)"],
        "never_linear_gelu(x, w, b)",
    ),
    "linear_relu_dim7": (
        "x w b",
        ["linear(x, w, b)", "relu(linear)"],
        ["dim_equals(w; 0, 7)"],
        "never_linear_relu(x, w, b)",
    ),
    "add_rank5": (
        "a b alpha",
        ["add.Tensor(a, b, alpha)"],
        ["is_float_tensor(a)", "has_rank(a; 5)"],
        "never_add(a, b)",
    ),
    "mul_f64": ("a b", ["mul.Tensor(a, b)"], ['has_dtype(a; "float64")'], "never_mul(a, b)"),
    "layer_norm_rank5": (
        "x shape w b eps cudnn",
        ["layer_norm(x, shape, w, b, eps, cudnn)"],
        ["is_constant(eps)", "has_rank(x; 5)"],
        "never_layer_norm(x, w, b, eps)",
    ),
    "add_layer_norm_k7": (
        "a b alpha shape w bias eps cudnn",
        ["add.Tensor(a, b, alpha)", "layer_norm(add, shape, w, bias, eps, cudnn)"],
        ["single_use(add)", "dim_divisible_by(a; -1, 7)"],
        "never_add_layer_norm(a, b, w, bias, eps)",
    ),
    "linear_add_bf16": (
        "x w b r alpha",
        ["linear(x, w, b)", "add.Tensor(linear, r, alpha)"],
        ['has_dtype(x; "bf16")'],
        "never_linear_add(x, w, b, r)",
    ),
    "sigmoid_mul_f16": (
        "x",
        ["sigmoid(x)", "mul.Tensor(sigmoid, x)"],
        ['has_dtype(x; "f16")'],
        "never_silu(x)",
    ),
}


def _call(spec: str) -> tuple[str, list[str], list[str]]:
    """``"name(a, b; 1, 2)"`` -> name, value arguments, attribute arguments."""
    name, _, args = spec.rstrip(")").partition("(")
    values, _, attrs = args.partition(";")
    return (
        name,
        values.replace(",", " ").split(),
        [a.strip() for a in attrs.split(",") if a.strip()],
    )


def _kinds(*groups: tuple[int, str]) -> str:
    return ", ".join(f"!pdl.{kind}" for n, kind in groups for _ in range(n))


def pattern_body(operands: str, ops: list[str], constraints: list[str], call: str) -> str:
    """A failing pattern's body: each op an operation of type %t named after it (an argument
    naming an earlier op reads its result 0), its constraints, the rewrite of the last op."""
    lines = [f"  %{n} = pdl.operand" for n in operands.split()] + ["  %t = pdl.type"]
    produced: set[str] = set()
    read: set[str] = set()

    def values(names: list[str]) -> list[str]:
        for n in names:
            if n in produced and n not in read:
                lines.append(f"  %{n}_0 = pdl.result 0 of %{n}")
                read.add(n)
        return [f"%{n}_0" if n in produced else f"%{n}" for n in names]

    for op in ops:
        name, args, _ = _call(op)
        var, vals = name.split(".")[0], values(args)
        sig = f"{', '.join(vals)} : {_kinds((len(vals), 'value'))}"
        lines.append(f'  %{var} = pdl.operation "torch.aten.{name}"({sig}) -> (%t : !pdl.type)')
        produced.add(var)
    for i, constraint in enumerate(constraints):
        name, args, attrs = _call(constraint)
        vals = values(args) + [f"%c{i}_{j}" for j in range(len(attrs))]
        lines += [f"  %c{i}_{j} = pdl.attribute = {a}" for j, a in enumerate(attrs)]
        kinds = _kinds((len(args), "value"), (len(attrs), "attribute"))
        lines.append(f'  pdl.apply_native_constraint "{name}"({", ".join(vals)} : {kinds})')
    op, args, _ = _call(call)
    root = var
    kinds = _kinds((1, "attribute"), (len(args), "value"), (1, "operation"))
    lines += [
        f"  pdl.rewrite %{root} {{",
        f'    %op = pdl.attribute = "{op}"',
        f'    pdl.apply_native_rewrite "pdlkit_call"(%op, {", ".join("%" + a for a in args)}, %{root} : {kinds})',
        "  }",
    ]
    return "\n" + "\n".join(lines)


def write_patterns(folder: Path, shipped: Path, total: int = 50) -> list[str]:
    """``total`` pattern files: the two shipped (matchable) ones, then failing ones, benefit 3.

    Failing patterns get the higher benefit so they run first, on the whole graph, before
    the matchable ones shrink it.
    """
    names = []
    for src in sorted(shipped.glob("cpu/*.pdl.mlir")):
        (folder / src.name).write_text(src.read_text())
        names.append(src.name)
    kinds = [(kind, pattern_body(*spec)) for kind, spec in _FAILING.items()]
    i = 0
    while len(names) < total:
        kind, body = kinds[i % len(kinds)]
        name = f"{kind}_{i:02d}"
        (folder / f"{name}.pdl.mlir").write_text(
            f"// fails on purpose ({kind})\npdl.pattern @{name} : benefit(3) {{{body}\n}}\n"
        )
        names.append(f"{name}.pdl.mlir")
        i += 1
    return names
