"""A call site's replaced subgraph: run when its kernel declines a call or a guard fails,
and compiled by Inductor when the measured choice times it (matcher/choose.py).

    spec = SubgraphSpec(bindings, nodes, outputs, n_args)   # the matcher captures it
    fallback = ReplacedSubgraph(root, spec)                 # fallback(*kernel_args)

Tiered like a JIT (see :class:`ReplacedSubgraph`).
"""

from __future__ import annotations

import copy
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from pdlkit.runtime_abi.binding import many_threads
from pdlkit.runtime_abi.triton_binding import compile_apart


class ReplacedSubgraph:
    """The replaced subgraph, run when a kernel declines a call or a guard fails.

    Tiered like a JIT: the first fallback for an input signature runs the subgraph op by op
    (most sites never fall back, or once); from the second one on it runs code compiled by
    Inductor for that signature (up to ``MAX_COMPILED`` signatures per site), unless
    kernels have run on several threads: then it keeps running op by op.
    """

    def __init__(self, root: fx.GraphModule, spec: SubgraphSpec):
        self._root, self._spec = root, spec
        self._module: fx.GraphModule | None = None
        self._seen: Counter[tuple[Any, ...]] = Counter()
        self._compiled: dict[tuple[Any, ...], Any] = {}
        self.compile_error: str = ""

    def module(self) -> fx.GraphModule:
        """The subgraph as a module of its own, run op by op."""
        if self._module is None:
            graph = self._spec.build()
            self._module = fx.GraphModule(self._root, graph, class_name="PdlkitReference")
        return self._module

    def __call__(self, *args: Any) -> Any:
        self.module()
        sig = tuple(
            (a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else repr(a)
            for a in args
        )
        fn = self._compiled.get(sig)
        if fn is not None:
            return fn(*[a for a in args if isinstance(a, torch.Tensor)])
        self._seen[sig] += 1
        if (
            self._seen[sig] >= 2
            and len(self._compiled) < MAX_COMPILED
            and not self.compile_error
            # tracing patches torch.nn.Module.__call__ process-wide: once kernels run on
            # several threads, keep interpreting (same numbers, no compile under their feet)
            and not many_threads()
        ):
            fn = self.compile(args)
            if fn is not None:
                self._compiled[sig] = fn
                return fn(*[a for a in args if isinstance(a, torch.Tensor)])
        return self.module()(*args)

    @property
    def compiled_signatures(self) -> int:
        return len(self._compiled)

    def compile(self, args: Sequence[Any], constants: Sequence[int] = ()) -> Any:
        """Inductor code for these arguments' signature, called with their tensors alone
        (non-tensor arguments become literals); None when Inductor fails (``compile_error``).

        The tensors at ``constants`` become the module's own buffers, as a model's weights
        are under Inductor's freezing (``matcher/choose.py`` times a subgraph so, since with
        freezing Inductor lowers int8 subgraphs to oneDNN); the code then takes the other
        tensors alone."""
        gm = copy.deepcopy(self.module())
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, (ph, a) in enumerate(zip(placeholders, args, strict=True)):
            if isinstance(a, torch.Tensor) and i not in constants:
                continue
            value: Any = a
            if isinstance(a, torch.Tensor):
                gm.register_buffer(f"_pdlkit_constant{i}", a)
                with gm.graph.inserting_before(ph):
                    value = gm.graph.get_attr(f"_pdlkit_constant{i}")
                    value.meta = dict(ph.meta)
            for user in list(ph.users):
                user.args = fx.map_arg(user.args, lambda n, ph=ph, v=value: v if n is ph else n)  # type: ignore[misc]
                user.kwargs = fx.map_arg(user.kwargs, lambda n, ph=ph, v=value: v if n is ph else n)  # type: ignore[misc]
            gm.graph.erase_node(ph)
        gm.recompile()
        inputs = [
            a for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in constants
        ]
        try:
            return compile_apart(gm, inputs)
        except Exception as e:  # keep interpreting: slower, still the right numbers
            self.compile_error = f"{type(e).__name__}: {e}"
            return None


MAX_COMPILED = 8


@dataclass(frozen=True)
class SubgraphSpec:
    """What it takes to rebuild a replaced subgraph later, captured before the FX edit:
    argument bindings, and each node's op, target, args and kwargs (immutable tuples that
    still name the original nodes after those are erased from the graph)."""

    bindings: tuple[tuple[int, int | None, fx.Node], ...]  # (arg index, list index, node)
    nodes: tuple[tuple[fx.Node, str, Any, tuple[Any, ...], dict[str, Any]], ...]
    outputs: tuple[fx.Node, ...]
    n_args: int

    def build(self) -> fx.Graph:
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        phs = [g.placeholder(f"arg{i}") for i in range(self.n_args)]
        for i, j, node in self.bindings:
            env[node] = phs[i] if j is None else g.call_function(operator.getitem, (phs[i], j))
        for node, op, target, args, kwargs in self.nodes:
            new = g.create_node(
                op, target, fx.map_arg(args, env.__getitem__), fx.map_arg(kwargs, env.__getitem__)
            )
            new.meta = node.meta
            env[node] = new
        outs = [env.get(o, o) for o in self.outputs]
        g.output(outs[0] if len(outs) == 1 else tuple(outs))
        return g
