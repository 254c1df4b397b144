"""The decode attention over a growing cache (transformers' ``DynamicCache``: a new length
every decode step), kernels/cuda/_triton_attention.py.

The cache's length is a run-time argument of the kernels, and the slices a launch may use
come from a power-of-two bucket of its tiles, so a growing cache compiles a kernel per bucket,
not per length; a graph compiled for dynamic shapes passes the length through as a symbol and
never guards on it. On the CPU: numerics over many lengths in Triton's interpreter, with the
launches' compile-time arguments counted; a symbolic trace of the launch (no guard on the
length); a compiled module called with six lengths (two graphs). On the GPU: Triton's compiled
kernels counted, and a compiled module's graphs over growing caches with the launch traced
into Inductor's code.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import torch
from conftest import needs_gpu, run_interpreted

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install triton)")
LENGTHS = [1, 2, 7, 8, 9, 16, 17, 33, 40, 63, 64, 65, 100, 130]


_INTERPRETED = textwrap.dedent(
    """
    import json, sys, torch
    import torch.nn.functional as F
    import pdlkit
    sys.path.insert(0, "tests")
    from pdlkit.kernels.cuda import _triton_attention as T
    from test_cuda_attention import Attention, RepeatKV, _qkv
    from test_cuda_attention_growing import LENGTHS

    keys = set()  # what a GPU compiles a kernel for: its compile-time arguments
    plain = T.launch
    def launch(kernel):
        def grid(g):
            def run(*args, **kw):
                const = {k: v for k, v in kw.items() if k != "INTERPRETED_CHUNK"}
                keys.add((kernel.fn.__name__, g[1:], tuple(sorted(const.items()))))
                return plain(kernel)[g](*args, **kw)
            return run
        class Launch:
            def __getitem__(self, g):
                return grid(g)
        return Launch()
    T.launch = launch

    out = {"err": {}, "bool_err": {}}
    for n in LENGTHS:
        q, k, v = _qkv(1, 8, 2, 1, n, 16)
        want = F.scaled_dot_product_attention(q, k, v, scale=0.25, enable_gqa=True)
        out["err"][n] = (T.decode_attention(q, k, v, None, 0.25) - want).abs().max().item()
        m = torch.rand(1, 1, 1, n, generator=torch.Generator().manual_seed(n)) > 0.3
        m[..., -1] = True  # the token just written attends to itself
        want = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1),
                                              v.repeat_interleave(4, 1), attn_mask=m, scale=0.25)
        got = T.decode_attention(q, k, v, m.expand(1, 8, 1, n), 0.25)
        out["bool_err"][n] = (got - want).abs().max().item()
    out["kernels"] = sorted({(name, g) for name, g, _ in keys})
    out["keys"] = len(keys)
    # 19 tokens over up to 8 slices of 8: 3 used, 5 past the end left out
    q, k, v = _qkv(2, 6, 3, 1, 19, 16)
    want = F.scaled_dot_product_attention(q, k, v, scale=0.25, enable_gqa=True)
    got = T.decode_attention(q, k, v, None, 0.25, T.Tile(8, 8))
    out["empty slices"] = (got - want).abs().max().item()

    # a compiled module over a growing cache (Dynamo marks the length dynamic at the second)
    target = {"name": "cpu-triton-interpreter", "devices": ["cpu", "cuda"]}
    from torch._dynamo.utils import counters

    def over_lengths(model, extra=lambda n: ()):  # the kernel's calls, the largest error
        torch._dynamo.reset()
        opt = pdlkit.optimize(model, target=target, default_codegen="eager", autotune="off")
        graphs = counters["stats"]["unique_graphs"]
        pdlkit.stats(reset=True)
        errs = []
        with torch.no_grad():
            for n in range(21, 27):
                args = (*_qkv(3, 8, 2, 1, n, 16), *extra(n))
                errs.append((opt(*args) - model(*args)).abs().max().item())
        by = pdlkit.stats()["by_kernel"].get("decode_attention_triton", {})
        return {"err": max(errs), "calls": by.get("kernel_calls", 0),
                "graphs": counters["stats"]["unique_graphs"] - graphs}

    def padded(n):  # sequence 0 padded on the left, as transformers' additive mask says
        keep = torch.ones(3, 1, 1, n, dtype=torch.bool)
        keep[0, ..., :5] = False
        return (torch.where(keep, 0.0, float("-inf")),)

    out["compiled"] = over_lengths(Attention(True))
    # a padded batch: the mask keeps SDPA's GQA off (repeat_kv instead)
    out["padded"] = over_lengths(RepeatKV(), padded)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def interpreted():
    return run_interpreted(_INTERPRETED)


def test_every_length_matches_torch_sdpa_in_interpreter(interpreted):
    for n in LENGTHS:
        assert interpreted["err"][str(n)] < 1e-5, n
        assert interpreted["bool_err"][str(n)] < 1e-5, n
    assert interpreted["empty slices"] < 1e-5


def test_growing_lengths_compile_a_kernel_per_bucket_not_per_length(interpreted):
    # one sequence, 2 key/value heads, 8-token tiles (the interpreter's): the rule takes up to
    # 128 slices; 1 to 130 tokens are 1 to 17 tiles, buckets 1, 2, 4, 8, 16, 32
    buckets = [1, 2, 4, 8, 16, 32]
    assert interpreted["kernels"] == sorted(
        [["decode_attention_kernel", [s]] for s in buckets]
        + [["combine_kernel", []]]  # its grid is (B * Hq,): SPLIT is among its constants
    )
    # a decode kernel per bucket and mask kind (none, bool), a combine kernel per bucket but
    # the first (one slice: none)
    assert interpreted["keys"] == 2 * len(buckets) + len(buckets) - 1
    assert interpreted["keys"] < 2 * len(LENGTHS)


def test_a_compiled_module_over_a_growing_cache_compiles_two_graphs(interpreted):
    c = interpreted["compiled"]
    assert c["err"] < 1e-5 and c["calls"] == 6
    assert c["graphs"] == 2  # the first length's, then one for every length (dynamic)


def test_a_padded_batch_over_a_growing_cache_keeps_the_kernel(interpreted):
    # repeat_kv's expand and reshape carry the cache's symbolic length into SDPA's operands
    assert interpreted["padded"]["calls"] == 6
    assert interpreted["padded"]["err"] < 1e-5


def _symbolic_cache(length: int, b: int = 1, hq: int = 8, hkv: int = 2, d: int = 16):
    """Fake q, k, v as a graph compiled for a growing cache sees them: the cache's length a
    symbol (v's the same as k's), the other sizes static; and their shape env."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    s, dyn = DimDynamic.STATIC, DimDynamic.DYNAMIC
    static: Any = StatelessSymbolicContext(dynamic_sizes=[s] * 4)
    growing: Any = StatelessSymbolicContext(dynamic_sizes=[s, s, dyn, s])
    q = mode.from_tensor(torch.randn(b, hq, 1, d), symbolic_context=static)
    k = mode.from_tensor(torch.randn(b, hkv, length, d), symbolic_context=growing)
    with mode:
        v = torch.empty_like(k)
    return mode, env, (q, k, v)


def _launches(gm: torch.fx.GraphModule) -> list[dict]:
    return [
        {"grid": n.kwargs["grid"][0], **n.kwargs["kwargs"]}
        for n in gm.graph.nodes
        if "triton_kernel_wrapper" in str(n.target)
    ]


def test_a_symbolic_length_reaches_the_kernels_unguarded():
    # what AOT autograd records of the kernel's body in a graph compiled for dynamic shapes
    # (Inductor then launches the kernels with the length as a run-time value)
    from pdlkit.kernels.cuda._triton_attention import decode_attention
    from torch.fx.experimental.proxy_tensor import make_fx

    mode, env, (q, k, v) = _symbolic_cache(37)
    with mode:
        gm = make_fx(lambda q, k, v: decode_attention(q, k, v, None, 0.25), tracing_mode="fake")(
            q, k, v
        )
    length = k.shape[2].node.expr
    assert not [g.expr for g in env.guards if length in g.expr.free_symbols]
    main, combine = _launches(gm)
    assert isinstance(main["L"], torch.fx.Node) and isinstance(combine["L"], torch.fx.Node)
    # 2 (sequence, head) pairs: the most slices the rule gives any length, 128
    assert main["SPLIT"] == combine["SPLIT"] == 128 and main["grid"][1] == 128


def test_a_static_length_takes_its_bucket():
    from pdlkit.kernels.cuda._triton_attention import decode_attention
    from torch.fx.experimental.proxy_tensor import make_fx

    q, k, v = (torch.randn(s) for s in [(1, 8, 1, 16), (1, 2, 129, 16), (1, 2, 129, 16)])
    gm = make_fx(lambda q, k, v: decode_attention(q, k, v, None, 0.25), tracing_mode="fake")(
        q, k, v
    )
    main, _ = _launches(gm)
    assert main["L"] == 129 and main["SPLIT"] == main["grid"][1] == 8  # 5 tiles of 32 -> 8
    from pdlkit.kernels.cuda._triton_attention import decode_attention_kernel

    params = {p.name: p for p in decode_attention_kernel.params}
    assert not params["L"].is_constexpr and params["L"].do_not_specialize


# -- on the GPU ---------------------------------------------------------------------------------


def _compiled_kernels(kernel) -> int:
    """Kernels Triton compiled for ``kernel`` on the current device."""
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


@needs_gpu
def test_gpu_growing_cache_compiles_a_kernel_per_bucket():
    from pdlkit.kernels.cuda import _triton_attention as T
    from test_cuda_attention import _qkv, _reference

    before = _compiled_kernels(T.decode_attention_kernel)
    for n in range(100, 300, 7):  # 4 to 10 tiles of 32: buckets 4, 8, 16
        q, k, v = _qkv(1, 32, 8, 1, n, 128, "cuda", torch.bfloat16)
        got = T.decode_attention(q, k, v, None, 128**-0.5)
        want = _reference(q, k, v, None, True)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    assert _compiled_kernels(T.decode_attention_kernel) - before <= 3


@needs_gpu
@pytest.mark.parametrize("autotune", ["off", "cached"])
def test_gpu_compiled_decode_over_a_growing_cache_does_not_recompile(autotune):
    # traced into Inductor's code (autotune off), or chosen per shape bucket at run time
    from test_cuda_attention import Attention, _qkv, _reference
    from torch._dynamo.utils import counters

    import pdlkit

    torch._dynamo.reset()
    model = Attention(True, scale=128**-0.5)
    opt = pdlkit.optimize(model, autotune=autotune)
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for n in range(129, 137):
            q, k, v = _qkv(4, 32, 8, 1, n, 128, "cuda", torch.bfloat16)
            want = _reference(q, k, v, None, True).transpose(1, 2).reshape(4, 1, -1)
            torch.testing.assert_close(opt(q, k, v).float(), want, rtol=2e-2, atol=2e-2)
    assert counters["stats"]["unique_graphs"] - graphs <= 2
