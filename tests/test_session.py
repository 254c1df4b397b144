"""A backend's compile session: its call sites (freed with the optimized model), reports, warnings."""

from __future__ import annotations

import gc
import threading
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from conftest import make_folders
from pdlkit.runtime_abi import sites
from pdlkit.runtime_abi.sites import CallSite

import pdlkit
from pdlkit.backend import PdlkitBackend
from pdlkit.optimized import session_of
from pdlkit.session import CompileSession

KERNEL = """
@pdlkit.kernel(op="lin_relu", meta=meta)
def k_session(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(torch.nn.functional.linear(x, w, b))
"""


class TwoLinearRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(torch.relu(self.a(x))))


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    return make_folders(tmp_path, KERNEL, op="lin_relu", act="relu")


def test_session_lists_the_sites_its_compilation_made_in_graph_order(folders):
    p, k = folders
    f = pdlkit.optimize(TwoLinearRelu().eval(), patterns=p, kernels=k, default_codegen="eager")
    with torch.no_grad():
        f(torch.randn(2, 8))
    sites = session_of(f).sites()
    assert [cs.kernel.name for cs in sites] == ["k_session", "k_session"]
    assert [cs.node for cs in sites] == sorted(cs.node for cs in sites)  # relu, relu_1


def test_two_optimized_models_have_sessions_of_their_own(folders):
    p, k = folders
    x = torch.randn(2, 8)
    f = pdlkit.optimize(TwoLinearRelu().eval(), patterns=p, kernels=k, default_codegen="eager")
    g = pdlkit.optimize(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(),
                        patterns=p, kernels=k, default_codegen="eager")  # fmt: skip
    with torch.no_grad():
        f(x)
        g(x)
    assert len(session_of(f).sites()) == 2
    assert len(session_of(g).sites()) == 1
    assert not set(map(id, session_of(f).sites())) & set(map(id, session_of(g).sites()))


def test_sites_are_freed_with_the_optimized_model(folders):
    p, k = folders
    f = pdlkit.optimize(TwoLinearRelu().eval(), patterns=p, kernels=k, default_codegen="eager")
    with torch.no_grad():
        f(torch.randn(2, 8))
    refs = [weakref.ref(cs) for cs in session_of(f).sites()]
    assert len(refs) == 2
    del f
    torch._dynamo.reset()  # drops the compiled frames, and with them the backend and its session
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_a_session_keeps_the_graph_modules_that_own_its_sites() -> None:
    # torch 2.11 with Inductor's freezing: the compiled code did not hold the graph module, so
    # the first garbage collection freed its sites while the code still passed their ids
    session = CompileSession()
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    with session.compiling():
        sid = sites.new_site(CallSite(None, "p (f.pdl.mlir:1)", "n", "", lambda *a: None), gm)
    del gm
    gc.collect()
    assert sites.site(sid) is not None
    del session
    gc.collect()
    assert sites.site(sid) is None


def test_explain_reads_its_reports_from_the_session(folders):
    p, k = folders
    report = pdlkit.explain(TwoLinearRelu().eval(), torch.randn(2, 8), patterns=p, kernels=k)
    assert [s.kernel for g in report.graphs for s in g.substitutions] == ["k_session"] * 2


def test_a_long_lived_backend_keeps_no_reports(folders):
    p, k = folders
    backend = PdlkitBackend(patterns=p, kernels=k, default_codegen="eager")
    with torch.no_grad():
        torch.compile(TwoLinearRelu().eval(), backend=backend)(torch.randn(2, 8))
    assert backend.session.graphs == 1
    assert backend.session.reports == []
    assert len(backend.session.sites()) == 2


def test_a_session_warns_once_per_key() -> None:
    session = CompileSession()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session.warn_once("pdlkit: graph 0 left to Inductor: x", key="skipped")
        session.warn_once("pdlkit: graph 1 left to Inductor: y", key="skipped")
        session.warn_once("pdlkit: another")
        session.warn_once("pdlkit: another")
    assert [str(w.message) for w in caught] == [
        "pdlkit: graph 0 left to Inductor: x",
        "pdlkit: another",
    ]


def test_threads_compiling_with_one_backend_each_note_their_sites(folders):
    p, k = folders
    backend = PdlkitBackend(patterns=p, kernels=k, default_codegen="eager")
    models = [TwoLinearRelu().eval(), torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())]
    compiled = [torch.compile(m, backend=backend) for m in models]

    def run(f):
        with torch.no_grad():
            f(torch.randn(2, 8))

    threads = [threading.Thread(target=run, args=(f,)) for f in compiled]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert backend.session.graphs == 2
    assert len(backend.session.sites()) == 3


def test_a_session_holds_the_modules_of_its_latest_graphs_only(monkeypatch) -> None:
    """The process-wide backend never goes away: it holds the modules of its last
    HELD_GRAPHS graphs, so the models it compiled before are not kept alive for ever."""
    from pdlkit import session as session_module

    monkeypatch.setattr(session_module, "HELD_GRAPHS", 2)
    session = CompileSession()
    ids = []
    for _ in range(3):
        gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
        with session.compiling():
            ids.append(
                sites.new_site(CallSite(None, "p (f.pdl.mlir:1)", "n", "", lambda *a: None), gm)
            )
        del gm
    gc.collect()
    assert [sites.site(i) is not None for i in ids] == [False, True, True]
