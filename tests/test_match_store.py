"""Match records kept on disk (pdlkit/match_store.py, matcher/record_memo.py): a later
compilation of a measured graph replays them instead of matching again.

The subject is autotune_chain.py's matmul chain with its fast kernel, whose substituted graph
wins the whole-graph check by an order of magnitude (so the verdict is "substituted")."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
from autotune_chain import FAST, Chain, calls, inputs, run
from conftest import counted_calls
from pdlkit.matcher import record_memo
from pdlkit.matcher.hedges import Stakes
from pdlkit.matcher.to_mlir import GraphImporter
from pdlkit.runtime_abi import autotune
from pdlkit.runtime_abi.registry import Restricted

from pdlkit import kept_json, match_store
from pdlkit.backend import run_pass
from pdlkit.plan import Options, load_plan


@pytest.fixture
def imports(monkeypatch) -> list[object]:
    """The graphs imported into MLIR (matched) from now on."""
    return counted_calls(monkeypatch, GraphImporter, "import_graph")


def _kept(folders_root) -> list:
    return sorted((folders_root / "cache" / "autotune" / "matches").glob("*.json"))


def test_a_second_compilation_replays_the_kept_records_instead_of_matching(
    folders, imports, tmp_path
):
    p, k = folders(FAST)
    first = run(p, k, "cached")
    assert len(_kept(tmp_path)) == 1 and first["matches_from_disk"] == 0
    imports.clear()
    second = run(p, k, "cached")
    assert imports == [] and second["matches_from_disk"] == 1
    assert second["substitutions"] == first["substitutions"] == 1
    assert calls(second, "fast_chain") == 1 and second["tuning_hits"] == 1


def _pass(p, k, key: str, refuse=None):
    """Dynamo's graph of the chain through run_pass with ``key`` as its verdict key (and a
    registry that offers only the kernels ``refuse`` finds nothing against)."""
    plan = load_plan(Options(patterns=p, kernels=k))
    if refuse is not None:
        plan = dataclasses.replace(plan, registry=Restricted(plan.registry, refuse))
    got = []

    def backend(gm, example_inputs):
        got.append(run_pass(gm, example_inputs, plan, autotune="cached", near_misses=False,
                            verdict_key=key))  # fmt: skip
        return gm.forward

    torch._dynamo.reset()
    torch.compile(Chain(), backend=backend)(*inputs())
    ((traced, report),) = got
    return traced, report


def test_replayed_records_make_the_graph_matching_made(folders, imports):
    """input: the chain; kept: its one record; expected: the same rewritten graph (site ids
    included: they are stable across compilations) and the same substitution report."""
    p, k = folders(FAST)
    matched, before = _pass(p, k, "chain")
    assert len(imports) == 1 and before.timings["recalled"] == 0.0
    replayed, after = _pass(p, k, "chain")
    assert len(imports) == 1 and after.timings["recalled"] > 0.0  # not matched again
    assert replayed.print_readable(print_output=False) == matched.print_readable(print_output=False)
    assert "pdlkit.fast_chain" in replayed.code
    assert [vars(s) for s in after.substitutions] == [
        {**vars(s), "tuning": s.tuning.replace("measured: ", "cache: ")}
        for s in before.substitutions
    ]
    assert after.silent == before.silent


def test_a_kept_record_whose_kernel_this_compilation_may_not_use_is_not_replayed(folders, imports):
    """Where CUDA graphs capture the graph only capture-safe kernels are offered (a restricted
    registry): a record kept without that restriction is matched again, not replayed."""
    p, k = folders(FAST)
    _pass(p, k, "restricted")
    imports.clear()
    traced, report = _pass(p, k, "restricted", refuse=lambda kernel: "not capture-safe")
    assert len(imports) == 1 and report.substitutions == []
    assert "pdlkit.fast_chain" not in traced.code


@pytest.mark.parametrize("damage", ["truncated", "another graph", "another kernel"])
def test_kept_records_that_do_not_fit_are_ignored_with_one_warning_and_kept_again(
    folders, imports, tmp_path, damage
):
    p, k = folders(FAST)
    run(p, k, "cached")
    (path,) = _kept(tmp_path)
    data = json.loads(path.read_text())
    body = {key: v for key, v in data.items() if key != "sha256"}
    if damage == "another graph":
        body["graph"] = "0" * 64
    elif damage == "another kernel":
        body["records"][0]["kernel"][1] += 1  # a version this plan's kernel is not
    text = json.dumps({**body, "sha256": kept_json._checksum(body)})
    path.write_text(text[:-40] if damage == "truncated" else text)
    imports.clear()
    with pytest.warns(UserWarning, match="ignoring the kept match records") as seen:
        st = run(p, k, "cached")
    assert len([w for w in seen if "kept match records" in str(w.message)]) == 1
    assert len(imports) == 1 and st["matches_from_disk"] == 0 and calls(st, "fast_chain") == 1
    imports.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # kept again, well formed: read without a word
        assert run(p, k, "cached")["matches_from_disk"] == 1
    assert imports == []


def test_full_matches_and_measures_again_and_neither_reads_nor_keeps_records(
    folders, imports, tmp_path
):
    p, k = folders(FAST)
    run(p, k, "cached")
    (path,) = _kept(tmp_path)
    path.write_text("{}")  # "full" would warn if it read it
    imports.clear()
    with warnings.catch_warnings():
        # only the warning reading the file would give (a busy CI host may warn about timing)
        warnings.filterwarnings("error", message="pdlkit: ignoring the kept", category=UserWarning)
        st = run(p, k, "full")
    assert len(imports) == 1 and st["matches_from_disk"] == 0 and st["tuning_misses"] == 1
    assert path.read_text() == "{}" and _kept(tmp_path) == [path]


def test_records_of_a_site_the_decision_cache_now_decides_otherwise_are_not_replayed(
    folders, imports, tmp_path, monkeypatch
):
    """Another process measured the site again (``autotune="full"``) and found the subgraph
    faster: the kept records (a kernel there) are stale, matched again without a warning."""
    p, k = folders(FAST)
    run(p, k, "cached")
    (decisions,) = (tmp_path / "cache" / "autotune").glob("host-*.json")
    data = json.loads(decisions.read_text())
    (site,) = [key for key, d in data["decisions"].items() if d["choice"] == "fast_chain"]
    data["decisions"][site]["choice"] = "subgraph"
    decisions.write_text(json.dumps(data))
    monkeypatch.setattr(autotune, "_CACHES", {})  # read afresh, as by a new process
    imports.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        st = run(p, k, "cached")
    assert len(imports) == 1 and st["matches_from_disk"] == 0
    assert st["substitutions"] == 0 and calls(st, "fast_chain") == 0


class _Tuner:
    unsteady = False
    saved_us = 10.0
    stakes = Stakes.settled(kernels_instead=True, kernels_differ=False, static_differs=True)
    decided = {"site": autotune.Decision("fast_chain")}


def test_records_a_later_matching_might_not_make_again_are_not_kept(folders):
    """A site timed on a busy host is measured again by the next compilation; a record with
    per-bucket dispatch (dynamic dimensions) holds a run-time choice: neither is kept."""
    p, k = folders(FAST)
    _, report = _pass(p, k, "kept")
    s = record_memo.MatchSession(torch.fx.symbolic_trace(Chain()), [], None, None)
    busy = _Tuner()
    busy.unsteady = True
    with pytest.raises(record_memo.Unplain, match="busy host"):
        record_memo.encode("d", s, {}, busy)
    assert record_memo.encode("d", s, {}, _Tuner())["tuner"] == [
        10.0,
        [True, False, True],
        {"site": "fast_chain"},
    ]


def test_records_another_pdlkit_kept_in_another_format_are_matched_again_without_a_word(
    folders, imports, tmp_path
):
    p, k = folders(FAST)
    run(p, k, "cached")
    (path,) = _kept(tmp_path)
    data = json.loads(path.read_text())
    body = {key: v for key, v in data.items() if key != "sha256"} | {"format": 1}
    path.write_text(json.dumps({**body, "sha256": kept_json._checksum(body)}))
    imports.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = run(p, k, "cached")
    assert len(imports) == 1 and st["matches_from_disk"] == 0 and calls(st, "fast_chain") == 1
    assert json.loads(path.read_text())["format"] == record_memo.FORMAT  # kept again


def test_no_records_are_kept_without_a_verdict_key_or_with_full():
    assert match_store.memo("", True, "cached") is None
    assert match_store.memo("", True, "off") is None  # autotune="off" as a user asks for it
    a, b = match_store.memo("key", True, "cached"), match_store.memo("key", False, "cached")
    assert a is not None and b is not None and a.key != b.key  # kernels-only: its own records
    static = match_store.memo("key", True, "off")  # static priority's graph won the check
    assert static is not None and static.key not in (a.key, b.key)
    assert match_store.memo("key", True, "full") is None  # measures every site again
