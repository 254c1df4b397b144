"""Capturing a model for PT2E with the input shapes it will be called with.

``torch.export`` specialises on the example's shapes unless told which dims vary; a
quantized model called with another batch or sequence length then fails a guard. With
``dynamic_shapes="auto"`` (``quantize``'s default) every dim of every tensor input is
``Dim.AUTO``: export keeps dynamic what the model lets vary (batch, sequence, image size)
and fixes what it pins (hidden sizes, channels). Export fixes a dim of size 1 to 1, so an
example whose inputs all have a batch of one is captured with the batch repeated twice
(export only traces it; calibration runs the example as given), and as given where that
fails.
Where export cannot capture the model with dynamic dims, it is captured for the example's
shapes, with a warning saying so.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


def _auto(example_inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    from torch.export import Dim

    return tuple(
        {i: Dim.AUTO for i in range(x.dim())} if isinstance(x, torch.Tensor) and x.dim() else None
        for x in example_inputs
    )


def _attempts(example_inputs: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The examples to capture with, in order: a batch of one repeated twice first (a dim
    of size 1 would stay 1), then the examples as given."""
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor) and x.dim()]
    if tensors and all(x.shape[0] == 1 for x in tensors):
        doubled = tuple(
            torch.cat([x, x]) if isinstance(x, torch.Tensor) and x.dim() else x
            for x in example_inputs
        )
        return [doubled, example_inputs]
    return [example_inputs]


def capture(
    model: torch.nn.Module, example_inputs: tuple[Any, ...], dynamic_shapes: Any
) -> torch.fx.GraphModule:
    """``torch.export.export(model, example_inputs, ...).module()`` with ``dynamic_shapes`` as
    ``quantize`` takes it: ``"auto"``, None (the example's shapes only) or export's own form.

    With ``"auto"`` the module's input checks (``_guards_fn``) are left out: they hold the
    ranges export assumed (a dynamic dim is at least 2), not the model's, and a batch of one
    would fail them under Dynamo; an input the model cannot take fails in its own ops."""
    if isinstance(dynamic_shapes, str) and dynamic_shapes != "auto":
        raise ValueError(
            f"dynamic_shapes must be 'auto', None or torch.export's form, got {dynamic_shapes!r}"
        )
    if dynamic_shapes != "auto":
        return _export(model, example_inputs, dynamic_shapes=dynamic_shapes).module()
    error: Exception | None = None
    for examples in _attempts(example_inputs):
        try:
            gm = _export(model, examples, dynamic_shapes=_auto(examples)).module()
        except Exception as e:  # torch.export's own errors have no common base class
            error = e
            continue
        _drop_input_checks(gm)
        return gm
    assert error is not None
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    warnings.warn(
        "pdlkit.quantization.quantize: the model could not be captured with dynamic input "
        f"shapes ({type(error).__name__}: {first}); it is captured for the example's shapes "
        "and accepts only those (pass dynamic_shapes=... in torch.export's form to choose)",
        stacklevel=3,
    )
    return _export(model, example_inputs).module()


def _drop_input_checks(gm: torch.fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()


def _export(model: torch.nn.Module, example_inputs: tuple[Any, ...], **kw: Any) -> Any:
    """``torch.export.export``, strict where the non-strict graph lacks ``source_fn_stack``:
    torch 2.11's non-strict export leaves it out, and X86InductorQuantizer then annotates no
    GEMM at all (seen on bert-mini: 0 of 25 linears int8), with no error."""
    ep = torch.export.export(model, example_inputs, **kw)
    gemms = [n for n in ep.graph.nodes if n.target in _GEMMS]
    if gemms and not any("source_fn_stack" in n.meta for n in gemms) and not _found(ep):
        ep = torch.export.export(model, example_inputs, strict=True, **kw)
    return ep


def _found(ep: Any) -> bool:
    """The quantizer finds the GEMMs of this graph (torch 2.13's partitioner falls back to
    ``nn_module_stack`` where ``source_fn_stack`` is missing; then no second export)."""
    from torch.fx.passes.utils.source_matcher_utils import get_source_partitions

    sources = [torch.nn.Linear, torch.nn.functional.linear, torch.nn.Conv2d]
    return any(get_source_partitions(ep.graph, sources).values())


_GEMMS = {torch.ops.aten.linear.default, torch.ops.aten.conv2d.default}


def describe_dynamic(gm: torch.fx.GraphModule) -> str:
    """``"input 0 dims 0, 1"``: the dims of the graph's inputs that stay dynamic ('' = none)."""
    parts = []
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(inputs):
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        dims = [str(d) for d, size in enumerate(val.shape) if not isinstance(size, int)]
        if dims:
            parts.append(f"input {i} dim{'s' if len(dims) > 1 else ''} {', '.join(dims)}")
    return "; ".join(parts)
