"""Kernel declaration, selection, binding, run-time guards and per-call fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import KERNEL_HEADER, LinRelu, lin_kernel, linear_act_pattern, write
from pdlkit.runtime_abi.binding import bind
from pdlkit.runtime_abi.capability import Target, resolve
from pdlkit.runtime_abi.registry import KernelLoadError, KernelRegistry
from torch import Tensor

import pdlkit


class Net(LinRelu):
    """conftest's LinRelu with its forward here: the call site the errors name is this file's."""

    def forward(self, x):
        return torch.relu(self.fc(x))  # the call site the errors name


def folders(tmp_path, kernel_body: str) -> tuple[Path, Path]:
    """p/ with the linear -> relu pattern lr (calling lin_relu), k/ with ``kernel_body``."""
    p, k = tmp_path / "p", tmp_path / "k"
    write(p, "a.pdl.mlir", linear_act_pattern("lr", "relu", "lin_relu"))
    write(k, "k.py", KERNEL_HEADER + kernel_body)
    return p, k


def compile_with(tmp_path, kernel_body: str, verify: bool = False):
    p, k = folders(tmp_path, kernel_body)
    torch.manual_seed(0)
    model = Net().eval()
    return model, pdlkit.optimize(model, patterns=p, kernels=k, verify=verify)


def test_kernel_error_names_kernel_and_call_site(tmp_path):
    model, f = compile_with(
        tmp_path, lin_kernel("lin_relu", "k_broken", 'raise ValueError("boom")')
    )
    with (
        torch.no_grad(),
        pytest.raises(
            Exception,
            match=r"kernel 'k_broken' \(.*k\.py:\d+\) failed at call "
            r"site relu at .*test_runtime\.py:\d+ \(pattern lr .*\): ValueError: boom",
        ),
    ):
        f(torch.randn(2, 8))


def test_kernel_unsupported_falls_back_to_the_replaced_subgraph(tmp_path):
    picky = """
        if x.shape[0] != 3:
            raise pdlkit.KernelUnsupported("only 3 rows")
        return torch.relu(x @ w.t() + b)
    """
    model, f = compile_with(tmp_path, lin_kernel("lin_relu", "k_picky", picky))
    pdlkit.stats(reset=True)
    with torch.no_grad():
        x = torch.randn(2, 8)
        torch.testing.assert_close(f(x), model(x))
    st = pdlkit.stats()["by_kernel"]["k_picky"]
    assert (st["fallbacks"], st["kernel_calls"]) == (1, 0)


def test_output_disagreeing_with_meta_is_an_error(tmp_path):
    model, f = compile_with(
        tmp_path,
        lin_kernel("lin_relu", "k_wrong_dtype", "return torch.relu(x @ w.t() + b).double()"),
    )
    with (
        torch.no_grad(),
        pytest.raises(
            Exception, match=r"returned \[2, 8\] float64 .* meta function declares \[2, 8\] float32"
        ),
    ):
        f(torch.randn(2, 8))


def test_verify_catches_a_kernel_computing_the_wrong_function(tmp_path):
    model, f = compile_with(
        tmp_path,
        lin_kernel("lin_relu", "k_off", "return torch.relu(x @ w.t())  # forgot the bias"),
        verify=True,
    )
    with (
        torch.no_grad(),
        pytest.raises(
            Exception, match=r"pdlkit verify: kernel 'k_off' .* differs from the replaced subgraph"
        ),
    ):
        f(torch.randn(2, 8))


def test_strict_verification_is_counted_in_stats(tmp_path):
    model, f = compile_with(
        tmp_path, lin_kernel("lin_relu", "k_right", "return torch.relu(x @ w.t() + b)"), verify=True
    )
    pdlkit.stats(reset=True)
    with torch.no_grad():
        f(torch.randn(2, 8))
    assert pdlkit.stats()["verifications"] == 1


def test_declaration_is_validated_when_declared():
    with pytest.raises(
        pdlkit.KernelDeclarationError, match=r"test_runtime\.py:\d+: kernel 'k': dtypes names 'y'"
    ):

        @pdlkit.kernel(op="x", meta=lambda x: x, dtypes={"y": [torch.float32]})
        def k(x: Tensor) -> Tensor:
            return x

    with pytest.raises(pdlkit.KernelDeclarationError, match="cannot infer the kernel's schema"):

        @pdlkit.kernel(op="x", meta=lambda x: x)
        def k2(x) -> Tensor:
            return x

    with pytest.raises(pdlkit.KernelDeclarationError, match="meta takes 2 arguments, the kernel 1"):

        @pdlkit.kernel(op="x", meta=lambda x, y: x)
        def k3(x: Tensor) -> Tensor:
            return x


def test_kernel_file_errors_name_file_and_line(tmp_path):
    write(tmp_path, "bad.py", "import torch\n\nraise RuntimeError('no')\n")
    with pytest.raises(KernelLoadError, match=rf"{tmp_path}/bad\.py:3: RuntimeError: no"):
        KernelRegistry.from_folders([tmp_path])


def _decl(**kw):
    @pdlkit.kernel(op="sel", meta=lambda x: x.new_empty(x.shape), **kw)
    def k(x: Tensor) -> Tensor:
        return x.clone()

    return k


def test_selection_checks_dtype_isa_pin_and_priority():
    reg = KernelRegistry()
    plain = _decl(name="plain", dtypes={"x": [torch.float32]})
    vnni = _decl(name="vnni", requires=["avx512_vnni"], priority=5)
    reg.add(plain)
    reg.add(vnni)
    x = torch.empty(2, 2)
    assert reg.select("sel", [x], resolve("x86-avx512-vnni")).kernel is vnni
    sel = reg.select("sel", [x], resolve({"arch": "x86_64", "features": ["avx2"]}))
    assert sel.kernel is plain and sel.reasons == [
        "vnni: needs avx512_vnni, which target custom lacks"
    ]
    assert reg.select("sel", [x], resolve("x86-avx512-vnni"), pin="plain").kernel is plain
    none = reg.select("sel", [x.double()], resolve("x86-64"))
    assert none.kernel is None and "x is float64, the kernel takes float32" in none.reasons[1]


def test_shipped_kernels_pass_opcheck():
    from pdlkit import config

    reg = KernelRegistry.from_folders([config.shipped_kernels()])
    x, w, b = torch.randn(3, 4, 8), torch.randn(5, 8), torch.randn(5)
    samples = {"linear_gelu_addmm": (x, w, b, "tanh"), "linear_relu_addmm": (x, w, b)}
    assert set(samples) <= set(reg.names())  # abi-check covers every shipped kernel
    for name, args in samples.items():
        op = bind(reg.get(name))
        torch.library.opcheck(op, (*args, 0))
        ref = torch.nn.functional.linear(x, w, b)
        ref = (
            torch.nn.functional.gelu(ref, approximate="tanh") if "gelu" in name else torch.relu(ref)
        )
        torch.testing.assert_close(op(*args, 0), ref)


def test_call_outside_the_shape_rules_falls_back_for_that_call(tmp_path):
    body = "assert x.is_contiguous()\nreturn torch.relu(x @ w.t() + b)"
    contiguous_x = ', shapes={"x": {"contiguous": True}}'
    model, f = compile_with(tmp_path, lin_kernel("lin_relu", "k_contig", body, contiguous_x))
    pdlkit.stats(reset=True)
    with torch.no_grad():
        x = torch.randn(8, 2).t()  # [2, 8], not contiguous
        torch.testing.assert_close(f(x), model(x))
        torch.testing.assert_close(f(x.contiguous()), model(x))
    st = pdlkit.stats()["by_kernel"]["k_contig"]
    assert (st["fallbacks"], st["kernel_calls"]) == (1, 1)


def test_provably_violated_shape_rule_is_a_near_miss(tmp_path):
    k16 = ', shapes={"x": {"divisible": {-1: 16}}}'
    p, k = folders(
        tmp_path, lin_kernel("lin_relu", "k_k16", "return torch.relu(x @ w.t() + b)", k16)
    )
    report = pdlkit.explain(Net().eval(), torch.randn(2, 8), patterns=p, kernels=k)
    assert report.substitutions == []
    assert "k_k16: x dim -1 is 8, not a multiple of 16" in report.near_misses[0].reason


PREPACK_KERNEL = """
def pack(w, attrs):
    return w.t().contiguous()  # [K, N]: the layout this kernel reads

@pdlkit.kernel(op="lin_relu", meta=meta, prepack=pack, prepack_arg="w")
def k_packed(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w + b)
"""


def test_prepack_packs_once_and_repacks_after_an_inplace_update(tmp_path):
    model, f = compile_with(tmp_path, PREPACK_KERNEL)
    pdlkit.stats(reset=True)
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(f(x), model(x))
        model.fc.weight.mul_(2)  # bumps the tensor's version: the packed copy is stale
        torch.testing.assert_close(f(x), model(x))
    st = pdlkit.stats()
    assert (st["prepack_misses"], st["prepack_hits"]) == (2, 2)


def test_direct_calls_reuse_the_packed_weight_until_it_changes_or_is_evicted(tmp_path):
    from pdlkit.runtime_abi.prepack import CACHE

    model, f = compile_with(tmp_path, PREPACK_KERNEL)
    x = torch.randn(3, 8)
    with torch.no_grad():
        f(x)
        pdlkit.stats(reset=True)
        lookups = []
        get = CACHE.get
        CACHE.get = lambda *a, **k: lookups.append(1) or get(*a, **k)  # type: ignore[method-assign]
        try:
            for _ in range(20):  # past the first calls, which take the checked path
                torch.testing.assert_close(f(x), model(x))
        finally:
            del CACHE.get
        assert len(lookups) < 12  # the others found the packed weight in the site's memo
        model.fc.weight.mul_(2)
        for _ in range(3):
            torch.testing.assert_close(f(x), model(x))
        st = pdlkit.stats()
        assert (st["prepack_misses"], st["prepack_hits"]) == (1, 22)
        CACHE.release({"k_packed"})  # an eviction: the site's weak memo must not keep it
        torch.testing.assert_close(f(x), model(x))
    assert pdlkit.stats()["prepack_misses"] == 2


PREPACK_WITH_KERNEL = """
def pack(w, attrs):
    return torch.cat([w.t(), attrs["b"][None]])  # [K + 1, N]: the weight and the bias as one

@pdlkit.kernel(op="lin_relu", meta=meta, prepack=pack, prepack_arg="w", prepack_with=("b",))
def k_packed_with(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w[:-1] + w[-1])  # the bias as packed, not the argument
"""


def test_prepack_with_packs_again_after_an_inplace_update_of_either_tensor(tmp_path):
    model, f = compile_with(tmp_path, PREPACK_WITH_KERNEL)
    pdlkit.stats(reset=True)
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(20):  # past the checked first calls: the direct path's memo
            torch.testing.assert_close(f(x), model(x))
        model.fc.bias.add_(1)  # only the prepack_with tensor changes
        torch.testing.assert_close(f(x), model(x))
        model.fc.weight.mul_(2)
        torch.testing.assert_close(f(x), model(x))
    st = pdlkit.stats()
    assert (st["prepack_misses"], st["prepack_hits"]) == (3, 19)


def test_prepack_with_must_name_other_parameters_and_needs_a_prepack():
    with pytest.raises(
        pdlkit.KernelDeclarationError, match=r"prepack_with must name other parameters .* 'w'"
    ):

        @pdlkit.kernel(
            op="x", meta=lambda x, w: x, prepack=lambda w, a: w, prepack_arg="w", prepack_with="w"
        )
        def k(x: Tensor, w: Tensor) -> Tensor:
            return x

    with pytest.raises(pdlkit.KernelDeclarationError, match="there is no prepack"):

        @pdlkit.kernel(op="x", meta=lambda x, w: x, prepack_with=("w",))
        def k2(x: Tensor, w: Tensor) -> Tensor:
            return x


def test_prepack_cache_is_bounded():
    from pdlkit.runtime_abi.prepack import PrepackCache

    cache = PrepackCache(max_bytes=3 * 64 * 4)
    weights = [torch.randn(64) for _ in range(5)]
    pdlkit.stats(reset=True)
    for w in weights:
        cache.get("k", lambda t, a: t.clone(), w, {})
    assert len(cache) == 3 and cache.nbytes == 3 * 64 * 4
    assert pdlkit.stats()["prepack_evictions"] == 2
    del weights[:], w
    import gc

    gc.collect()
    assert len(cache) == 0  # entries die with their tensors


def test_a_transpose_made_inside_a_dispatch_mode_finds_the_tracked_views_pack():
    """Inside a dispatch mode (AOTAutograd runs a compiled graph's first call under one) a
    site's ``w.t()`` is an untracked alias: no ``_base``, a fresh version counter. Keyed by
    the weight it was made from, it shares the tracked view's entry, and an in-place update
    of the weight still packs again."""
    from pdlkit.runtime_abi.prepack import PrepackCache
    from torch.utils._python_dispatch import TorchDispatchMode

    cache, w, packs = PrepackCache(), torch.nn.Parameter(torch.randn(4, 3)), []

    def pack(t, attrs):
        packs.append(t)
        return t.clone()

    class Below(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.mm.default:
                alias = args[1].t()
                assert alias._base is None and alias._version == 0
                self.got = cache.get("k", pack, alias, {}, view_of=args[1])
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        w.add_(1)  # a version other than a fresh counter's
        mode = Below()
        with mode:
            torch.mm(torch.randn(2, 4), w)
        assert cache.get("k", pack, w.t(), {}) is mode.got and len(packs) == 1
        with mode:
            torch.mm(torch.randn(2, 4), w)
        assert len(packs) == 1
        w.add_(1)
        with mode:
            torch.mm(torch.randn(2, 4), w)
        assert len(packs) == 2 and cache.get("k", pack, w.t(), {}) is mode.got
        other = torch.randn(3, 4)  # not a view of the weight named: keyed by itself
        cache.get("k", pack, other, {}, view_of=w)
        assert len(packs) == 3


def test_a_kernel_whose_isa_was_turned_off_says_so():
    reg = KernelRegistry()
    reg.add(_decl(name="plain"))
    reg.add(_decl(name="k_amx", requires=["amx_int8"], priority=9))
    host = Target("host", "x86_64", frozenset({"avx2"}), turned_off=frozenset({"amx_int8"}))
    sel = reg.select("sel", [torch.empty(2, 2)], host)
    assert sel.kernel.name == "plain"
    assert sel.reasons == ["k_amx: needs amx_int8, turned off by PDLKIT_FEATURES_OFF"]


def test_explain_names_the_kernel_passed_over_and_why(tmp_path):
    relu = "return torch.relu(x @ w.t() + b)"
    amx = lin_kernel("lin_relu", "k_amx", relu, ', requires=["amx_int8"], priority=9')
    v2 = lin_kernel("lin_relu", "k_any", relu, ", version=2")
    v1 = lin_kernel("lin_relu", "k_any_v1", relu, ', name="k_any"')
    p, k = folders(tmp_path, amx + v2 + v1)
    report = pdlkit.explain(
        Net().eval(), torch.randn(2, 8), patterns=p, kernels=k, target="x86-avx512-vnni"
    )
    (sub,) = report.substitutions
    assert sub.kernel == "k_any" and "k_any v2" in " ".join(report.kernels)
    assert sub.passed_over == ["k_amx: needs amx_int8, which target x86-avx512-vnni lacks"]
    assert "relu: passed over k_amx: needs amx_int8" in report.format(verbose=True)


def test_same_kernel_name_and_version_twice_is_refused(tmp_path):
    body = KERNEL_HEADER + lin_kernel("lin_relu", "k_twin", "return x")
    write(tmp_path / "a", "one.py", body)
    write(tmp_path / "a", "two.py", body)
    with pytest.raises(
        KernelLoadError,
        match=r"two\.py:\d+: kernel 'k_twin' version 1 is already declared at .*one\.py",
    ):
        KernelRegistry.from_folders([tmp_path / "a"])


def test_missing_kernel_folder_is_named(tmp_path):
    with pytest.raises(KernelLoadError, match=rf"{tmp_path}/nope: kernel folder does not exist"):
        KernelRegistry.from_folders([tmp_path / "nope"])


def test_repeated_fallbacks_run_inductor_compiled_reference(tmp_path, monkeypatch):
    from pdlkit.runtime_abi import binding

    # a process whose kernels ran on one thread (earlier tests may have run them on several,
    # which makes every fallback keep interpreting: runtime_abi/fallback.py)
    monkeypatch.setattr(binding.THREADS, "many", False)
    model, f = compile_with(
        tmp_path, lin_kernel("lin_relu", "k_never", 'raise pdlkit.KernelUnsupported("not today")')
    )
    pdlkit.stats(reset=True)
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(f(x), model(x))
    (site,) = [s for s in binding._SITES.values() if s.kernel.name == "k_never"]
    assert site.fallback.compiled_signatures == 1 and not site.fallback.compile_error
    assert pdlkit.stats()["by_kernel"]["k_never"]["fallbacks"] == 3


_DIRECT_KERNEL = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_direct(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x @ w.t() + b)
"""


class _CountDispatcher:
    """Counts the calls of one op that went through the dispatcher (its ``_op``)."""

    def __init__(self, op):
        self.op, self.real, self.calls = op, op._op, 0

    def __enter__(self):
        def counted(*args, **kwargs):
            self.calls += 1
            return self.real(*args, **kwargs)

        self.op._op = counted
        return self

    def __exit__(self, *exc):
        self.op._op = self.real


def test_compiled_kernel_calls_skip_the_dispatcher(tmp_path):
    model, f = compile_with(tmp_path, _DIRECT_KERNEL)
    x = torch.randn(2, 8)
    with torch.no_grad():
        f(x)  # compiles
        pdlkit.stats(reset=True)
        with _CountDispatcher(torch.ops.pdlkit.k_direct.default) as d:
            for _ in range(5):
                torch.testing.assert_close(f(x), model(x))
    assert (d.calls, pdlkit.stats()["by_kernel"]["k_direct"]["kernel_calls"]) == (0, 5)


def test_dispatch_modes_profiler_and_autograd_still_see_the_kernel_op(tmp_path):
    from pdlkit.runtime_abi import binding
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with torch.no_grad():  # an inference graph: the op binds without autograd
        compile_with(tmp_path, _DIRECT_KERNEL)[1](torch.randn(2, 8))
    op = torch.ops.pdlkit.k_direct.default
    site = next(i for i, s in binding._SITES.items() if s.kernel.name == "k_direct")
    x, w, b = torch.randn(2, 8), torch.randn(8, 8), torch.randn(8)
    want = torch.relu(x @ w.t() + b)
    with torch.no_grad(), _CountDispatcher(op) as d:
        torch.testing.assert_close(op(x, w, b, site), want)
        with Log() as log:
            got = op(x, w, b, site)
        torch.testing.assert_close(got, want)
        with torch.profiler.profile() as prof:
            op(x, w, b, site)
        traced = torch.jit.trace(lambda x, w, b: op(x, w, b, site), (x, w, b), check_trace=False)
    assert log.ops[0] == "pdlkit.k_direct.default"  # then the kernel's own aten ops
    assert "pdlkit::k_direct" in {e.key for e in prof.key_averages()}
    assert "pdlkit::k_direct" in str(traced.graph)
    assert d.calls == 3  # the mode's call, the profiled one and the traced one
    # autograd must see a call whose inputs require grad
    with _CountDispatcher(op) as d:
        op(x, w.requires_grad_(), b, site)
    assert d.calls == 1


def test_kernel_op_called_by_hand_is_checked_by_the_dispatcher(tmp_path):
    with torch.no_grad():
        compile_with(tmp_path, _DIRECT_KERNEL)[1](torch.randn(2, 8))  # binds the op
    op = torch.ops.pdlkit.k_direct.default
    x, w, b = torch.randn(2, 8), torch.randn(8, 8), torch.randn(8)
    with torch.no_grad(), _CountDispatcher(op) as d:
        torch.testing.assert_close(op(x, w, b, 10**9), torch.relu(x @ w.t() + b))  # no such site
        with pytest.raises(RuntimeError, match="pdlkit_site"):
            op(x, w, b, "not a site")
    assert d.calls == 2


def test_a_call_whose_site_is_gone_is_counted():
    """A kernel called with an id no site has (by hand, or a compiled graph whose site was
    freed): it still runs and checks its output, and stats() counts it, so a lost site shows."""
    from pdlkit import config

    op = bind(KernelRegistry.from_folders([config.shipped_kernels()]).get("linear_relu_addmm"))
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    pdlkit.stats(reset=True)
    torch.testing.assert_close(op(x, w, b, 0), torch.relu(torch.nn.functional.linear(x, w, b)))
    st = pdlkit.stats()
    assert st["calls_without_site"] == 1
    assert st["by_kernel"]["linear_relu_addmm"]["calls_without_site"] == 1


def test_binding_a_kernel_does_not_walk_the_imported_modules(tmp_path, monkeypatch):
    """torch.library.register_fake's caller lookup walks sys.modules (25 ms per op in a process
    with transformers loaded); binding registers the fake function without it."""
    import inspect

    def walk(*args, **kwargs):
        raise AssertionError("inspect.getmodule called while binding")

    _, k = folders(tmp_path, _DIRECT_KERNEL.replace("k_direct", "k_no_walk"))
    decl = KernelRegistry.from_folders([k]).get("k_no_walk")
    with monkeypatch.context() as m:
        m.setattr(inspect, "getmodule", walk)
        op = bind(decl)
    x, w, b = torch.randn(2, 8), torch.randn(4, 8), torch.randn(4)
    with torch._subclasses.FakeTensorMode() as mode:  # the fake function is registered
        out = op(*(mode.from_tensor(t) for t in (x, w, b)), 0)
    assert (out.shape, out.dtype) == (torch.Size([2, 4]), torch.float32)
