"""verify="first_call": kernel vs replaced subgraph per site and shape; failures switch the
substitution off with a warning. pdlkit bisect: which substitution makes a model diverge."""

from __future__ import annotations

import re
import sys
import warnings

import pytest
import torch
from conftest import KERNEL_HEADER, LinRelu, linear_act_pattern, write
from pdlkit.runtime_abi.verify import compare
from torch import Tensor

import pdlkit
from pdlkit.cli import main


class Net(LinRelu):
    """conftest's LinRelu with its forward here: the call site the warnings name is this file's."""

    def forward(self, x):
        return torch.relu(self.fc(x))  # the call site the warnings name


GOOD = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_good(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b)
"""
NO_BIAS = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_no_bias(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t())  # forgot the bias
"""


def folders(tmp_path, kernel: str, manifest: str = ""):
    p, k = tmp_path / "p", tmp_path / "k"
    write(p, "a.pdl.mlir", linear_act_pattern("lr", "relu", "lin_relu"))
    if manifest:
        write(p, "m.yaml", "version: 1\npatterns:\n  - file: a.pdl.mlir\n" + manifest)
    write(k, "k.py", KERNEL_HEADER + kernel)
    return p, k


def compiled(tmp_path, kernel: str, manifest: str = "", **kw):
    p, k = folders(tmp_path, kernel, manifest)
    torch.manual_seed(0)
    model = Net().eval()
    return model, pdlkit.optimize(model, patterns=p, kernels=k, default_codegen="eager", **kw)


def test_wrong_kernel_is_disabled_for_that_shape_with_a_warning(tmp_path):
    model, f = compiled(tmp_path, NO_BIAS, verify="first_call")
    pdlkit.stats(reset=True)
    x = torch.randn(2, 8)
    with torch.no_grad():
        with pytest.warns(RuntimeWarning) as caught:
            got = f(x)
        msg = str(caught[0].message)
        assert "kernel 'k_no_bias'" in msg and "k.py:" in msg
        assert "call site relu at" in msg and "test_verify.py:" in msg and "pattern lr" in msg
        assert "max abs error" in msg and "disabled for these shapes" in msg
        torch.testing.assert_close(got, model(x), rtol=0, atol=0)  # the reference's result
        with warnings.catch_warnings():
            warnings.simplefilter(
                "error", RuntimeWarning
            )  # warned once; later calls quietly use the reference
            torch.testing.assert_close(f(x), model(x), rtol=0, atol=0)
    st = pdlkit.stats()["by_kernel"]["k_no_bias"]
    assert (st["verifications"], st["disabled"], st["kernel_calls"], st["fallbacks"]) == (
        1,
        1,
        1,
        1,
    )


def test_verification_is_per_shape(tmp_path):
    kernel = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_bad_for_3_rows(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    y = torch.relu(x @ w.t() + b)
    return y + 1 if x.shape[0] == 3 else y
"""
    model, f = compiled(tmp_path, kernel, verify="first_call", dynamic=True)
    pdlkit.stats(reset=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (2, 3, 4, 3, 2):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(f(x), model(x))
    verify_warnings = [w for w in caught if "pdlkit verify" in str(w.message)]
    assert [("[3, 8]" in str(w.message)) for w in verify_warnings] == [True]
    st = pdlkit.stats()["by_kernel"]["k_bad_for_3_rows"]
    assert (st["verifications"], st["disabled"]) == (3, 1)
    assert (st["kernel_calls"], st["fallbacks"]) == (4, 1)  # 2, 3 (verified), 4, 2; 3 falls back


def test_correct_kernel_passes_verification_and_keeps_running(tmp_path):
    model, f = compiled(tmp_path, GOOD, verify="first_call")
    pdlkit.stats(reset=True)
    x = torch.randn(2, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(3):
            torch.testing.assert_close(f(x), model(x))
    st = pdlkit.stats()["by_kernel"]["k_good"]
    assert (st["verifications"], st["disabled"], st["kernel_calls"], st["fallbacks"]) == (
        1,
        0,
        3,
        0,
    )


@pytest.mark.parametrize(
    "body, error",
    [
        ("return torch.full_like(x @ w.t(), float('nan'))", "NaN/Inf value(s) where the reference"),
        ("raise ValueError('boom')", "ValueError: boom"),
        ("return torch.relu(x @ w.t() + b)[:, :4]", "returned [2, 4] float32"),
    ],
    ids=["nan", "exception", "wrong_shape"],
)
def test_failures_of_every_kind_disable_the_substitution(tmp_path, body, error):
    kernel = f"""
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_bad(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    {body}
"""
    model, f = compiled(tmp_path, kernel, verify="first_call")
    x = torch.randn(2, 8)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match=re.escape(error)):
        torch.testing.assert_close(f(x), model(x))


def test_hang_past_the_declared_timeout_disables_the_substitution(tmp_path):
    kernel = """
import time

@pdlkit.kernel(op="lin_relu", meta=meta)
def k_slow(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    time.sleep(1.5)
    return torch.relu(x @ w.t() + b)
"""
    model, f = compiled(tmp_path, kernel, "    timeout: 0.2\n", verify="first_call")
    x = torch.randn(2, 8)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="timeout of 0.2 s"):
        torch.testing.assert_close(f(x), model(x))


OFF_BY_1E3 = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_rough(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b) * (1 + 1e-3)
"""


def test_fp32_default_tolerance_rejects_a_1e3_relative_error(tmp_path):
    model, f = compiled(tmp_path, OFF_BY_1E3, verify="first_call")
    with torch.no_grad(), pytest.warns(RuntimeWarning, match=r"rtol 1e-05"):
        f(torch.randn(2, 8))


def test_manifest_tolerance_accepts_it(tmp_path):
    model, f = compiled(tmp_path, OFF_BY_1E3, "    tolerance: {rtol: 0.01}\n", verify="first_call")
    pdlkit.stats(reset=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        f(torch.randn(2, 8))
    assert pdlkit.stats()["by_kernel"]["k_rough"]["disabled"] == 0


def test_environment_turns_verification_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PDLKIT_VERIFY", "1")
    model, f = compiled(tmp_path, NO_BIAS)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="k_no_bias"):
        torch.testing.assert_close(f(torch.zeros(2, 8)), model(torch.zeros(2, 8)))


def test_bad_verify_value_is_refused_at_optimize(tmp_path):
    with pytest.raises(ValueError, match="verify must be"):
        compiled(tmp_path, GOOD, verify="always")


def test_per_dtype_default_tolerances():
    ref = torch.tensor([100.0, -50.0])
    assert compare(ref * (1 + 5e-6), ref) == ""
    assert "exceeds" in compare(ref * (1 + 5e-5), ref)
    bref = ref.bfloat16()
    assert compare(bref * 1.005, bref) == ""
    assert "exceeds" in compare(bref * 1.05, bref)
    q = torch.tensor([10, -3, 127], dtype=torch.int8)
    assert compare(q + torch.tensor([1, -1, 0], dtype=torch.int8), q) == ""  # one step
    assert "max abs error 2" in compare(q + torch.tensor([0, 2, 0], dtype=torch.int8), q)


# -- bisect ---------------------------------------------------------------------------------------


class Three(torch.nn.Module):
    """Three linear -> relu sites; the kernel is wrong only for 16 output features."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 16)
        self.c = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x))))))


WRONG_FOR_16 = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_wrong_for_16(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    y = torch.relu(x @ w.t() + b)
    return y * 2 if w.shape[0] == 16 else y
"""


def three():
    torch.manual_seed(0)
    return Three().eval(), (torch.randn(4, 8),)


def test_bisect_names_the_diverging_substitution(tmp_path):
    p, k = folders(tmp_path, WRONG_FOR_16)
    model, inputs = three()
    result = pdlkit.bisect(model, *inputs, patterns=p, kernels=k)
    assert len(result.sites) == 3 and result.all_on and not result.all_off
    assert [c.kernel for c in result.culprits] == ["k_wrong_for_16"]
    assert "call site relu_1 at" in result.culprits[0].where  # self.b's site
    text = str(result)
    assert "diverging: kernel 'k_wrong_for_16' at call site relu_1" in text


def test_bisect_reports_agreement(tmp_path):
    p, k = folders(tmp_path, GOOD)
    model, inputs = three()
    result = pdlkit.bisect(model, *inputs, patterns=p, kernels=k)
    assert result.culprits == [] and "agrees with eager" in str(result)


def test_bisect_command(tmp_path, capsys, monkeypatch):
    p, k = folders(tmp_path, WRONG_FOR_16)
    write(
        tmp_path, "models_for_bisect.py", "import torch\nfrom test_verify import three as factory\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "test_verify", sys.modules[__name__])
    rc = main(["bisect", "models_for_bisect:factory", "--patterns", str(p), "--kernels", str(k)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "pdlkit bisect: 3 substitution(s)" in out
    assert "diverging: kernel 'k_wrong_for_16' at call site relu_1" in out


def test_bad_tolerance_in_a_manifest_names_file_and_line(tmp_path):
    p, _ = folders(tmp_path, GOOD, "    tolerance: {rtol: fast}\n")
    with pytest.raises(pdlkit.PdlkitError, match=r"m\.yaml:3:1: 'tolerance' must be"):
        pdlkit.optimize(Net(), patterns=p)


def test_verification_under_inductor_uses_the_reference_for_a_wrong_kernel(tmp_path):
    p, k = folders(tmp_path, NO_BIAS)
    torch.manual_seed(0)
    model = Net().eval()
    f = pdlkit.optimize(model, patterns=p, kernels=k, verify="first_call")  # Inductor codegen
    x = torch.randn(2, 8)
    pdlkit.stats(reset=True)
    with torch.no_grad():
        with pytest.warns(RuntimeWarning, match="k_no_bias"):
            torch.testing.assert_close(f(x), model(x))
        torch.testing.assert_close(f(x), model(x))
    st = pdlkit.stats()["by_kernel"]["k_no_bias"]
    assert (st["verifications"], st["disabled"]) == (1, 1)


def _strict_on_codes(off_by: int):
    """verify=True's check of one call of a kernel whose uint8 codes are ``off_by`` steps
    from its replaced subgraph's."""
    from pdlkit.runtime_abi.sites import CallSite
    from pdlkit.runtime_abi.verify import strict

    @pdlkit.kernel(op="codes", meta=lambda x: torch.empty_like(x))
    def k_codes(x: Tensor) -> Tensor:
        return x + off_by

    cs = CallSite(k_codes, "p (p.pdl.mlir:1)", "q", "", lambda x: x.clone(), verify=True)
    x = torch.arange(10, dtype=torch.uint8)
    return strict(cs, (x,), lambda site, args: k_codes.fn(*args))


def test_strict_verification_allows_one_quantization_step():
    """verify=True on quantized outputs: one code apart passes, as verify="first_call" and the
    kernels' own accuracy rule allow (a BF16 attention over a llama int8 graph failed before
    with max abs error 1); two codes apart is an error."""
    assert _strict_on_codes(1).tolist() == list(range(1, 11))
    with pytest.raises(Exception, match=r"differs from the replaced subgraph .* max abs error 2"):
        _strict_on_codes(2)
