"""A graph's substitution records as data, so that a later compilation of the same graph with
the same plan replays them instead of matching again (pdlkit/match_store.py keeps them on disk).

    before: every compilation imported the re-traced graph into MLIR and applied every
            pattern, with each site's kernel read from the decision cache: bert-mini BF16 on a
            2-core EPYC, 6 ms of import and 10 ms of PDL application, most of what a second
            compile (decision cache warm) costs over Inductor's own
    after:  the records (pattern, kernel, arguments as node names, what each call replaces),
            the matches kept for Inductor and the silent patterns are kept with a digest of
            the graph's text; a compilation that finds them for a graph of that text replays
            them (matcher/fx_rewrite.py) with no MLIR at all

Only what matching would produce again is kept: no record with per-bucket dispatch (dynamic
dimensions), none where a site was timed on a busy host (``Tuner.unsteady``: the next compile
measures again), nothing for explain (near misses, ``--why``). A body that names a pattern or
kernel the plan lacks, a kernel of another version or a node the graph lacks is not used (said
once, and kept again). Nor is one whose sites the decision cache now decides otherwise (each
site's decision key and choice are kept; ``autotune="full"`` may have measured one again) or
whose kernel this compilation's registry does not offer (:class:`Stale`: matched again, no
warning).
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

import torch.fx as fx
from pdlkit.matcher.hedges import Stakes
from pdlkit.matcher.match import MatchSession
from pdlkit.matcher.patterns import PatternSet
from pdlkit.matcher.records import Const, ListRef, NodeRef, Record, Ref, SubRef
from pdlkit.matcher.report import GraphReport
from pdlkit.runtime_abi.autotune import KEEP
from pdlkit.runtime_abi.binding_stats import count

from pdlkit.errors import PdlkitError

FORMAT = 2  # 2: the tuner's hedges as three flags (matcher/hedges.py)


class Memo(Protocol):
    """Where substitute() finds a graph's records (``recall``) and keeps them (``keep``)."""

    def recall(self) -> dict[str, Any] | None: ...
    def keep(self, body: dict[str, Any]) -> None: ...
    def ignore(self, why: Exception) -> None: ...


class Unplain(PdlkitError, ValueError):
    """A record with no plain form (it is not kept), or a body that does not fit the graph."""


class Stale(PdlkitError, ValueError):
    """Kept records whose sites the decision cache now decides otherwise (or not at all)."""


def graph_digest(gm: fx.GraphModule) -> str:
    """The graph's text (ops, arguments, node names) as a digest: records name nodes."""
    return hashlib.sha256(str(gm.graph).encode()).hexdigest()


# -- keeping ----------------------------------------------------------------------------------


def encode(digest: str, s: MatchSession, silent: dict[str, str], tuner: Any) -> dict[str, Any]:
    """What ``recall`` needs to replay ``s``; :class:`Unplain` where it cannot be kept."""
    if tuner is not None and tuner.unsteady:
        raise Unplain("a site was timed on a busy host")
    tuned = None
    if tuner is not None:
        decided = {k: d.choice for k, d in tuner.decided.items()}
        st = tuner.stakes
        hedges = [st.kernels_instead, st.kernels_differ, st.static_differs]
        tuned = [tuner.saved_us, hedges, decided]
    kept = [_from_cache(k) for k in s.kept]
    return {"graph": digest, "records": [_record(r) for r in s.records], "kept": kept,
            "silent": silent, "tuner": tuned}  # fmt: skip


def _from_cache(tuning: str) -> str:
    """A decision as a later compilation reads it: from the decision cache ("measured: a
    3.1 us, ..." becomes "cache: a 3.1 us, ...", as autotune.Decision.describe says then)."""
    return tuning.replace("measured: ", "cache: ", 1)


def _record(r: Record) -> dict[str, Any]:
    if r.dispatch is not None:
        raise Unplain("per-bucket dispatch")
    k = r.kernel
    return {
        "pattern": r.pattern.name,
        "op": r.op,
        "kernel": [k.name, k.version, k.digest],
        "args": [_ref(a) for a in r.args],
        "outputs": [n.name for n in r.outputs],
        "slice": [n.name for n in r.slice],
        "passed_over": r.passed_over,
        "tuning": _from_cache(r.tuning),
        "after": None if r.after is None else _ref(r.after),
        "pos": list(r.pos),
    }


def _ref(r: Ref) -> list[Any]:
    if isinstance(r, NodeRef):
        return ["n", r.name, r.index]
    if isinstance(r, SubRef):
        return ["s", r.record, r.index]
    if isinstance(r, ListRef):
        return ["l", [_ref(x) for x in r.items]]
    if not _plain(r.value):
        raise Unplain(f"constant {r.value!r}")
    return ["c", r.value]


def _plain(v: Any) -> bool:
    if isinstance(v, list):
        return all(_plain(x) for x in v)
    return v is None or type(v) in (bool, int, float, str)


# -- replaying --------------------------------------------------------------------------------


def recall(
    body: dict[str, Any],
    gm: fx.GraphModule,
    digest: str,
    patterns: PatternSet,
    registry: Any,
    target: Any,
    report: GraphReport,
    tuner: Any,
) -> MatchSession:
    """A session holding the kept records for ``gm`` (the report's silent patterns and the
    tuner's totals filled in), as matching would have left it; :class:`Unplain` (or a
    KeyError / TypeError / ValueError of a malformed body) where they do not fit."""
    if body["graph"] != digest:
        raise Unplain("kept for a graph of another text")
    _still_decided(body["tuner"], tuner)
    s = MatchSession(gm, [], None, target)  # no kernel choice: nothing is matched
    by_name = {p.name: p for p in patterns.patterns}
    for r in body["records"]:
        s.records.append(_unrecord(r, s, by_name, registry))
    s.kept = [str(k) for k in body["kept"]]
    report.silent.update({str(k): str(v) for k, v in body["silent"].items()})
    if tuner is not None and body["tuner"] is not None:
        tuner.saved_us, hedges, _ = body["tuner"]
        tuner.stakes = Stakes.settled(*(bool(h) for h in hedges))
    _count_hits(s, tuner)
    count("matches_from_disk", "(whole graph)")
    return s


def _still_decided(tuned: list[Any] | None, tuner: Any) -> None:
    """:class:`Stale` unless the decision cache decides every site the records were chosen
    by (their decision keys) as it did then."""
    if tuned is None:
        if tuner is not None:
            raise Stale("kept without measurement")
        return
    if tuner is None:
        raise Stale("kept with measurement")
    for key, choice in dict(tuned[-1]).items():
        now = tuner.cache.get(key)
        if now is None or now.choice != choice:
            raise Stale(f"decision {key} changed")


def _unrecord(r: dict[str, Any], s: MatchSession, by_name: dict[str, Any], registry: Any) -> Record:
    name, version, digest = r["kernel"]
    kernel = registry.get(name)
    if kernel is None or (kernel.version, kernel.digest) != (version, digest):
        raise Unplain(f"kernel {name} v{version} is not this plan's")
    if not registry.offers(kernel):  # e.g. not capture-safe, where CUDA graphs capture
        raise Stale(f"kernel {name} is not offered here")
    return Record(
        pattern=by_name[r["pattern"]],
        op=str(r["op"]),
        kernel=kernel,
        args=[_unref(a) for a in r["args"]],
        outputs=[s.nodes[n] for n in r["outputs"]],
        slice=[s.nodes[n] for n in r["slice"]],
        passed_over=[str(p) for p in r["passed_over"]],
        tuning=str(r["tuning"]),
        after=None if r["after"] is None else _unref(r["after"]),
        pos=(int(r["pos"][0]), int(r["pos"][1])),
    )


def _unref(a: list[Any]) -> Ref:
    tag = a[0]
    if tag == "n":
        return NodeRef(str(a[1]), None if a[2] is None else int(a[2]))
    if tag == "s":
        return SubRef(int(a[1]), int(a[2]))
    if tag == "l":
        return ListRef(tuple(_unref(x) for x in a[1]))
    if tag == "c" and _plain(a[1]):
        return Const(a[1])
    raise Unplain(f"reference {a!r}")


def _count_hits(s: MatchSession, tuner: Any) -> None:
    """``stats()``' tuning hits, as the decisions read from the decision cache count them:
    one per measured site (a record with its tuning, a kept match)."""
    if tuner is None:
        return
    for r in s.records:
        if r.tuning:
            count("tuning_hits", r.kernel.name)
    for _ in s.kept:
        count("tuning_hits", KEEP)
