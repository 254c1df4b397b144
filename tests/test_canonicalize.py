"""Canonical forms: every spelling of a linear is matched by the one shipped aten.linear
pattern, and canonicalization never changes the numbers of what runs without a kernel."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_bert
from pdlkit.matcher.canonicalize import RULES, canonicalize, describe_rules, restore
from torch.fx.experimental.proxy_tensor import make_fx

import pdlkit
from pdlkit import config
from pdlkit.backend import PdlkitBackend

F = torch.nn.functional
LINEAR = config.shipped_patterns() / "cpu" / "linear.pdl.mlir"
B, S, K, N = 2, 4, 16, 24


class Spelling(torch.nn.Module):
    """One linear, written as `form`; `w` is [N, K] (nn.Linear), `w_io` is [K, N] (Conv1D)."""

    def __init__(self, form):
        super().__init__()
        torch.manual_seed(0)
        self.form = form
        self.w = torch.nn.Parameter(torch.randn(N, K))
        self.w_io = torch.nn.Parameter(torch.randn(K, N))
        self.b = torch.nn.Parameter(torch.randn(N))

    def forward(self, x):
        return self.form(self, x)


FORMS = {
    "linear": (lambda m, x: F.linear(x, m.w, m.b), 3),
    "linear_keywords": (lambda m, x: F.linear(input=x, weight=m.w, bias=m.b), 3),
    "addmm_t": (lambda m, x: torch.addmm(m.b, x, m.w.t()), 2),
    "mm_plus_bias": (lambda m, x: torch.mm(x, m.w.t()) + m.b, 2),
    "bias_plus_mm": (lambda m, x: m.b + torch.mm(x, m.w.t()), 2),
    "mm_transpose": (lambda m, x: torch.mm(x, m.w.transpose(0, 1)), 2),
    "mm_permute": (lambda m, x: torch.mm(x, m.w.permute(1, 0)), 2),
    "matmul_3d": (lambda m, x: torch.matmul(x, m.w.t()), 3),
    "matmul_3d_plus_bias": (lambda m, x: x @ m.w.t() + m.b, 3),
    "view_mm_view": (lambda m, x: (x.view(-1, K) @ m.w.t()).view(B, S, N), 3),
    "view_mm_plus_bias_view": (lambda m, x: (x.view(-1, K) @ m.w.t() + m.b).view(B, S, N), 3),
    "reshape_addmm_reshape": (
        lambda m, x: torch.addmm(m.b, x.reshape(-1, K), m.w.t()).reshape(B, S, N),
        3,
    ),
    # GPT-2's Conv1D: the weight is stored [in, out]
    "conv1d_addmm": (
        lambda m, x: torch.addmm(m.b, x.view(-1, x.size(-1)), m.w_io).view(B, S, N),
        3,
    ),
    "pre_transposed_matmul": (lambda m, x: x @ m.w_io + m.b, 3),
    "linear_of_transposed_weight": (lambda m, x: F.linear(x, m.w_io.T, m.b), 3),
}


def compile_and_run(model, x, **kw):
    reports = []
    backend = PdlkitBackend(on_report=lambda r, plan: reports.append(r), **kw)
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(x)
    return got, reports


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_spelling_of_linear_matches_the_linear_pattern(form):
    fn, rank = FORMS[form]
    model = Spelling(fn).eval()
    x = torch.randn(B, S, K) if rank == 3 else torch.randn(B * S, K)
    with torch.no_grad():
        want = model(x)
    got, reports = compile_and_run(model, x, patterns=LINEAR, default_codegen="eager")
    subs = [s for r in reports for s in r.substitutions]
    assert [(s.pattern, s.kernel.startswith("linear")) for s in subs] == [("linear", True)]
    torch.testing.assert_close(got, want, rtol=1.3e-6, atol=1e-5)


def test_product_of_two_activations_stays_a_matmul():
    def f(m, x):
        return torch.mm(x, torch.relu(m.w).t())  # the right operand is computed: no weight

    got, reports = compile_and_run(
        Spelling(f).eval(), torch.randn(8, K), patterns=LINEAR, default_codegen="eager"
    )
    assert [s for r in reports for s in r.substitutions] == []
    assert "mm" not in reports[0].canonicalized


def gelu_new(x):
    """GPT-2's NewGELU, as transformers writes it."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def all_spellings(x, x3, w, w_io, b):
    return tuple(
        [
            torch.addmm(b, x, w.t()),
            torch.mm(x, w.t()) + b,
            x3 @ w.t() + b,
            torch.matmul(x3, w.t()),
            torch.addmm(b, x3.reshape(-1, x3.shape[-1]), w_io).view(*x3.shape[:-1], -1),
            F.gelu(F.linear(x3.reshape(-1, x3.shape[-1]), w)),
            (x3.reshape(-1, x3.shape[-1]) @ w.t() + b).view(*x3.shape[:-1], -1),
            gelu_new(torch.mm(x, w.t())),
        ]
    )


def test_canonical_graph_computes_bitwise_what_the_original_did():
    # K = 768: here ATen's addmm and mm + add round differently, so the add_bias rewrite is
    # inexact and must be put back where no kernel claimed it.
    torch.manual_seed(0)
    m, k, n = 128, 768, 768
    args = (
        torch.randn(m, k),
        torch.randn(2, m // 2, k),
        torch.randn(n, k),
        torch.randn(k, n),
        torch.randn(n),
    )
    original = make_fx(all_spellings, pre_dispatch=True, tracing_mode="fake")(*args)
    gm = make_fx(all_spellings, pre_dispatch=True, tracing_mode="fake")(*args)
    fired = canonicalize(gm)
    assert fired["add_bias"] == 3 and fired["addmm"] == 2 and fired["matmul"] == 3
    assert fired["gelu_tanh"] == 1
    assert sum(1 for nd in gm.graph.nodes if nd.target is torch.ops.aten.linear.default) == 8
    assert restore(gm) == 4
    for got, want in zip(gm(*args), original(*args), strict=True):
        assert torch.equal(got, want)


def test_unmatched_canonical_forms_run_bitwise_as_eager():
    relu_only = config.shipped_patterns() / "cpu" / "linear_relu.pdl.mlir"  # matches nothing here
    torch.manual_seed(0)
    args = (torch.randn(64, 256), torch.randn(2, 32, 256), torch.randn(512, 256))
    args = (*args, torch.randn(256, 512), torch.randn(512))
    reports = []
    backend = PdlkitBackend(
        patterns=relu_only, default_codegen="eager", on_report=lambda r, p: reports.append(r)
    )
    with torch.no_grad():
        got = torch.compile(all_spellings, backend=backend)(*args)
        want = all_spellings(*args)
    # the pass merges the two identical mm(x, w.t()) and the two x3 @ w.t() before
    # canonicalizing (matcher/cse.py), so only the third bias add folds into its GEMM
    assert reports[0].canonicalized["add_bias"] == 1 and not reports[0].substitutions
    assert reports[0].canonicalized["gelu_tanh"] == 1
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_gpt2_gelu_formula_is_gelu_tanh_for_the_linear_gelu_pattern():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(K, N)).eval()
    x = torch.randn(B, K)
    fn = lambda x: gelu_new(model(x))  # noqa: E731
    reports = []
    backend = PdlkitBackend(default_codegen="eager", on_report=lambda r, p: reports.append(r))
    with torch.no_grad():
        got = torch.compile(fn, backend=backend)(x)
        want = fn(x)
    [sub] = reports[0].substitutions
    assert (sub.pattern, sub.args[-1]) == ("linear_gelu", "'tanh'")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_default_arguments_spelled_or_omitted_are_one_form():
    x, w = torch.randn(4, 8), torch.randn(6, 8)

    def omitted(x, w):
        return F.gelu(F.linear(x, w))

    def spelled(x, w):
        return F.gelu(F.linear(x, w, None), approximate="none")

    code = []
    for f in (omitted, spelled):
        gm = make_fx(f, pre_dispatch=True, tracing_mode="fake")(x, w)
        canonicalize(gm)
        code.append(gm.code)
    assert code[0] == code[1]
    assert "linear.default(x_1, w_1, None)" in code[0]
    assert "gelu.default(linear, approximate = 'none')" in code[0]


def test_rule_table_is_documented():
    text = describe_rules()
    for r in RULES:
        assert r.name in text and f"{r.before}" in text and r.after in text


@pytest.mark.parametrize("form", ["conv1d_addmm", "linear_of_transposed_weight"])
def test_pre_transposed_weight_is_packed_once_and_again_after_an_update(form):
    model = Spelling(FORMS[form][0]).eval()
    x = torch.randn(B, S, K)
    backend = PdlkitBackend(patterns=LINEAR)  # Inductor: it aliases t(w) afresh per call
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend)
        for _ in range(2):  # compile; AOT's wrapper runs the first call with its own aliases
            compiled(x)
        pdlkit.stats(reset=True)
        for _ in range(3):
            got = compiled(x)
        st = pdlkit.stats()
        if not st["kernel_calls"]:
            pytest.skip("no pre-packing kernel for linear on this host (torch without mkldnn)")
        assert (st["prepack_misses"], st["prepack_hits"]) == (0, 3)
        torch.testing.assert_close(got, model(x))
        model.w_io.add_(1.0)  # an in-place update must be seen through the transposed view
        torch.testing.assert_close(compiled(x), model(x))
    assert pdlkit.stats()["prepack_misses"] == 1


def _compiled(model: torch.nn.Module) -> tuple[list, list[str]]:
    """``model`` on random ids compiled with the shipped patterns (eager codegen), its output
    equal to eager's: the graphs' reports and the patterns substituted, sorted."""
    ids = torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        want = model(ids).last_hidden_state
    reports = []
    backend = PdlkitBackend(default_codegen="eager", on_report=lambda r, p: reports.append(r))
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    return reports, sorted(s.pattern for r in reports for s in r.substitutions)


def test_gpt2_conv1d_linears_substitute():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0
    )
    cfg.eos_token_id = 0
    reports, subs = _compiled(transformers.GPT2Model(cfg).eval())
    # c_attn, attn.c_proj, mlp.c_fc (+ NewGELU), mlp.c_proj per layer; Conv1D = view -> addmm -> view
    assert subs == ["linear"] * 6 + ["linear_gelu"] * 2
    assert sum(r.canonicalized.get("addmm", 0) for r in reports) == 8
    assert sum(r.canonicalized.get("gelu_tanh", 0) for r in reports) == 2


def test_bert_linears_substitute():
    torch.manual_seed(0)
    _, subs = _compiled(tiny_bert(num_attention_heads=4))
    # per layer: q, k, v, attention output, intermediate (+ GELU), output; then the pooler
    assert subs == ["linear"] * 11 + ["linear_gelu"] * 2


def test_pre_transposed_constant_weight_under_inductor_freezing_packs_once():
    model = Spelling(FORMS["conv1d_addmm"][0]).eval()
    x = torch.randn(B, S, K)
    with torch._inductor.config.patch(freezing=True), torch.no_grad():
        compiled = pdlkit.optimize(model, patterns=LINEAR)
        for _ in range(2):
            compiled(x)
        pdlkit.stats(reset=True)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    st = pdlkit.stats()
    if not st["kernel_calls"]:
        pytest.skip("no pre-packing kernel for linear on this host (torch without mkldnn)")
    assert (st["kernel_calls"], st["prepack_misses"], st["prepack_hits"]) == (3, 0, 3)
