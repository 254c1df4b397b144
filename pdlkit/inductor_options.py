"""Inductor's own options through the pdlkit backend: ``mode=``, Inductor config keys, CUDA graphs.

    before: ``torch.compile(model, backend="pdlkit", mode="reduce-overhead")`` compiled without
            CUDA graphs (the backend dropped the mode), ``options={"triton.cudagraphs": True}``
            was refused as an unknown pdlkit option, and ``pdlkit.optimize`` had no way to ask
            for either; a kernel that is not safe to capture could be captured all the same
    after:  the mode's Inductor settings (``torch._inductor.list_mode_options``) and any
            Inductor config key given in ``options`` (or ``optimize(inductor_config=...)``)
            reach every ``compile_fx`` call the backend makes, including the whole-graph
            timing; where the compiled graph will be captured in a CUDA graph, only kernels
            declared ``graph_capture_safe`` are eligible, and each one refused is a near miss
            in ``explain`` saying so (its site keeps the replaced subgraph, compiled by Inductor)

Inductor's static launcher for user-defined Triton kernels
(``static_launch_user_defined_triton_kernels``, off in torch 2.11 to 2.13) is turned on when
pdlkit's backend is imported (:func:`launch_user_kernels_statically`), unless the environment
variable ``TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS`` is already set (``0``
keeps Triton's launcher). pdlkit's CUDA kernels are user-defined Triton kernels in Inductor's
code. On an H200 (torch 2.11, Triton 3.6) the int8 Llama-3 decode step of one sequence took
1.30x BF16 Inductor's host time with the static launcher, 1.45x with Triton's, in two processes
measured alike; per launch pdlkit's kernels stayed 1.1-1.6x Inductor's own in both, so the gain
is not settled beyond the host's noise (benchmarks/results/cuda_step_host_llama3-gqa_launch.md).
Set through ``options=`` /
``inductor_config=`` alone the key does not take effect (Inductor decides per kernel in its
compile workers, which read the environment variable when they start and are sent only
``use_static_triton_launcher``), hence the variable, set before the workers start: a process
that compiled with Inductor before importing pdlkit keeps Triton's launcher for kernels its
running workers compile. Kernels the static launcher cannot run (launch attributes, a stored
cubin) keep Triton's launcher; Inductor decides that per kernel.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pdlkit.matcher.graph_buckets import dynamic_dims

CAPTURE_TRAIT = "graph_capture_safe"
STATIC_LAUNCH_ENV = "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS"


def launch_user_kernels_statically() -> bool:
    """Inductor's static launcher for user-defined Triton kernels (pdlkit's CUDA kernels),
    in this process and the compile workers it starts from now on, unless
    ``STATIC_LAUNCH_ENV`` is set already (then as it says). Returns whether it is on here."""
    import torch._inductor.config as inductor_config

    if STATIC_LAUNCH_ENV not in os.environ:
        os.environ[STATIC_LAUNCH_ENV] = "1"  # read by compile workers when they start
        inductor_config.static_launch_user_defined_triton_kernels = True
    return bool(inductor_config.static_launch_user_defined_triton_kernels)


def _inductor_keys() -> set[str]:
    import torch._inductor.config as inductor_config

    return set(inductor_config.get_config_copy())


def split(
    options: Mapping[str, Any], pdlkit_keys: frozenset[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``options`` as (pdlkit's keys, Inductor config keys); a key that is neither fails,
    naming both sets' documentation."""
    ours = {k: v for k, v in options.items() if k in pdlkit_keys}
    theirs = {k: v for k, v in options.items() if k not in pdlkit_keys}
    unknown = sorted(set(theirs) - _inductor_keys())
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown}: neither a pdlkit option ({sorted(pdlkit_keys)}) nor "
            "an Inductor config key (torch._inductor.config, e.g. 'triton.cudagraphs')"
        )
    return ours, theirs


def check_mode(mode: str | None) -> None:
    """A bad ``mode`` fails where it is given, with Inductor's list of modes."""
    if mode is None:
        return
    from torch._inductor import list_mode_options

    try:
        list_mode_options(mode)
    except RuntimeError as e:
        raise ValueError(f"mode={mode!r}: {e}") from None


def patches(mode: str | None, inductor_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Inductor config patches for ``compile_fx``: the mode's, then the explicit keys."""
    out: dict[str, Any] = {}
    if mode is not None:
        from torch._inductor import list_mode_options

        out.update(list_mode_options(mode))
    out.update(inductor_config or {})
    return out


def cuda_graphs(config: Mapping[str, Any]) -> bool:
    """Whether Inductor will wrap the compiled graph in CUDA graphs (the patch, else the
    global ``torch._inductor.config.triton.cudagraphs``)."""
    import torch._inductor.config as inductor_config

    return bool(config.get("triton.cudagraphs", inductor_config.triton.cudagraphs))


def captured(
    config: Mapping[str, Any], example_inputs: Sequence[Any], models_on: str | None
) -> str:
    """Why the graph will be captured in a CUDA graph ("" if it will not): CUDA graphs are
    on and its tensors are on a GPU (or the target plans for one)."""
    if not cuda_graphs(config):
        return ""
    if not _on_gpu(example_inputs) and models_on != "cuda":
        return ""
    how = "mode / triton.cudagraphs" if "triton.cudagraphs" in config else "triton.cudagraphs"
    return f"the graph is captured in a CUDA graph ({how} is on)"


def capture_safe(registry: Any, why: str) -> Any:
    """``registry`` offering only kernels declared ``graph_capture_safe``; the others are
    passed over with ``why`` (near misses in ``explain``)."""
    from pdlkit.runtime_abi.registry import Restricted

    def refuse(k: Any) -> str | None:
        return None if CAPTURE_TRAIT in k.traits else f"not declared {CAPTURE_TRAIT}, and {why}"

    return Restricted(registry, refuse, ranked_only=True)


def dynamo_inputs_matter(capture: str, gm: Any, example_inputs: Sequence[Any]) -> bool:
    """Whether Inductor acts on what Dynamo recorded about the graph's inputs
    (:func:`keep_dynamo_inputs`): which are static, where the graph is captured in CUDA graphs
    or has GPU tensors (whose alignment Inductor checks on every call unless they are static;
    CPU tensors it never checks); and their sources, by which AOT autograd finds Dynamo's
    symbols again where Dynamo's graph has any (dynamic shapes, and the Python floats
    ``dynamic=True`` lifts to 0-d tensors read with ``.item()``: without their sources the
    read fails, "aten._local_scalar_dense"). A CPU graph of static shapes without CUDA graphs
    is left as the re-trace gives it."""
    return bool(capture) or _on_gpu(example_inputs) or _symbolic(gm)


def _symbolic(gm: Any) -> bool:
    """Whether a placeholder of Dynamo's graph is symbolic: a dynamic dim or symbolic int
    (graph_buckets.dynamic_dims), a SymFloat, or a 0-d tensor whose value Dynamo holds as a
    symbol."""
    if dynamic_dims(gm):
        return True
    for n in gm.graph.find_nodes(op="placeholder"):
        v = n.meta.get("example_value")
        if isinstance(v, torch.SymFloat) or getattr(v, "item_memo", None) is not None:
            return True
    return False


def _on_gpu(example_inputs: Sequence[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)


def keep_dynamo_inputs(dynamo_gm: Any, traced: Any) -> bool:
    """Give ``traced`` (pdlkit's re-trace of Dynamo's graph, same inputs in the same order)
    what AOT autograd reads off a Dynamo graph to tell Inductor which inputs keep their
    address: parameters, buffers, and tensors marked static (a static KV cache, through
    ``torch._dynamo.mark_static_address``). Without it Inductor's CUDA graph trees skip a
    graph that writes a KV cache in place ("mutated inputs") and copy every weight into the
    graph's own buffers before each replay; and without CUDA graphs, Inductor's code checks
    the alignment of every GPU input on each call (``copy_misaligned_inputs``: 41 inputs a
    Llama-3 decode step of two layers, where BF16 Inductor checks only its non-static ones), since
    only a static input's alignment is settled at compile time. Returns False, changing
    nothing, where the two graphs' inputs do not line up or the re-trace holds tensors of
    its own."""
    meta = getattr(dynamo_gm, "meta", {})
    if "dynamo_compile_id" not in meta or not hasattr(dynamo_gm, "_param_name_to_source"):
        return False
    theirs = [n for n in dynamo_gm.graph.nodes if n.op == "placeholder"]
    ours = [n for n in traced.graph.nodes if n.op == "placeholder"]
    own = [name for name, _ in traced.named_parameters()] + [n for n, _ in traced.named_buffers()]
    if len(theirs) != len(ours) or any(n not in dynamo_gm._param_name_to_source for n in own):
        return False
    traced.meta["dynamo_compile_id"] = meta["dynamo_compile_id"]
    traced._param_name_to_source = dynamo_gm._param_name_to_source
    for src, dst in zip(theirs, ours, strict=True):
        if hasattr(src, "_dynamo_source"):
            dst._dynamo_source = src._dynamo_source
        if "tensor_dict" in src.meta:
            dst.meta["tensor_dict"] = src.meta["tensor_dict"]
    return True


def lower_as_fallbacks(gm: torch.fx.GraphModule) -> None:
    """Give every ``torch.ops.pdlkit`` op in ``gm`` Inductor's fallback lowering before Inductor
    meets it, as its implicit fallback would (the layout constraint the op's tags ask for, else
    Inductor's default for custom ops), once per op and process.

        before: the first call of each pdlkit op in a graph went through Inductor's implicit
                fallback, whose log line formats every argument's IR (torch 2.11 does so with
                logging off): on a Xeon with AMX, BERT-base int8, an op first met in a late
                layer (the whole-graph check's kernels-only graph) spent minutes in ``ir.__str__``
        after:  the lowering is there; Inductor emits the same extern call without the line
    """
    from torch._inductor import lowering

    tag_of = getattr(torch._library.utils, "get_layout_constraint_tag", None)
    constraint_of = getattr(lowering, "tag_to_layout_constraint", None)
    for n in gm.graph.nodes:
        op = n.target
        if not (
            n.op == "call_function"
            and isinstance(op, torch._ops.OpOverload)
            and op.namespace == "pdlkit"
            and op not in lowering.lowerings
        ):
            continue
        layout = None
        if tag_of is not None and constraint_of is not None:
            layout = constraint_of(tag_of(op, with_default=True))
        lowering.make_fallback(op, layout_constraint=layout)


def compile_substituted(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], patches: Any
) -> Any:
    """Inductor's code for a graph that may call pdlkit ops: :func:`lower_as_fallbacks`, then
    ``compile_fx`` with the compilation's Inductor options (``patches``)."""
    from torch._inductor.compile_fx import compile_fx

    lower_as_fallbacks(gm)
    return compile_fx(gm, example_inputs, config_patches=patches)
