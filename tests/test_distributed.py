"""pdlkit inside torch.distributed (issue 26), on the CPU with gloo.

Each multi-rank test spawns 2 processes on loopback (``_spawn``), which run one scenario
each and write what they saw as JSON; a process still alive at the deadline fails the test
(a hang never blocks the suite). Ranks run with one thread (2 ranks on a 2-core host).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.fx as fx
import torch.multiprocessing as mp
from conftest import VNNI
from torch import nn
from torch._opaque_base import OpaqueBase

import pdlkit
import pdlkit.backend
from pdlkit.distributed import DistributedError

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)

REPO = Path(__file__).resolve().parents[1]
WORLD = 2
DEADLINE_S = 55.0


# -- the harness: 2 spawned ranks, bounded in time ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    rank: int, init: str, scenario: str, out: str, env: dict[str, str], pg_s: float
) -> None:
    os.environ.update(env)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=WORLD, timeout=timedelta(seconds=pg_s)
    )
    try:
        result = SCENARIOS[scenario](rank, Path(out))
    except Exception as e:  # reported to the test, which asserts on it
        result = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _spawn(
    tmp_path: Path,
    scenario: str,
    env: dict[int, dict[str, str]] | None = None,
    pg_s: float = 30.0,
) -> list[dict[str, Any]]:
    """Run ``scenario`` on 2 ranks; each rank's result, or a failure naming the rank that
    did not finish within DEADLINE_S."""
    import time

    ctx = mp.get_context("spawn")
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, init, scenario, str(tmp_path), (env or {}).get(r, {}), pg_s),
            daemon=True,
        )
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    end = time.monotonic() + DEADLINE_S
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    if hung:
        pytest.fail(f"rank(s) {hung} of scenario {scenario!r} still running after {DEADLINE_S} s")
    results = []
    for r in range(WORLD):
        f = tmp_path / f"rank{r}.json"
        assert f.exists(), f"rank {r} exited with code {procs[r].exitcode} and no result"
        results.append(json.loads(f.read_text()))
    return results


# -- models -----------------------------------------------------------------------------------


def _mlp(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to(dtype).eval()


def _subs() -> int:
    return int(pdlkit.stats()["substitutions"])


def _compiled_run(model: Any, x: torch.Tensor, **options: Any) -> tuple[torch.Tensor, int]:
    """(output, substitutions made) of ``model`` compiled with pdlkit."""
    torch._dynamo.reset()
    before = _subs()
    with torch.no_grad():
        y = torch.compile(model, backend="pdlkit", options=options or None)(x)
    return y, _subs() - before


def _dtensor_tp(model: nn.Module) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (WORLD,))
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


# -- scenarios (run in each rank) ---------------------------------------------------------------


def _scenario_dtensor(rank: int, out: Path) -> dict[str, Any]:
    """fp32 and bf16 DTensor tensor parallel against the unsharded model."""
    res: dict[str, Any] = {}
    for name, dtype, shape in (
        ("fp32", torch.float32, (8, 64)),
        ("bf16", torch.bfloat16, (2, 4, 64)),
    ):
        torch.manual_seed(1)
        x = torch.randn(*shape).to(dtype)
        full = _mlp(dtype)
        with torch.no_grad():
            ref = full(x)
        y_full, subs_full = _compiled_run(full, x)
        y_tp, subs_tp = _compiled_run(_dtensor_tp(_mlp(dtype)), x)
        res[name] = {
            "err": _err(y_tp, ref),
            "err_full": _err(y_full, ref),
            "subs_tp": subs_tp,
            "subs_full": subs_full,
        }
    res["grad"] = _grad_graph()
    return res


def _grad_graph() -> dict[str, Any]:
    """A DTensor graph that needs gradients: Inductor compiles it, pdlkit says so."""
    import warnings

    torch._dynamo.reset()
    torch.manual_seed(1)
    x = torch.randn(8, 64)
    ref = _mlp()(x)
    model = _dtensor_tp(_mlp())
    before = _subs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(model, backend="pdlkit")(x)
        y.sum().backward()
    grads = [p.grad is not None for p in model.parameters()]
    return {
        "err": _err(y, ref),
        "subs": _subs() - before,
        "all_grads": all(grads),
        "warnings": [str(w.message) for w in caught if "pdlkit" in str(w.message)],
    }


_DECLINING_KERNEL = '''
from __future__ import annotations

import torch
from torch import Tensor
import torch.distributed as dist
import pdlkit


def _meta(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@pdlkit.kernel(op="linear_relu", device="cpu", meta=_meta,
               dtypes={"x": [torch.float32], "weight": [torch.float32]})
def linear_relu_rank0_only(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """relu(x @ weight.T + bias) on rank 0; rank 1 declines every call."""
    if dist.get_rank() == 1:
        raise pdlkit.KernelUnsupported("rank 1 declines")
    return torch.relu(torch.nn.functional.linear(x, weight, bias))
'''


def _scenario_decline(rank: int, out: Path) -> dict[str, Any]:
    """A kernel that declines on rank 1 only: rank 1 runs the replaced subgraph."""
    folder = out / "kernels"
    if rank == 0:
        folder.mkdir(exist_ok=True)
        (folder / "declining.py").write_text(_DECLINING_KERNEL)
    dist.barrier()
    torch.manual_seed(1)
    x = torch.randn(8, 64)
    with torch.no_grad():
        ref = _mlp()(x)
    before = pdlkit.stats()
    y, subs = _compiled_run(_dtensor_tp(_mlp()), x, kernels=str(folder))
    y2 = torch.compile(_dtensor_tp(_mlp()), backend="pdlkit", options={"kernels": str(folder)})
    with torch.no_grad():
        y2(x)  # a second call: the fallback is taken per call, every call
    after = pdlkit.stats()
    return {
        "err": _err(y, ref),
        "subs": subs,
        "fallbacks": after["fallbacks"] - before["fallbacks"],
        "kernel_calls": after["kernel_calls"] - before["kernel_calls"],
    }


def _local_tp(model: nn.Module) -> nn.Module:
    from pdlkit.tensor_parallel import tensor_parallel

    return tensor_parallel(copy.deepcopy(model), {"0": "colwise", "2": "rowwise"})


def _scenario_int8(rank: int, out: Path) -> dict[str, Any]:
    """PT2E int8 and per-token int8 on each rank's shard, against the unsharded int8 model."""
    from pdlkit.quantization import quantize

    res: dict[str, Any] = {}
    torch.manual_seed(1)
    x = torch.randn(8, 64)
    calib = [(torch.randn(8, 64),) for _ in range(4)]
    for scheme in ("int8-static", "int8-dynamic-per-token"):
        kw = {"calibration": calib} if scheme == "int8-static" else {}
        full = quantize(_mlp(), (x,), scheme=scheme, **kw)
        tp = quantize(_local_tp(_mlp()), (x,), scheme=scheme, **kw)
        y_full, subs_full = _compiled_run(full, x)
        y_tp, subs_tp = _compiled_run(tp, x)
        with torch.no_grad():
            fp32 = _mlp()(x)
        res[scheme] = {
            "err": _err(y_tp, y_full),
            "err_fp32": _err(y_full, fp32),
            "scale": float(fp32.abs().max()),
            "subs_tp": subs_tp,
            "subs_full": subs_full,
        }
    return res


def _scenario_compile_only(rank: int, out: Path) -> dict[str, Any]:
    """Compile and run the DTensor model; the error (if any) is the result."""
    torch.manual_seed(1)
    y, subs = _compiled_run(_dtensor_tp(_mlp()), torch.randn(8, 64))
    return {"subs": subs}


def _scenario_rank1_inductor(rank: int, out: Path) -> dict[str, Any]:
    """Rank 0 compiles with pdlkit, rank 1 with Inductor (never reaches pdlkit's check)."""
    if rank == 0:
        return _scenario_compile_only(rank, out)
    torch.manual_seed(1)
    with torch.no_grad():
        torch.compile(_dtensor_tp(_mlp()), backend="inductor")(torch.randn(8, 64))
    return {}


class _Block(nn.Module):
    def __init__(self, n_in: int, n_out: int, relu: bool) -> None:
        super().__init__()
        self.fc, self.relu = nn.Linear(n_in, n_out), relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return torch.relu(y) if self.relu else y


class _TwoBlocks(nn.Module):
    """User code around the linears: Dynamo compiles it (torch.nn's own frames it skips)."""

    def __init__(self) -> None:
        super().__init__()
        self.b0, self.b1 = _Block(64, 256, True), _Block(256, 64, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b1(self.b0(x))


def _scenario_fsdp(rank: int, out: Path) -> dict[str, Any]:
    """FSDP2 (fully_shard) training steps and inference, against the unsharded model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _TwoBlocks()
    ref = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (WORLD,))
    for m in (model.b0, model.b1, model):
        fully_shard(m, mesh=mesh)
    compiled = torch.compile(model, backend="pdlkit")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, target = torch.randn(8, 64), torch.randn(8, 64)  # the same on both ranks (seed 0)
    before = _subs()
    losses = []
    for _ in range(3):
        pair = []
        for fn, o in ((compiled, opt), (ref, opt_ref)):
            loss = nn.functional.mse_loss(fn(x), target)
            loss.backward()
            o.step()
            o.zero_grad()
            pair.append(float(loss))
        losses.append(pair)
    with torch.no_grad():
        err = _err(compiled(x), ref(x))
    return {"losses": losses, "err": err, "subs": _subs() - before}


SCENARIOS = {
    "fsdp": _scenario_fsdp,
    "dtensor": _scenario_dtensor,
    "decline": _scenario_decline,
    "int8": _scenario_int8,
    "compile_only": _scenario_compile_only,
    "rank1_inductor": _scenario_rank1_inductor,
}


def _ok(results: list[dict[str, Any]]) -> None:
    for r, res in enumerate(results):
        assert "error" not in res, f"rank {r}: {res['error']}\n{res.get('trace', '')}"


# -- tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dtensor_results(tmp_path_factory):
    results = _spawn(tmp_path_factory.mktemp("dtensor"), "dtensor")
    _ok(results)
    return results


def test_dtensor_tensor_parallel_equals_unsharded_and_substitutes_each_local_gemm(
    dtensor_results,
):
    for r, res in enumerate(dtensor_results):
        fp32, bf16 = res["fp32"], res["bf16"]
        assert fp32["subs_full"] == 2 and fp32["subs_tp"] == fp32["subs_full"], (r, fp32)
        assert bf16["subs_tp"] == bf16["subs_full"] == 2, (r, bf16)
        assert fp32["err"] < 1e-5, (r, fp32)
        assert bf16["err"] <= 2 * max(bf16["err_full"], 1e-2), (r, bf16)


def test_dtensor_graph_that_needs_gradients_goes_to_inductor_with_a_warning(dtensor_results):
    for r, res in enumerate(dtensor_results):
        grad = res["grad"]
        assert grad["subs"] == 0 and grad["all_grads"] and grad["err"] < 1e-5, (r, grad)
        assert any("needs gradients is compiled by Inductor" in w for w in grad["warnings"]), grad


def test_kernel_declining_on_one_rank_falls_back_there_without_hang(tmp_path):
    r0, r1 = _spawn(tmp_path, "decline")
    _ok([r0, r1])
    assert r0["subs"] == r1["subs"] == 1  # linear_relu on each rank's column shard
    assert r0["kernel_calls"] == 2 and r0["fallbacks"] == 0, r0
    assert r1["fallbacks"] == 2 and r1["kernel_calls"] == 0, r1
    assert r0["err"] < 1e-5 and r1["err"] < 1e-5, (r0, r1)


def test_int8_models_sharded_per_rank_substitute_as_unsharded(tmp_path):
    results = _spawn(tmp_path, "int8")
    _ok(results)
    for r, res in enumerate(results):
        static, per_token = res["int8-static"], res["int8-dynamic-per-token"]
        assert static["subs_tp"] == static["subs_full"], (r, static)
        if VNNI:  # the x86 int8 kernels' one requirement
            assert static["subs_full"] >= 2, (r, static)
        assert per_token["subs_tp"] == per_token["subs_full"], (r, per_token)
        for name, m in res.items():  # shard-local activation scales: int8 rounding apart
            assert m["err"] < 0.05 * m["scale"], (r, name, m)


def test_fsdp2_training_steps_and_inference_equal_the_unsharded_model(tmp_path):
    results = _spawn(tmp_path, "fsdp")
    _ok(results)
    for r, res in enumerate(results):
        assert res["subs"] >= 1, (r, res)  # the linear+relu block, in training and inference
        for step, (ours, ref) in enumerate(res["losses"]):
            assert abs(ours - ref) < 1e-5, (r, step, res["losses"])
        assert res["err"] < 1e-5, (r, res)


def test_ranks_with_different_pattern_files_both_fail_naming_rank_and_file(tmp_path):
    envs = {}
    for r in range(WORLD):
        folder = tmp_path / f"patterns{r}"
        shutil.copytree(REPO / "patterns" / "cpu", folder)
        if r == 1:
            with open(folder / "linear.pdl.mlir", "a") as f:
                f.write("// edited on rank 1\n")
        envs[r] = {"PDLKIT_PATTERN_PATH": str(folder), "PDLKIT_DIST_TIMEOUT": "20"}
    results = _spawn(tmp_path, "compile_only", envs)
    for r, res in enumerate(results):
        assert "DistributedError" in res.get("error", ""), (r, res)
        assert "linear.pdl.mlir differs between rank 0" in res["error"], res["error"]
        assert "and rank 1" in res["error"], res["error"]


def test_rank_that_never_reaches_the_check_is_named_within_the_timeout(tmp_path):
    env = {r: {"PDLKIT_DIST_TIMEOUT": "3"} for r in range(WORLD)}
    r0, _ = _spawn(tmp_path, "rank1_inductor", env, pg_s=8.0)
    assert "DistributedError" in r0.get("error", ""), r0
    assert "rank(s) [1] did not reach" in r0["error"] and "3 s" in r0["error"], r0["error"]


# -- in this process: graphs with collectives and no (or one) process group ------------------------


def _all_reduce_graph(group: str = "0") -> fx.GraphModule:
    g = fx.Graph()
    x = g.placeholder("x")
    ar = g.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "sum", group))
    w = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (ar,))
    g.output((g.call_function(torch.ops.aten.relu.default, (w,)),))
    return fx.GraphModule(nn.Module(), g)


def test_collectives_without_a_process_group_are_a_clear_error():
    assert not dist.is_initialized()
    backend = pdlkit.backend.PdlkitBackend()
    with pytest.raises(DistributedError, match="process group is not initialized"):
        backend(_all_reduce_graph(), [torch.randn(4, 4)])


def _world_name() -> str:
    assert dist.group.WORLD is not None
    return str(dist.group.WORLD.group_name)


@pytest.fixture
def one_rank_group():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_a_pattern_that_names_a_collective_is_an_error_with_its_file_and_line(
    tmp_path, one_rank_group
):
    (tmp_path / "fused.pdl.mlir").write_text(
        "// all_reduce -> relu in one kernel: a collective inside a pattern\n"
        "pdl.pattern @all_reduce_relu : benefit(1) {\n"
        "  %x = pdl.operand\n"
        "  %r = pdl.operand\n"
        "  %g = pdl.operand\n"
        "  %t = pdl.type\n"
        '  %n = pdl.attribute = "_c10d_functional.all_reduce"\n'
        '  %ar = pdl.operation "torch.operator"(%x, %r, %g : !pdl.value, !pdl.value, !pdl.value)'
        ' {"name" = %n} -> (%t : !pdl.type)\n'
        "  pdl.rewrite %ar {\n"
        '    %op = pdl.attribute = "relu"\n'
        '    pdl.apply_native_rewrite "pdlkit_call"(%op, %x, %ar : !pdl.attribute, !pdl.value,'
        " !pdl.operation)\n"
        "  }\n"
        "}\n"
    )
    backend = pdlkit.backend.PdlkitBackend(patterns=str(tmp_path))
    with pytest.raises(
        DistributedError,
        match=r"fused\.pdl\.mlir:7: pattern 'all_reduce_relu' matches the collective",
    ):
        backend(_all_reduce_graph(_world_name()), [torch.randn(4, 4)])


def test_collectives_stay_out_of_the_matched_graph(one_rank_group):
    """The all_reduce and wait_tensor run as Inductor compiled them; the rest compiles."""
    backend = pdlkit.backend.PdlkitBackend()
    x = torch.randn(4, 4)
    fn = backend(_all_reduce_graph(_world_name()), [x])
    (y,) = fn(x)
    assert torch.equal(y, torch.relu(x))  # a world of one: the sum is x itself


class _Scale(OpaqueBase):
    """An opaque object: its attribute is read by the custom op, never by the graph."""

    def __init__(self, s: float) -> None:
        self.s = s


def test_graph_with_an_opaque_object_input_is_retraced_and_substituted():
    """Dynamo hands an opaque object (here a registered opaque type; a process group or a
    device mesh likewise) to the backend as a FakeScriptObject: the re-trace takes the real
    one, and the op that takes it stays outside the matched graph."""
    from torch._library.opaque_object import register_opaque_type

    register_opaque_type(_Scale, typ="reference")

    @torch.library.custom_op("pdlkit_test_distributed::scale", mutates_args=())
    def scale(x: torch.Tensor, obj: _Scale) -> torch.Tensor:
        return x * obj.s

    @scale.register_fake
    def _(x: torch.Tensor, obj: _Scale) -> torch.Tensor:
        return torch.empty_like(x)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.by = nn.Linear(64, 64), _Scale(2.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return scale(torch.relu(self.fc(x)), self.by)

    model, x = Model().eval(), torch.randn(8, 64)
    before = _subs()
    with torch.no_grad():
        y = torch.compile(model, backend="pdlkit")(x)
        assert torch.allclose(y, model(x), atol=1e-6)
    assert _subs() - before == 1  # linear + relu
