"""The exported graph in the form torchao's X86InductorQuantizer annotates.

Passes between ``torch.export`` and ``prepare_pt2e``, each exact (the numbers of the FP32
model do not change):

* **dead code**: outputs nobody reads (a ``BertModel`` wrapper returning only
  ``last_hidden_state`` leaves the pooler dead) are removed; the quantizer fails on them
  (``IndexError`` in ``_get_output_nodes_of_partitions``).
* **in-place ops** (``relu_``, ``add_``: ``nn.ReLU(inplace=True)``, ``out += identity`` in a
  ResNet block) become their functional forms where the mutated value has no other reader;
  the quantizer's convolution patterns fail on them ("Input partition has more than one
  output node").
* **a module called twice** (ResNet's one ``self.relu``) gets a source partition per call
  (:func:`split_reused_modules`), for the same reason.
* **GEMMs as linear**: ``addmm`` / ``mm`` / ``matmul`` with a weight operand (GPT-2's
  ``Conv1D``: ``addmm(b, x, w)`` with ``w`` of shape ``[in, out]``) become ``aten.linear``
  through pdlkit's own canonicalization (only its exact rewrites are kept); a weight given
  pre-transposed becomes a parameter of shape ``[out, in]``. Before::

      addmm = aten.addmm(c_attn_bias, view, c_attn_weight)          # not annotated: FP32

  after::

      linear = aten.linear(x, c_attn_weight_pdlkit_t, c_attn_bias)  # annotated: int8
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten


def remove_dead_code(gm: fx.GraphModule) -> int:
    """Erase nodes whose results nobody reads; returns how many."""
    before = len(gm.graph.nodes)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return before - len(gm.graph.nodes)


def _functional(op: Any) -> Any:
    """``aten.relu_.default`` -> ``aten.relu.default`` (None when there is no such op)."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    name = op._schema.name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(aten, name[:-1], None)
    return getattr(packet, op._overloadname, None) if packet is not None else None


def _aliases(node: fx.Node) -> bool:
    """The node's result may share memory with another value (a view, or not an ATen op)."""
    schema = getattr(node.target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def functionalize_inplace(gm: fx.GraphModule) -> int:
    """``relu_(x)`` -> ``relu(x)`` where ``x`` is read by nothing else; returns how many."""
    done = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not node.args:
            continue
        functional = _functional(node.target)
        mutated = node.args[0]
        if functional is None or not isinstance(mutated, fx.Node):
            continue
        if mutated.op != "call_function" or len(mutated.users) != 1 or _aliases(mutated):
            continue  # an input, a parameter, a view or a value read again after the mutation
        node.target = functional
        done += 1
    if done:
        gm.recompile()
    return done


def gemms_as_linear(gm: fx.GraphModule) -> int:
    """``addmm`` / ``mm`` / ``matmul`` with a weight operand -> ``aten.linear`` with an
    ``[out, in]`` parameter; returns how many GEMMs were rewritten."""
    from pdlkit.matcher.canonicalize import canonicalize, restore

    fired = canonicalize(gm)
    restore(gm)  # only the exact rewrites stay: the FP32 model computes the same numbers
    n = sum(fired.get(rule, 0) for rule in ("addmm", "mm", "matmul"))
    if n:
        _materialize_transposed_weights(gm)
        _as_functional_linear_source(gm)
    return n


def _as_functional_linear_source(gm: fx.GraphModule) -> None:
    """The quantizer finds linears by the source they were traced from (``nn.Linear`` or
    ``F.linear``); a linear made from an ``addmm`` gets ``F.linear`` as its source."""
    sources = (torch.nn.Linear, torch.nn.functional.linear)
    for node in gm.graph.nodes:
        if node.target is not aten.linear.default:
            continue
        stack = node.meta.get("source_fn_stack") or []
        if not stack or stack[-1][1] not in sources:
            node.meta["source_fn_stack"] = [*stack, (node.name, torch.nn.functional.linear)]


def _materialize_transposed_weights(gm: fx.GraphModule) -> None:
    """``linear(x, t(w), b)`` with ``w`` a parameter -> ``linear(x, w_t, b)`` with ``w_t`` a
    new parameter holding ``w.t()`` (the quantizer observes a parameter, not a view)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.target is not aten.linear.default:
            continue
        t = node.args[1]
        if not (isinstance(t, fx.Node) and t.target is aten.t.default):
            continue
        src = t.args[0]
        if not (isinstance(src, fx.Node) and src.op == "get_attr"):
            continue
        weight = _get_attr(gm, str(src.target))
        name = str(src.target).replace(".", "_") + "_pdlkit_t"
        if not hasattr(gm, name):
            param = torch.nn.Parameter(weight.detach().t().contiguous(), requires_grad=False)
            gm.register_parameter(name, param)
        with graph.inserting_before(node):
            attr = graph.get_attr(name)
        attr.meta = dict(src.meta)
        if "val" in t.meta:
            attr.meta["val"] = t.meta["val"]
        node.replace_input_with(t, attr)
    graph.eliminate_dead_code()
    _drop_unused_attrs(gm)
    gm.recompile()


def _get_attr(gm: fx.GraphModule, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _drop_unused_attrs(gm: fx.GraphModule) -> None:
    """Delete parameters no get_attr reads any more (the pre-transposed originals)."""
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_parameters()):
        if name not in used:
            owner_name, _, attr = name.rpartition(".")
            owner = gm.get_submodule(owner_name) if owner_name else gm
            delattr(owner, attr)


def split_reused_modules(gm: fx.GraphModule) -> int:
    """One source partition per call of a module called several times (ResNet's one
    ``self.relu`` after each convolution); returns how many calls were renamed.

    The quantizer groups nodes by the module they were traced from; the calls of a module
    used twice form one group with two outputs, which it refuses ("Input partition has
    more than one output node"). Each call after the first gets a name of its own."""
    groups: dict[tuple[str, Any], list[fx.Node]] = {}
    for node in gm.graph.nodes:
        key = _source(node)
        if key is not None:
            groups.setdefault(key, []).append(node)
    renamed = 0
    for (name, source), nodes in groups.items():
        for k, part in enumerate(_connected(nodes)[1:], start=1):
            for node in part:
                stack = node.meta.get("source_fn_stack") or []
                node.meta["source_fn_stack"] = [*stack[:-1], (f"{name}_call{k}", source)]
            renamed += 1
    return renamed


def _source(node: fx.Node) -> tuple[str, Any] | None:
    """``(name, module type or function)`` the quantizer groups ``node`` by: its
    ``source_fn_stack``, else (torch.export without it) its innermost module."""
    if node.op != "call_function":
        return None
    stack = node.meta.get("source_fn_stack")
    if stack:
        return (str(stack[-1][0]), stack[-1][1])
    modules = node.meta.get("nn_module_stack")
    if not modules:
        return None
    fqn, cls = list(modules.values())[-1]
    if isinstance(cls, str):  # "torch.nn.modules.activation.ReLU"
        import pydoc

        cls = pydoc.locate(cls)
    return (str(fqn), cls) if isinstance(cls, type) else None


def _connected(nodes: list[fx.Node]) -> list[list[fx.Node]]:
    """``nodes`` split into groups connected by edges among themselves, in graph order."""
    inside = set(nodes)
    group: dict[fx.Node, int] = {}
    parts: list[list[fx.Node]] = []
    for node in nodes:  # graph order: a node's inputs come first
        linked = {group[i] for i in node.all_input_nodes if i in inside}
        if not linked:
            group[node] = len(parts)
            parts.append([node])
            continue
        keep = min(linked)
        for other in sorted(linked - {keep}):  # a node joining two groups merges them
            for n in parts[other]:
                group[n] = keep
            parts[keep] += parts[other]
            parts[other] = []
        group[node] = keep
        parts[keep].append(node)
    return [p for p in parts if p]


def prepare_for_quantizer(gm: fx.GraphModule) -> dict[str, int]:
    """All passes, in place; returns how often each changed the graph."""
    return {
        "dead nodes": remove_dead_code(gm),
        "in-place ops": functionalize_inplace(gm),
        "GEMMs as linear": gemms_as_linear(gm),
        "module calls split": split_reused_modules(gm),
    }
