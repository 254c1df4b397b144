"""The run-time guards of issue 20: replaced weights, outputs sharing an input's memory,
kernels modifying their inputs, NaN through verification, the pre-pack size variable,
call sites freed with their graph, and outputs that change shape after the checked calls."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from conftest import KERNEL_HEADER, LinRelu, linear_act_pattern, write
from pdlkit.runtime_abi import binding
from pdlkit.runtime_abi.prepack import PrepackCache
from pdlkit.runtime_abi.verify import compare

import pdlkit


class Net(LinRelu):
    """conftest's LinRelu with its forward here: the call site the errors name is this file's."""

    def forward(self, x):
        return torch.relu(self.fc(x))  # the call site the errors name


def compile_with(tmp_path, kernel_body: str, **kw):
    p, k = tmp_path / "p", tmp_path / "k"
    write(p, "a.pdl.mlir", linear_act_pattern("lr", "relu", "lin_relu"))
    write(k, "k.py", KERNEL_HEADER + kernel_body)
    torch.manual_seed(0)
    model = Net().eval()
    return model, pdlkit.optimize(model, patterns=p, kernels=k, **kw)


@contextlib.contextmanager
def call_refused(match: str) -> Iterator[None]:
    """The block, run without grad, raises a KernelCallError whose text matches ``match``."""
    with torch.no_grad(), pytest.raises(pdlkit.KernelCallError, match=match):
        yield


def kernel(name: str, body: str, decorator: str = "") -> str:
    return f"""
@pdlkit.kernel(op="lin_relu", meta=meta{decorator})
def {name}(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    {body}
"""


# -- weights replaced with `.data =` ------------------------------------------------------------

PACKED = """
def pack(w, attrs):
    return w.t().contiguous()
""" + kernel("k_packed", "return torch.relu(x @ w + b)", ", prepack=pack, prepack_arg='w'")


def test_weight_replaced_through_data_is_packed_again(tmp_path):
    model, f = compile_with(tmp_path, PACKED)
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(20):  # past the checked first calls: the direct path and its memo
            f(x)
        model.fc.weight.data = torch.randn(8, 8)  # same tensor, same version, new storage
        torch.testing.assert_close(f(x), model(x))


def test_prepack_cache_packs_again_for_a_replaced_storage():
    cache = PrepackCache()
    w = torch.nn.Parameter(torch.zeros(4, 4))
    assert cache.get("k", lambda t, a: t.clone(), w, {}).sum() == 0
    w.data = torch.ones(4, 4)
    assert cache.get("k", lambda t, a: t.clone(), w, {}).sum() == 16


# -- outputs sharing an input's memory, kernels modifying their inputs ---------------------------


@pytest.mark.parametrize(
    "body",
    [
        "return x.view(x.shape)",
        "return torch.from_numpy(x.numpy())",
        "return torch.empty(0).set_(x)",
    ],
    ids=["view", "from_numpy", "set_"],
)
def test_output_sharing_an_input_memory_is_an_error_on_the_first_call(tmp_path, body):
    model, f = compile_with(tmp_path, kernel("k_alias", body))
    x = torch.randn(2, 8)
    with call_refused(
        r"kernel 'k_alias' .* output 0 sharing memory with its input 'x' at call site relu "
        r"at .*test_runtime_hardening\.py"
    ):
        f(x)


MUTATES = kernel(
    "k_mutates",
    """y = torch.relu(x @ w.t() + b)
    x.zero_()  # right result, but the caller's input is gone
    return y""",
)


def test_first_call_verification_disables_a_kernel_that_modifies_its_input(tmp_path):
    model, f = compile_with(tmp_path, MUTATES, verify="first_call", default_codegen="eager")
    x = torch.randn(2, 8)
    before = x.clone()
    with (
        torch.no_grad(),
        pytest.warns(
            RuntimeWarning,
            match=r"kernel 'k_mutates' .* at call site relu at .*: it modified its input 'x' in place",
        ),
    ):
        got = f(x)
    assert torch.equal(x, before)
    torch.testing.assert_close(got, model(x))


def test_strict_verification_refuses_a_kernel_that_modifies_its_input(tmp_path):
    model, f = compile_with(tmp_path, MUTATES, verify=True, default_codegen="eager")
    x = torch.randn(2, 8)
    before = x.clone()
    with call_refused(r"kernel 'k_mutates' .* at call site relu at .*: it modified its input 'x'"):
        f(x)
    assert torch.equal(x, before)


# -- NaN and Inf in verification --------------------------------------------------------------


def test_verification_disables_a_kernel_that_turns_nan_into_a_number(tmp_path):
    body = "return torch.relu(x @ w.t() + b).nan_to_num(0.0)  # NaN through ReLU becomes 0"
    model, f = compile_with(
        tmp_path, kernel("k_nan_to_0", body), verify="first_call", default_codegen="eager"
    )
    x = torch.randn(2, 8)
    x[1, 0] = float("nan")
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="where the reference is NaN or Inf"):
        got = f(x)
    assert got[1].isnan().all() and not got[0].isnan().any()  # the reference's result


def test_compare_accepts_nan_and_inf_where_the_reference_has_them():
    ref = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    assert compare(ref.clone(), ref) == ""


@pytest.mark.parametrize(
    "got",
    [[0.0, float("inf"), 1.0], [float("nan"), -float("inf"), 1.0], [float("nan"), 5.0, 1.0]],
    ids=["number_for_nan", "wrong_infinity", "number_for_inf"],
)
def test_compare_refuses_other_values_where_the_reference_has_nan_or_inf(got):
    ref = torch.tensor([float("nan"), float("inf"), 1.0])
    assert "where the reference is NaN or Inf" in compare(torch.tensor(got), ref)


# -- PDLKIT_PREPACK_BYTES ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, size",
    [
        ("1GiB", 1 << 30),
        ("512M", 512 << 20),
        ("64 KiB", 64 << 10),
        ("2GB", 2 * 10**9),
        ("4096", 4096),
    ],
)
def test_prepack_bytes_takes_sizes_with_units(monkeypatch, text, size):
    monkeypatch.setenv("PDLKIT_PREPACK_BYTES", text)
    assert PrepackCache().max_bytes == size


def test_prepack_bytes_that_is_no_size_warns_and_import_succeeds():
    code = "import pdlkit.runtime_abi.prepack as p; print(p.CACHE.max_bytes)"
    env = {**os.environ, "PDLKIT_PREPACK_BYTES": "lots"}
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout.strip() == str(1 << 30)
    assert "PDLKIT_PREPACK_BYTES='lots' is not a size; expected bytes" in run.stderr
    assert "Traceback" not in run.stderr


# -- call sites live as long as their compiled graph --------------------------------------------

DECLINES = kernel("k_declines", "raise pdlkit.KernelUnsupported('not today')")


def _sites(kernel_name: str) -> list[binding.CallSite]:
    return [s for s in binding._SITES.values() if s.kernel.name == kernel_name]


@pytest.mark.parametrize("codegen", ["inductor", "eager"])
def test_call_site_outlives_garbage_collection_while_its_graph_runs(tmp_path, codegen):
    model, f = compile_with(tmp_path, DECLINES, default_codegen=codegen)
    x = torch.randn(2, 8)
    with torch.no_grad():
        f(x)
        gc.collect()
        torch.testing.assert_close(f(x), model(x))  # the site's fallback still runs
    assert len(_sites("k_declines")) == 1


@pytest.mark.parametrize("codegen", ["inductor", "eager"])
def test_call_sites_are_freed_with_their_compiled_graph(tmp_path, codegen):
    model, f = compile_with(tmp_path, DECLINES, default_codegen=codegen)
    with torch.no_grad():
        f(torch.randn(2, 8))
    del f, model
    torch._dynamo.reset()  # Dynamo keeps compiled graphs until then (or their code dies)
    gc.collect()
    assert _sites("k_declines") == []


# -- outputs that change shape or dtype after the checked calls ---------------------------------

LATE_LIAR = """
calls = [0]

@pdlkit.kernel(op="lin_relu", meta=meta)
def k_late_liar(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    calls[0] += 1
    y = torch.relu(x @ w.t() + b)
    return {lie} if calls[0] > 12 else y
"""


@pytest.mark.parametrize("codegen", ["inductor", "eager"])
@pytest.mark.parametrize(
    "lie, got", [("y[:, :4]", r"\[2, 4\] float32"), ("y.double()", r"\[2, 8\] float64")]
)
def test_output_changing_after_the_checked_calls_is_named(tmp_path, codegen, lie, got):
    model, f = compile_with(tmp_path, LATE_LIAR.format(lie=lie), default_codegen=codegen)
    x = torch.randn(2, 8)
    with call_refused(
        rf"kernel 'k_late_liar' .* returned {got} at call site relu at "
        r".*meta function declares \[2, 8\] float32"
    ):
        for _ in range(13):
            f(x)


def test_output_changing_after_the_checked_calls_is_named_with_dynamic_shapes(tmp_path):
    liar = LATE_LIAR.format(lie="y[:1]")
    model, f = compile_with(tmp_path, liar, default_codegen="eager", dynamic=True)
    with call_refused(r"'k_late_liar' .* returned \[1, 8\] float32"):
        for rows in [2, 3] * 7:
            f(torch.randn(rows, 8))


# -- the sampled output checks of a graph's sites take turns ------------------------------------


class ThreeSites(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for fc in self.fcs:
            x = torch.relu(fc(x))
        return x


def test_a_graphs_sites_run_their_sampled_output_checks_on_different_calls(tmp_path, monkeypatch):
    """After its first calls, each site checks its output in full once every CHECK_EVERY
    calls; the three sites of one graph do so on three different calls, not all on the same
    one (bert-mini's 17 sites made every 64th call about 0.85 ms slower of 5)."""
    p, k = tmp_path / "p", tmp_path / "k"
    write(p, "a.pdl.mlir", linear_act_pattern("lr", "relu", "lin_relu"))
    write(k, "k.py", KERNEL_HEADER + kernel("k_turns", "return torch.relu(x @ w.t() + b)"))
    f = pdlkit.optimize(ThreeSites().eval(), patterns=p, kernels=k)
    checked: list[list[int]] = []
    real = binding.check
    monkeypatch.setattr(binding, "check", lambda d, cs, *a: (checked[-1].append(id(cs)), real(d, cs, *a)))  # fmt: skip
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(binding._CHECK_FIRST + 2 * binding.CHECK_EVERY):
            checked.append([])
            f(x)
    sampled = checked[binding._CHECK_FIRST :]
    assert all(len(c) == 3 for c in checked[: binding._CHECK_FIRST])
    assert max(len(c) for c in sampled) == 1
    assert sorted(Counter(site for c in sampled for site in c).values()) == [2, 2, 2]
