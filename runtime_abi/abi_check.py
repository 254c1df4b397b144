"""``pdlkit abi-check``: check kernels against their declaration and their op's reference.

For every kernel found (Python module or native library): the declaration loads;
``torch.library.opcheck`` passes on an example; on every example input the kernel
accepts (its dtypes, shape rules and ISA), its output matches the reference of its logical
op within the dtype's tolerance, its inputs are left unchanged, and its output matches
its meta function. Kernels for another ISA than the host's are skipped, saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pdlkit.runtime_abi.binding import _as_list, _meta_of, bind
from pdlkit.runtime_abi.capability import Target, host
from pdlkit.runtime_abi.kernel import KernelDecl, KernelUnsupported
from pdlkit.runtime_abi.ops import LogicalOp
from pdlkit.runtime_abi.walk import load_paths

# (rtol, atol): GEMM-sized accumulations in fp32 differ in the last bits between BLAS paths
_TOL = {
    torch.float32: (1e-4, 1e-4),
    torch.float64: (1e-9, 1e-9),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (1e-2, 1e-2),
    # quantized outputs: within one quantization step of the reference (rounding of the
    # fp32 accumulation may differ by one)
    torch.uint8: (0.0, 1.0),
    torch.int8: (0.0, 1.0),
}


@dataclass
class Row:
    kernel: str
    check: str
    result: str  # PASS, FAIL, SKIP
    detail: str = ""


def _dtypes_of(decl: KernelDecl) -> list[torch.dtype | None]:
    for p in decl.params:
        if p in decl.dtypes:
            return list(decl.dtypes[p])
    return [None]  # no dtype declared: the examples' default


def _accepts(decl: KernelDecl, args: Sequence[Any]) -> bool:
    for name, a in zip(decl.params, args, strict=False):
        if isinstance(a, torch.Tensor):
            allowed = decl.dtypes.get(name)
            if allowed is not None and a.dtype not in allowed:
                return False
            rule = decl.shapes.get(name)
            if rule is not None and rule.violation(a):
                return False
    return True


def check_kernel(
    decl: KernelDecl, target: Target | None = None, the_op: LogicalOp | None = None
) -> list[Row]:
    """The rows of one kernel: declaration, then per dtype opcheck and the comparison with its
    op's reference (the kernel's own, or ``the_op``'s for a kernel declared with ``op=``)."""
    target = target or host()
    rows = [Row(decl.name, "declaration", "PASS", f"v{decl.version} op={decl.op} {decl.source}")]
    missing = decl.requires - target.features
    if missing or decl.device not in target.devices:
        why = f"host lacks {', '.join(sorted(missing))}" if missing else f"no {decl.device} device"
        rows.append(Row(decl.name, "run", "SKIP", why))
        return rows
    reference = decl.reference or (the_op.reference if the_op else None)
    examples = decl.examples or (the_op.examples if the_op else None)
    if reference is None or examples is None:
        why = f"no reference for op {decl.op!r}: declare the op with @pdlkit.op"
        return [*rows, Row(decl.name, "reference", "FAIL", why)]
    op = bind(decl)
    for dtype in _dtypes_of(decl):
        label = str(dtype).removeprefix("torch.") if dtype is not None else "default"
        samples = [s for s in examples(dtype or torch.float32) if _accepts(decl, s)]
        if not samples:
            why = "no example input within the declared constraints"
            rows.append(Row(decl.name, label, "FAIL", why))
            continue
        on_device = [_to(s, decl.device) for s in samples]  # references run on the CPU copies
        rows.append(_opcheck(decl, op, on_device, label))
        rows.append(_compare(decl, op, reference, samples, on_device, label))
    return rows


def _opcheck(decl: KernelDecl, op: Any, samples: list[tuple[Any, ...]], label: str) -> Row:
    """``torch.library.opcheck`` on the first example the kernel runs; a kernel that declines
    every example (``KernelUnsupported``) fails with its last reason: nothing was checked."""
    args, declined = _first_accepted(op, samples)
    if args is None:
        why = f"declines every example input of op {decl.op!r} (the last: {declined}); "
        why += "give the op an example the kernel accepts"
        return Row(decl.name, f"opcheck {label}", "FAIL", why)
    try:
        torch.library.opcheck(op, (*args, 0))
    except Exception as e:
        return Row(
            decl.name, f"opcheck {label}", "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0]}"
        )
    return Row(decl.name, f"opcheck {label}", "PASS")


def _to(args: tuple[Any, ...], device: str) -> tuple[Any, ...]:
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def _first_accepted(op: Any, samples: list[tuple[Any, ...]]) -> tuple[tuple[Any, ...] | None, str]:
    """The first example the kernel does not decline (opcheck needs a call that runs), or
    None and the last reason it gave for declining."""
    declined = ""
    for args in samples:
        try:
            op(*args, 0)
        except KernelUnsupported as e:
            declined = str(e).splitlines()[0] if str(e) else "KernelUnsupported"
            continue
        except Exception:
            return args, ""  # let opcheck report it
        return args, ""
    return None, declined


def _compare(
    decl: KernelDecl,
    op: Any,
    reference: Any,
    cpu_samples: list[tuple[Any, ...]],
    samples: list[tuple[Any, ...]],
    label: str,
) -> Row:
    def row(result: str, detail: str) -> Row:
        return Row(decl.name, f"reference {label}", result, detail)

    worst, declined = 0.0, 0
    for cpu_args, args in zip(cpu_samples, samples, strict=True):
        before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        shape = "x".join(
            "x".join(map(str, a.shape)) for a in args[:1] if isinstance(a, torch.Tensor)
        )
        try:
            out = _as_list(op(*args, 0))
        except KernelUnsupported:
            declined += 1
            continue
        except Exception as e:
            return row("FAIL", f"raised on {shape}: {e}")
        for a, b in zip(args, before, strict=True):
            if isinstance(a, torch.Tensor) and not torch.equal(a, b):
                return row("FAIL", f"modified its input on {shape}")
        if [(tuple(t.shape), t.dtype) for t in out] != _meta_of(decl, args):
            return row("FAIL", f"output disagrees with meta on {shape}")
        try:
            want = _as_list(reference(*cpu_args))
        except ImportError as e:  # e.g. PT2E references need torchao
            return row("SKIP", f"the reference needs {e.name}")
        except Exception as e:
            return row("FAIL", f"the reference raised on {shape}: {e}")
        out = [o.cpu() for o in out]
        for o, w in zip(out, want, strict=True):
            rtol, atol = _TOL.get(w.dtype, (0.0, 0.0))
            if not torch.allclose(o.double(), w.double(), rtol=rtol, atol=atol):
                err = (o.double() - w.double()).abs().max().item()
                return row("FAIL", f"max abs error {err:.3g} on {shape} (rtol {rtol}, atol {atol})")
            if w.numel():
                worst = max(worst, (o.double() - w.double()).abs().max().item())
    note = f"{len(samples) - declined}/{len(samples)} inputs, max abs error {worst:.2g}"
    if declined:
        note += f", {declined} declined (fallback)"
    return row("PASS", note)


def check_paths(paths: Sequence[Path], target: Target | None = None) -> list[Row]:
    """abi-check every kernel file under ``paths``; ops come from those files and from the
    configured kernel folders (:func:`pdlkit.runtime_abi.walk.load_paths`)."""
    walked = load_paths(paths)
    rows = [Row(f.name, "declaration", "FAIL", msg) for f, msg in walked.problems]
    for d in walked.given:
        rows.extend(check_kernel(d, target, walked.registry.op(d.op)))
    return rows


def format_rows(rows: Sequence[Row]) -> str:
    if not rows:
        return "no kernels found"
    w = [max(len(getattr(r, c)) for r in rows) for c in ("kernel", "check", "result")]
    return "\n".join(
        f"{r.kernel:<{w[0]}}  {r.check:<{w[1]}}  {r.result:<{w[2]}}  {r.detail}".rstrip()
        for r in rows
    )
