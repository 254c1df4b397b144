"""A replaced subgraph as Inductor lowers it on the CPU, timed without compiling it.

    before: "keep the subgraph" was timed by compiling the site's subgraph with Inductor
            (with frozen weights under freezing): 0.1-1 s of Inductor per site, 6-7 s of a
            bert-mini int8 compile on a Xeon with AMX
    after:  the subgraph runs with the library calls Inductor would make for it, the rest
            of its ops eagerly (:func:`as_inductor_lowers`); no Inductor compile
            (``PDLKIT_AUTOTUNE_SUBGRAPH=compile`` times Inductor's code as before)

What Inductor calls for a subgraph on the CPU, and so what the proxy calls:

* FP32 / BF16: ``aten.linear`` becomes an extern ``addmm`` / ``mm`` (with freezing, oneDNN's
  packed linear), as eager ``aten.linear`` calls; pointwise ops around it are fused C++ loops.
* int8 (PT2E) under ``torch._inductor.config.freezing``: Inductor's freezing passes
  (``torch/_inductor/fx_passes/quantization.py``: ``_register_qlinear_weight_prepack_pass``,
  ``_register_qlinear_unary_fusion``, ``_register_qlinear_binary_fusion``) turn
  ``dequantize_per_tensor(x) -> linear(., dequantize_per_channel(w), b)`` into
  ``onednn.qlinear_pointwise`` on the int8 activation with a weight packed once by
  ``onednn.qlinear_prepack``, folding a following ``gelu`` / ``relu``, ``add`` (binary post-op)
  and ``quantize_per_tensor`` (int8 output) into the call. The proxy makes the same rewrite
  (:func:`as_inductor_lowers`), with the weight packed outside the timing.

The proxy's time is compared with the kernels through two bounds (:func:`bounds`): its library
calls alone (Inductor's code runs these and more: a lower bound) and the whole proxy run
eagerly (Inductor fuses the remaining pointwise ops into fewer, faster loops: about an upper
bound; not on the AVX-512 EPYC at 2 threads, where the eager run read 0.73-0.93x the compiled
subgraph's time at int8 sites and 0.81-1.03x at FP32 ones, and sites kept subgraphs a kernel
beat by 19-35% as compiled: the whole-graph check's kernels-only graph then took the kernels,
``results/x86_subgraph_proxy_epyc_avx512_t2_*.md``). ``benchmarks/x86_subgraph_proxy.py``
prints the proxy next to the compiled subgraph for every site of a model, on this host.
:func:`swept` runs the library calls of the substituted sites one after another, as the graph
runs them: the least Inductor's whole graph takes there (matcher/graph_guard.py's BELIEVABLE).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from pdlkit.runtime_abi.binding_stats import uncounted

aten = torch.ops.aten
# ops Inductor leaves to a library on the CPU (extern kernels): the subgraph costs at least these
EXTERN = {
    aten.linear.default, aten.addmm.default, aten.mm.default, aten.bmm.default,
    aten.baddbmm.default, aten.matmul.default, aten._int_mm.default,
    aten.convolution.default, aten.conv2d.default, aten.conv1d.default,
    aten.scaled_dot_product_attention.default,
    torch.ops.onednn.qlinear_pointwise.default, torch.ops.onednn.qlinear_pointwise.tensor,
    torch.ops.onednn.qlinear_pointwise.binary, torch.ops.onednn.qlinear_pointwise.binary_tensor,
}  # fmt: skip


def _quant_ops() -> tuple[set[Any], Any, set[Any]]:
    """(activation dequantize ops, weight dequantize op, eval-mode no-ops)"""
    qd = torch.ops.quantized_decomposed
    return (
        {qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor},
        qd.dequantize_per_channel.default,
        {aten.dropout.default},
    )


class Lowered:
    """The subgraph rewritten as Inductor lowers it: ``module`` runs on the same arguments
    as the subgraph; ``faithful`` is False where an int8 GEMM or convolution was left in
    float under freezing (its eager time then says nothing of Inductor's, which calls oneDNN).
    ``packs``: per weight packed into a buffer of ``module``, (buffer name, the argument's
    index, the activation's shape), so that :meth:`on` packs another copy of the weights."""

    def __init__(
        self,
        module: fx.GraphModule,
        faithful: bool,
        packs: Sequence[tuple[str, int, list[int]]] = (),
    ):
        self.module, self.faithful, self.packs = module, faithful, list(packs)

    @property
    def lowered(self) -> int:
        """How many int8 GEMMs became oneDNN's (one packed weight each)."""
        return len(self.packs)

    def on(self, real: Sequence[Any]) -> fx.GraphModule:
        """``module`` for ``real``, arguments like the ones it was lowered for but with other
        copies of the weights (matcher/cold.py): the same code, its buffers packed from them
        (no second rewrite: copying and compiling the graph again cost more than the packing,
        1.5 of bert-mini int8's 2.6 s of tuning on a Xeon with AMX)."""
        if not self.packs:
            return self.module
        # the same class (its generated forward), graph and submodules, buffers of its own
        # (copy.copy would build and compile a new GraphModule, and GraphModule.__new__ a
        # new class without the forward)
        other = object.__new__(type(self.module))
        other.__dict__ = dict(self.module.__dict__)
        other._buffers = dict(self.module._buffers)
        for name, index, x_shape in self.packs:
            other._buffers[name] = torch.ops.onednn.qlinear_prepack(real[index], x_shape)
        return other


def as_inductor_lowers(
    module: fx.GraphModule, real: Sequence[Any], frozen: Sequence[int], freezing: bool
) -> Lowered:
    """A copy of ``module`` (the replaced subgraph, pre-dispatch ATen) with its int8 GEMMs
    lowered to ``onednn.qlinear_pointwise`` as Inductor's freezing passes lower them (see
    the module docstring); ``frozen``: the indices of the arguments that are graph
    constants (weights). Without freezing nothing is rewritten."""
    gm = copy.deepcopy(module)
    if not freezing:
        _conversions(gm)
        gm.recompile()
        return Lowered(gm, True)
    dq_act, dq_w, _ = _quant_ops()
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = dict(zip(phs, real, strict=False))
    constants = {phs[i] for i in frozen if i < len(phs)}
    packs: list[tuple[str, int, list[int]]] = []
    for lin in [n for n in gm.graph.nodes if n.target is aten.linear.default]:
        w = lin.args[1]
        if not (isinstance(w, fx.Node) and w.target is dq_w):
            continue  # a float GEMM: eager linear calls the same library as Inductor
        pack = _lower_qlinear(gm, lin, values, constants, dq_act)
        if pack is not None:
            name, qw, x_shape = pack
            packs.append((name, phs.index(qw), x_shape))
    _conversions(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    faithful = not any(_float_for_int8(n, dq_w) for n in gm.graph.nodes)
    return Lowered(gm, faithful, packs)


def _float_for_int8(n: fx.Node, dq_w: Any) -> bool:
    """Whether ``n`` is a library call on a dequantized int8 weight that the lowering left in
    float: a linear it could not lower, or a convolution (Inductor's freezing passes lower it
    to ``onednn.qconv_pointwise``). Its time is then no lower bound on Inductor's (ViT's int8
    patch embedding on the AVX-512 EPYC, 2 threads: 1380 us as a float convolution, 642 us as
    Inductor's code; the site took a kernel 24% slower than the subgraph it replaced)."""
    if n.op != "call_function" or n.target not in EXTERN:
        return False
    return any(isinstance(a, fx.Node) and a.target is dq_w for a in n.args)


def _conversions(gm: fx.GraphModule) -> None:
    """Per-tensor (de)quantize ops left in the graph become one dtype conversion each: Inductor
    fuses them into the loop that makes or reads their tensor, where they cost about one pass
    over it (run eagerly, ``quantized_decomposed``'s ops are five passes, 4-5x that)."""
    qd = torch.ops.quantized_decomposed
    ops = {
        qd.quantize_per_tensor.default: 5,  # (x, scale, zero_point, qmin, qmax, dtype)
        qd.dequantize_per_tensor.default: None,
    }
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in ops:
            continue
        i = ops[n.target]
        dtype = n.args[i] if i is not None else n.kwargs.get("out_dtype") or torch.float32
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(aten._to_copy.default, (n.args[0],), {"dtype": dtype})
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)


def _sole_user(n: fx.Node) -> fx.Node | None:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _lower_qlinear(
    gm: fx.GraphModule,
    lin: fx.Node,
    values: dict[fx.Node, Any],
    constants: set[fx.Node],
    dq_act: set[Any],
) -> tuple[str, fx.Node, list[int]] | None:
    """``lin`` as oneDNN's int8 GEMM on a packed weight; (the packed weight's buffer, the
    weight's placeholder, the activation's shape), or None where it cannot be lowered."""
    x, w = lin.args[0], lin.args[1]
    bias = lin.args[2] if len(lin.args) > 2 else None
    if not (isinstance(x, fx.Node) and x.target in dq_act):
        return None
    qw, w_scale, w_zp, axis = w.args[0], w.args[1], w.args[2], w.args[3]  # type: ignore[union-attr]
    qx, x_scale, x_zp = x.args[0], x.args[1], x.args[2]
    if axis != 0 or not isinstance(qw, fx.Node) or qw not in constants:
        return None
    x_val = values.get(qx) if isinstance(qx, fx.Node) else None
    if x_val is None and isinstance(qx, fx.Node):
        x_val = qx.meta.get("val")
    if not isinstance(x_val, torch.Tensor) or any(type(d) is not int for d in x_val.shape):
        return None
    packed = torch.ops.onednn.qlinear_prepack(values[qw], list(x_val.shape))
    name = f"_pdlkit_packed_{lin.name}"
    gm.register_buffer(name, packed)
    tensor_scales = x.target is torch.ops.quantized_decomposed.dequantize_per_tensor.tensor
    out_shape = (*x_val.shape[:-1], values[qw].shape[0])
    tail, unary, other = _fusions(lin, lambda n: _fits(n, out_shape, values))
    out_scale: Any = 1.0
    out_zp: Any = 0
    out_dtype: Any = torch.float32
    q_ops = {torch.ops.quantized_decomposed.quantize_per_tensor.default}
    q = _sole_user(tail)
    if q is not None and q.target in q_ops and q.args[0] is tail and not tensor_scales:
        out_scale, out_zp, out_dtype, tail = q.args[1], q.args[2], q.args[5], q
    onednn = torch.ops.onednn.qlinear_pointwise
    with gm.graph.inserting_before(tail):
        weight = gm.graph.get_attr(name)
        head = (qx, x_scale, x_zp, weight, w_scale, w_zp)
        args: tuple[Any, ...]
        if other is None:
            op = onednn.tensor if tensor_scales else onednn.default
            args = (*head, bias, out_scale, out_zp, out_dtype, *unary)
        else:
            op = onednn.binary_tensor if tensor_scales else onednn.binary
            # Inductor's "sum" adds in place into ``other`` where it can: the same work, but
            # timing calls must leave the caller's tensors alone
            args = (*head, other, bias, out_scale, out_zp, out_dtype, 1.0, 0, "add", 1.0, *unary)
        new = gm.graph.call_function(op, args)
    tail.replace_all_uses_with(new)
    return name, qw, list(x_val.shape)


def _fits(other: fx.Node, shape: tuple[int, ...], values: dict[fx.Node, Any]) -> bool:
    """Whether ``other`` can be the binary post-op's operand: a float32 tensor of the GEMM
    output's ``shape`` (no broadcast), as Inductor's binary fusion asks."""
    a = values.get(other, other.meta.get("val"))
    return isinstance(a, torch.Tensor) and a.dtype == torch.float32 and tuple(a.shape) == shape


def _fusions(
    lin: fx.Node, binary_ok: Callable[[fx.Node], bool]
) -> tuple[fx.Node, tuple[str, list[Any], str], fx.Node | None]:
    """The last node Inductor folds into the int8 GEMM ``lin`` (eval-mode dropout skipped),
    the unary post-op (name, args, algorithm) and the binary ``add``'s other operand (one
    that ``binary_ok`` accepts)."""
    _, _, dropout = _quant_ops()
    tail = lin
    nxt = _sole_user(tail)
    while nxt is not None and nxt.target in dropout and nxt.args[2] is False:
        tail, nxt = nxt, _sole_user(nxt)
    unary: tuple[str, list[Any], str] = ("none", [], "")
    other: fx.Node | None = None
    if nxt is not None and nxt.target is aten.add.Tensor and nxt.kwargs.get("alpha", 1) == 1:
        a, b = nxt.args[0], nxt.args[1]
        cand = b if a is tail else a
        if isinstance(cand, fx.Node) and cand is not tail and binary_ok(cand):
            other, tail, nxt = cand, nxt, _sole_user(nxt)
    if nxt is not None and nxt.target is aten.relu.default:
        unary, tail = ("relu", [], ""), nxt
    elif other is None and nxt is not None and nxt.target is aten.gelu.default:
        unary, tail = ("gelu", [], str(nxt.kwargs.get("approximate", "none"))), nxt
    return tail, unary, other


class _Timed(fx.Interpreter):
    """Runs a graph eagerly, adding up the seconds spent in extern ops."""

    extern = 0.0

    def run_node(self, n: fx.Node) -> Any:
        if n.target in EXTERN:
            t0 = time.perf_counter()
            out = super().run_node(n)
            self.extern += time.perf_counter() - t0
            return out
        return super().run_node(n)


def extern_us(module: fx.GraphModule, real: Sequence[Any]) -> float:
    """One eager run of ``module`` on ``real``: the microseconds spent in its extern ops
    (the library calls Inductor makes for it: their time bounds Inductor's from below)."""
    interp = _Timed(module)
    with torch.no_grad():
        interp.run(*real)
    return interp.extern * 1e6


# a subgraph whose library calls alone take BEATEN times a kernel's time in two samples, or
# FAR times in one, has lost whatever the load: its sampling stops there (GPT-2 BF16 on the
# AVX2-only EPYC, 2 threads: ATen's BF16 GEMMs 20-74x the widened kernels' time; its four
# sites took 9.7 s of timing, 5.3 s with two samples, a first run of 0.2 s warming enough)
BEATEN, FAR = 2.0, 10.0


def _warm(
    runs: Sequence[tuple[fx.GraphModule, Sequence[Any]]], i: int, warmed: set[int]
) -> tuple[fx.GraphModule, Sequence[Any]]:
    """Run ``i`` of ``runs`` (taken in turn), run once untimed first if its copy of the
    weights was not warmed yet."""
    k = i % len(runs)
    module, real = runs[k]
    if k not in warmed:
        module(*real)
        warmed.add(k)
    return module, real


def bounds(
    runs: Sequence[tuple[fx.GraphModule, Sequence[Any]]],
    budget: float,
    best_us: float | None = None,
) -> tuple[float, float]:
    """(lower, upper) in microseconds: the least time of the module's extern ops over the
    samples (a lower bound should not be a median of a few single calls: on a Xeon with AMX
    that was seen above the compiled subgraph's own time, results/x86_subgraph_proxy_amx.md),
    and the median time of the whole module run eagerly (its generated code, no interpreter).
    ``runs``: the module and its arguments, one pair per copy of the site's weights
    (matcher/cold.py), taken in turn; a sample's extern ops and its whole run take different
    copies, so that neither finds the weights the other has just read. Runs too slow for the
    ``budget`` (a sixteenth of it warming up, half of it sampling) are sampled fewer times, and
    none past two where its extern ops alone take :data:`BEATEN` times ``best_us`` (the
    fastest kernel's time), none past one where they take :data:`FAR` times it. A warm-up
    run that takes FAR times ``best_us`` ends the warm-up: each copy of the weights is then
    warmed just before its first sample (GPT-2 BF16 on the AVX2 EPYC: 59 copies of a site's
    weights at 230 ms a run had 11 s of warm-up at each of its four sites)."""
    lows, highs = [], []
    start = time.perf_counter()
    deadline = start + budget / 2
    warmed: set[int] = set()
    with torch.no_grad():
        for j, (module, real) in enumerate((list(runs) * 3)[: max(3, len(runs))]):
            t0 = time.perf_counter()
            module(*real)  # warm-up: oneDNN primitives, packed weights, caches
            warmed.add(j % len(runs))
            if j + 1 >= len(runs) and time.perf_counter() - start > budget / 16:
                break  # slow runs: one on each copy of the weights warms enough
            if best_us is not None and (time.perf_counter() - t0) * 1e6 > FAR * best_us:
                break  # beaten by far: each copy is warmed before its first sample (below)
        for i in range(9):
            module, real = _warm(runs, 2 * i, warmed)
            interp = _Timed(module)
            interp.run(*real)
            module, real = _warm(runs, 2 * i + 1, warmed)
            t0 = time.perf_counter()
            module(*real)
            highs.append(time.perf_counter() - t0)
            lows.append(interp.extern)
            # past the deadline, four samples, or fewer where four would not fit the budget
            # (GPT-2's BF16 GEMMs on a CPU without BF16 arithmetic: the site's timing took
            # 16 s of a 2 s budget)
            if time.perf_counter() > deadline and (i >= 3 or highs[-1] * 4 > budget):
                break
            if best_us is not None and min(lows) * 1e6 > (BEATEN if i else FAR) * best_us:
                break
    return min(lows) * 1e6, statistics.median_high(highs) * 1e6


# sweeps of the sites' library calls, the least taken: at most SWEEPS, at least two (the
# first may still be creating oneDNN's primitives), no more once the least is FAR_OVER times
# what is asked of it, and none past that point (bert-mini BF16 on the AVX2 EPYC: sweeps of
# 242 ms against a 45 ms need)
SWEEPS, FAR_OVER = 5, 2.0


def swept(calls: Sequence[Callable[[], float]], need: float, budget: float) -> float | None:
    """The least time, in microseconds, of a few sweeps of ``calls`` (each runs one site's
    library calls and returns their time), one after another as the graph runs them, within
    about ``budget`` seconds; a sweep stops once it has shown ``need`` reached by far (then
    it is at least FAR_OVER times ``need``). None without calls, or where one raises."""
    if not calls:
        return None
    sweeps: list[float] = []
    deadline = time.perf_counter() + budget
    try:
        with torch.no_grad(), uncounted():
            while len(sweeps) < SWEEPS:
                sweeps.append(_sweep(calls, FAR_OVER * need))
                if len(sweeps) >= 2 and (
                    min(sweeps) >= FAR_OVER * need or time.perf_counter() > deadline
                ):
                    break
    except Exception:  # noqa: BLE001 - no bound: Inductor's graph is compiled and timed
        return None
    return min(sweeps)


def _sweep(calls: Sequence[Callable[[], float]], enough: float) -> float:
    """One sweep's microseconds, its calls stopped once they add up to ``enough``."""
    total = 0.0
    for c in calls:
        total += c()
        if total >= enough:
            break
    return total
