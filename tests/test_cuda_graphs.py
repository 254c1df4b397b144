"""CUDA graphs with substituted kernels (pdlkit/inductor_options.py), what the CPU can check:
Inductor's ``mode`` and config keys reach Inductor through the pdlkit backend, and where a
graph will be captured only kernels declared ``graph_capture_safe`` are used, the others
named in ``explain``. The GPU half (capture and replay of an int8 Llama, a static KV cache
included) is at the end and skips without CUDA.
"""

from __future__ import annotations

import pytest
import torch
from conftest import KERNEL_HEADER, MLP, linear_act_pattern, needs_gpu, write
from torch._dynamo.utils import counters

import pdlkit

# two kernels for linear -> sigmoid "on CUDA": the preferred one is not capture-safe
UNSAFE = """
@pdlkit.kernel(op="lin_sigmoid", meta=meta, device="cuda", priority=1)
def k_unsafe(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.sigmoid(torch.nn.functional.linear(x, w, b))
"""
CUDA_KERNELS = (
    UNSAFE
    + """
@pdlkit.kernel(op="lin_sigmoid", meta=meta, device="cuda", traits=["graph_capture_safe"])
def k_safe(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.sigmoid(torch.nn.functional.linear(x, w, b))
"""
)

CPU_KERNEL = """
@pdlkit.kernel(op="lin_sigmoid", meta=meta)
def k_cpu(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.sigmoid(torch.nn.functional.linear(x, w, b))
"""


def _folders(tmp_path, kernels):
    p, k = tmp_path / "patterns", tmp_path / "kernels"
    write(p, "lin_sigmoid.pdl.mlir", linear_act_pattern("lin_sigmoid", "sigmoid", "lin_sigmoid"))
    write(k, "k.py", KERNEL_HEADER + kernels)
    return p, k


@pytest.fixture
def model():
    torch.manual_seed(0)
    return MLP().eval()


def _cudagraph_skips(run) -> int:
    """How often Inductor was asked for CUDA graphs and skipped them (here: CPU tensors)."""
    torch._dynamo.reset()
    before = counters["inductor"]["cudagraph_skips"]
    with torch.no_grad():
        run()
    return counters["inductor"]["cudagraph_skips"] - before


def test_torch_compile_mode_reaches_inductor(model, tmp_path):
    from pdlkit.backend import PdlkitBackend

    p, k = _folders(tmp_path, CPU_KERNEL)
    x = torch.randn(4, 16)
    backend = PdlkitBackend(patterns=p, kernels=k, autotune="off")
    f = torch.compile(model, backend=backend, mode="reduce-overhead")
    pdlkit.stats(reset=True)
    assert _cudagraph_skips(lambda: torch.testing.assert_close(f(x), model(x))) == 1
    assert pdlkit.stats()["by_kernel"]["k_cpu"]["substitutions"] == 1
    plain = torch.compile(model, backend=backend)
    assert _cudagraph_skips(lambda: plain(x)) == 0  # no mode: Inductor is not asked


def test_mode_as_an_option_beside_pdlkit_options(model, tmp_path):
    p, k = _folders(tmp_path, CPU_KERNEL)
    opts = {"patterns": p, "kernels": k, "autotune": "off", "mode": "reduce-overhead"}
    f = torch.compile(model, backend="pdlkit", options=opts)  # torch.compile takes one of the two
    assert _cudagraph_skips(lambda: f(torch.randn(4, 16))) == 1


def test_inductor_config_keys_go_to_inductor_beside_pdlkit_options(model, tmp_path):
    p, k = _folders(tmp_path, CPU_KERNEL)
    opts = {"patterns": p, "kernels": k, "autotune": "off", "triton.cudagraphs": True}
    f = torch.compile(model, backend="pdlkit", options=opts)
    assert _cudagraph_skips(lambda: f(torch.randn(4, 16))) == 1


def test_optimize_takes_mode_and_inductor_config(model, tmp_path):
    p, k = _folders(tmp_path, CPU_KERNEL)
    x = torch.randn(4, 16)
    for kw in ({"mode": "reduce-overhead"}, {"inductor_config": {"triton.cudagraphs": True}}):
        f = pdlkit.optimize(model, patterns=p, kernels=k, autotune="off", **kw)
        assert _cudagraph_skips(lambda f=f: torch.testing.assert_close(f(x), model(x))) == 1


def test_unknown_option_names_both_option_sets(model):
    f = torch.compile(model, backend="pdlkit", options={"triton.cudagraph": True})
    with pytest.raises(Exception, match=r"'triton.cudagraph'.*neither a pdlkit option.*Inductor"):
        f(torch.randn(4, 16))


def test_unknown_mode_fails_at_optimize(model):
    with pytest.raises(ValueError, match="mode='fast'.*reduce-overhead"):
        pdlkit.optimize(model, mode="fast")


def _explain(model, p, k, **kw):
    with torch.no_grad():
        return pdlkit.explain(
            model, torch.randn(4, 16), patterns=p, kernels=k, target="cuda-sm90", **kw
        )


def test_under_cuda_graphs_a_kernel_not_capture_safe_is_passed_over(model, tmp_path):
    p, k = _folders(tmp_path, CUDA_KERNELS)
    assert [s.kernel for s in _explain(model, p, k).substitutions] == ["k_unsafe"]
    report = _explain(model, p, k, mode="reduce-overhead")
    assert [s.kernel for s in report.substitutions] == ["k_safe"]
    graphed = _explain(model, p, k, inductor_config={"triton.cudagraphs": True})
    assert [s.kernel for s in graphed.substitutions] == ["k_safe"]


def test_under_cuda_graphs_a_site_with_no_capture_safe_kernel_keeps_its_subgraph(model, tmp_path):
    p, k = _folders(tmp_path, UNSAFE)
    report = _explain(model, p, k, mode="reduce-overhead")
    assert report.substitutions == []
    reasons = [m.reason for m in report.near_misses]
    assert any(
        "k_unsafe: not declared graph_capture_safe, and the graph is captured in a CUDA graph" in r
        for r in reasons
    ), reasons
    assert "not declared graph_capture_safe" in report.format(verbose=True)


def test_shipped_cuda_int8_kernels_are_all_used_under_cuda_graphs():
    from pdlkit.quantization.int8_dynamic import quantize_int8_dynamic
    from test_cuda import LlamaMLP

    q = quantize_int8_dynamic(LlamaMLP()).eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        plain = pdlkit.explain(q, x, target="cuda-sm90", autotune="off")
        graphed = pdlkit.explain(q, x, target="cuda-sm90", autotune="off", mode="reduce-overhead")
    kernels = sorted(s.kernel for s in graphed.substitutions)
    assert kernels == sorted(s.kernel for s in plain.substitutions)
    assert "int8_gated_silu_triton" in kernels


def test_re_traced_graph_keeps_the_inputs_dynamo_marked_static():
    # what AOT autograd reads to tell CUDA graphs which inputs keep their address (weights,
    # a KV cache marked static): it must read the same off pdlkit's re-trace as off Dynamo's
    from torch._functorch._aot_autograd.frontend_utils import _try_get_metadata_from_dynamo

    from pdlkit.backend import retrace
    from pdlkit.inductor_options import keep_dynamo_inputs

    lin, cache = torch.nn.Linear(8, 8), torch.zeros(4, 8)
    torch._dynamo.mark_static_address(cache)

    def step(x):
        cache[:2].copy_(x[:2])  # as a static KV cache is written
        return lin(x) + cache.sum()

    seen = []
    torch.compile(step, backend=lambda gm, inputs: seen.append((gm, inputs)) or gm.forward)(
        torch.randn(4, 8)
    )
    gm, inputs = seen[0]
    traced = retrace(gm, inputs)

    def static(mod):
        return _try_get_metadata_from_dynamo(mod, {}.keys(), len(inputs), [None] * len(inputs))[1]

    want = static(gm)
    assert len(want) == 3  # weight, bias, cache
    assert static(traced) == []  # a plain re-trace: every input would be copied per replay
    assert keep_dynamo_inputs(gm, traced)
    assert static(traced) == want


def _fresh_python(script: str, **env: str | None) -> str:
    """The last line ``script`` prints, run by a new Python whose environment has ``env``
    (None: the variable unset)."""
    import os
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if k not in env}
    e.update({k: v for k, v in env.items() if v is not None})
    r = subprocess.run([sys.executable, "-c", script], env=e, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


_STATIC_LAUNCH = (
    "import os, torch._inductor.config as c, pdlkit.backend; "
    "print(c.static_launch_user_defined_triton_kernels, "
    "os.environ['TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS'])"
)


def test_pdlkit_kernels_get_inductors_static_launcher_in_this_process_and_its_workers():
    # the environment variable is what Inductor's compile workers read when they start
    got = _fresh_python(
        _STATIC_LAUNCH, TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=None
    )
    assert got == "True 1"


def test_static_launch_turned_off_in_the_environment_stays_off():
    got = _fresh_python(_STATIC_LAUNCH, TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS="0")
    assert got == "False 0"


def test_gpu_inputs_get_their_static_marks_without_cuda_graphs():
    # Inductor checks the alignment of every GPU input on each call unless it is static; a
    # CPU graph of static shapes without CUDA graphs is left as Dynamo's re-trace gives it,
    # one with symbols gets their sources (dynamic shapes, lifted floats)
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pdlkit.inductor_options import dynamo_inputs_matter

    static = torch.fx.symbolic_trace(lambda x: x * 2)
    with FakeTensorMode(allow_non_fake_inputs=True):
        on_gpu = [torch.empty(4, device="cuda"), 3]
    assert dynamo_inputs_matter("", static, on_gpu)
    assert not dynamo_inputs_matter("", static, [torch.empty(4), 3])
    assert dynamo_inputs_matter("captured", static, [torch.empty(4)])
    sym = []
    torch.compile(lambda x: x * 2, backend=lambda gm, ex: sym.append(gm) or gm, dynamic=True)(
        torch.randn(4)
    )
    assert dynamo_inputs_matter("", sym[0], [torch.empty(4)])


# -- on the GPU ---------------------------------------------------------------------------------


def _llama(layers: int = 2):
    pytest.importorskip("transformers", reason="pip install transformers")
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_attention_heads=8,
        num_key_value_heads=2, num_hidden_layers=layers, max_position_embeddings=256,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaModel(config).to("cuda", torch.bfloat16).eval()


@needs_gpu
@pytest.mark.parametrize("how", ["optimize", "torch.compile"])
def test_gpu_int8_llama_prefill_runs_in_inductors_cuda_graphs(how):
    from pdlkit.quantization import quantize

    model = _llama()
    ids = torch.randint(0, 1000, (2, 32), device="cuda")
    q = quantize(model, (ids,), scheme="int8-dynamic-per-token")
    if how == "optimize":
        f = pdlkit.optimize(q, mode="reduce-overhead", autotune="off")
    else:
        from pdlkit.backend import PdlkitBackend

        f = torch.compile(q, backend=PdlkitBackend(autotune="off"), mode="reduce-overhead")
    torch._dynamo.reset()
    pdlkit.stats(reset=True)
    before = counters["inductor"]["cudagraph_skips"]
    with torch.no_grad():
        want = q(ids).last_hidden_state.float()
        for _ in range(3):  # warm-up, record, replay
            got = f(ids).last_hidden_state.float().clone()
    assert counters["inductor"]["cudagraph_skips"] == before  # captured, not skipped
    assert pdlkit.stats()["by_kernel"]["int8_gated_silu_triton"]["substitutions"] == 2
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert cos > 0.999


@needs_gpu
def test_gpu_int8_llama_decode_with_static_cache_runs_in_cuda_graphs():
    from pdlkit.quantization import quantize
    from transformers import StaticCache

    model = _llama()
    # 24 sequences: the quantized model's eager int8 GEMM (torch._int_mm) needs M > 16 on CUDA
    ids = torch.randint(0, 1000, (24, 1), device="cuda")
    q = quantize(model, (ids,), scheme="int8-dynamic-per-token")

    def step(cache, ids, pos):
        out = q(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True)
        return out.last_hidden_state

    f = pdlkit.optimize(step, mode="reduce-overhead", autotune="off")
    torch._dynamo.reset()
    before = counters["inductor"]["cudagraph_skips"]
    outs = {}
    for name, fn in (("eager", step), ("pdlkit", f)):
        cache = StaticCache(config=model.config, max_cache_len=64)
        steps = []
        with torch.no_grad():
            # the first step eager on both sides: it allocates the cache's tensors (transformers
            # marks them static); then the cache grows in place, positions are tensors
            steps.append(step(cache, ids, torch.tensor([0], device="cuda")).float().clone())
            for t in range(1, 5):
                pos = torch.tensor([t], device="cuda")
                steps.append(fn(cache, ids, pos).float().clone())
        outs[name] = torch.stack(steps)
    assert counters["inductor"]["cudagraph_skips"] == before
    cos = torch.nn.functional.cosine_similarity(
        outs["pdlkit"].flatten(), outs["eager"].flatten(), dim=0
    )
    assert cos > 0.999


@needs_gpu
def test_gpu_compiled_int8_mlp_checks_no_weight_alignment_per_call(monkeypatch):
    # weights are static inputs for Inductor, as they are where Inductor compiles alone: the
    # compiled call checks the alignment of the activation only
    import torch._inductor.compile_fx as compile_fx
    from pdlkit.quantization.int8_dynamic import quantize_int8_dynamic
    from test_cuda import LlamaMLP

    seen, check = [], compile_fx.get_input_idxs_to_check

    def spy(inputs, static):
        seen.append((len(inputs), len(check(inputs, static))))
        return check(inputs, static)

    monkeypatch.setattr(compile_fx, "get_input_idxs_to_check", spy)
    q = quantize_int8_dynamic(LlamaMLP().to("cuda", torch.bfloat16)).eval()
    x = torch.randn(2, 16, 64, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    pdlkit.stats(reset=True)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        pdlkit.optimize(q, autotune="off")(x)
    assert pdlkit.stats()["by_kernel"]["int8_gated_silu_triton"]["substitutions"] == 1
    assert seen and all(n > 4 and checked == 1 for n, checked in seen)


_PROFILED_MLP = """
import torch, pdlkit
from torch.profiler import profile, ProfilerActivity
from pdlkit.quantization.int8_dynamic import quantize_int8_dynamic
from test_cuda import LlamaMLP
q = quantize_int8_dynamic(LlamaMLP().to("cuda", torch.bfloat16)).eval()
x = torch.randn(1, 24, 64, device="cuda", dtype=torch.bfloat16)
f = pdlkit.optimize(q, autotune="off")
with torch.no_grad():
    f(x); f(x); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        f(x); torch.cuda.synchronize()
names = [e.name for e in prof.events()]
print(names.count("cuLaunchKernel"), names.count("cuLaunchKernelEx"))
"""


@needs_gpu
def test_gpu_pdlkit_kernels_are_launched_by_inductors_static_launcher():
    # Triton's own launcher calls cuLaunchKernelEx; Inductor's static launcher cuLaunchKernel
    import os
    from pathlib import Path

    tests = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    got = _fresh_python(
        _PROFILED_MLP, PYTHONPATH=path, TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS=None
    )
    static, triton_launcher = map(int, got.split())
    assert static >= 3 and triton_launcher == 0
