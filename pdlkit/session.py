"""A compile session: what one backend's compilations leave behind, in one object.

    before: bisect found the call sites a compilation made by diffing the process-wide site
            table before and after it; explain collected reports through a callback; the
            "nothing is substituted" warning was once per process
    after:  backend = PdlkitBackend(...); torch.compile(model, backend=backend)(x)
            backend.session.sites()     # the live call sites its compilations made, in order
            backend.session.reports     # (GraphReport, Plan) per graph, where kept (explain)

Every :class:`~pdlkit.backend.PdlkitBackend` has one (``pdlkit.optimize`` makes a backend per
call; ``torch.compile(model, backend="pdlkit")`` uses the one process-wide backend). Each graph
module that a compilation rewrote owns its call sites (runtime_abi/sites.py), and the session
holds those modules: the sites live as long as the backend, which Dynamo's compiled frames and
the optimized model hold. The compiled code alone did not keep them:

    before: on torch 2.11 with Inductor's freezing (PyTorch's int8 path, and pdlkit's with it),
            the code Inductor returns does not keep the graph module alive (seen on the GPU
            machine's host: bert-mini and BERT-base int8 PT2E, with a gc.collect()); the first
            garbage collection after a compile freed the module and its sites while the code
            ran on. Every pdlkit call then found no site: the whole output check and a
            pre-pack lookup on every call, and a kernel that declines raised instead of
            running the replaced subgraph (on CUDA without freezing the code kept it:
            Llama int8 on the H100, every site there after a collection)
    after:  the session holds the modules; ``optimize``'s backend frees them with the model,
            the process-wide backend keeps those of its last ``HELD_GRAPHS`` graphs

Process-wide on purpose, and not here:

* the id -> call site table (runtime_abi/sites.py): compiled code passes a site's integer id
  through a ``torch.ops.pdlkit`` op, whose one Python body serves every graph and session;
* the ``torch.ops.pdlkit`` registrations (runtime_abi/binding.py): torch.library is per process;
* the pre-pack cache and its memory bound (runtime_abi/prepack.py), and the record of which
  kernels each pattern / kernel folder uses (pdlkit/plan.py): one bound for the process;
* loaded pattern sets and kernel files (pdlkit/plan.py, runtime_abi/registry.py), keyed by
  their files' contents: immutable once loaded, and reused so that a second ``optimize`` of
  the same folders does not parse or execute them again (a kernel file's module is
  registered in ``sys.modules`` under its digest);
* re-traced graphs (pdlkit/retrace.py), keyed by Dynamo's graph and its inputs' shapes, a
  few, least recently used dropped: Dynamo's graph decides the trace, not a backend, and a
  second compilation of it (``torch._dynamo.reset()``, a new ``optimize``) copies it (and a
  new process reads it from disk: pdlkit/trace_store.py);
* the warning that an optional dependency (torch-mlir) is missing: a fact about the process,
  said once per process (``warn_once(..., process_wide=True)``);
* the spin kernel's cycles per second, per GPU (runtime_abi/cuda_timing.py): a fact about
  the device, timed once.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pdlkit.runtime_abi import sites
from pdlkit.runtime_abi.sites import CallSite

# the graphs whose modules a session holds, the latest compiled: a bound for the process-wide
# backend of torch.compile(backend="pdlkit"), which never goes away and would otherwise keep
# every model it compiled alive; an older graph's sites then live as long as its code holds
# its module (on torch 2.11 with freezing: not long; stats()["calls_without_site"] counts)
HELD_GRAPHS = 64


class CompileSession:
    """The call sites, reports and warnings of one backend's compilations."""

    def __init__(self, keep_reports: bool = False) -> None:
        # per compiled graph with call sites, in completion order: its sites and their modules
        self._graph_sites: list[sites.Noted] = []
        self.keep_reports = keep_reports  # explain reads them; a long-lived backend drops them
        self.reports: list[tuple[Any, Any]] = []  # (GraphReport, Plan) per compiled graph
        self.graphs = 0  # graphs compiled so far (a report's index)
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    @contextmanager
    def compiling(self) -> Iterator[int]:
        """The block compiles one graph: the call sites registered in it, in this context,
        are this session's once it ends. Yields the graph's index. Each compilation notes
        its sites in a list of its own, so that threads compiling at once do not race."""
        with self._lock:
            index = self.graphs
            self.graphs += 1
        mine = sites.Noted()
        try:
            with sites.noting(mine):
                yield index
        finally:
            with self._lock:
                self._graph_sites += [mine] if mine.sites else []
                for old in self._graph_sites[:-HELD_GRAPHS]:
                    old.owners.clear()  # its sites go with their module, weakly held
                self._graph_sites = [g for g in self._graph_sites if g.owners or g.live()]

    def sites(self) -> list[CallSite]:
        """The live call sites this session's compilations made, graph by graph (in the
        order the compilations ended), in graph order within a graph."""
        with self._lock:
            refs = [r for g in self._graph_sites for r in g.sites]
        return [cs for cs in (r() for r in refs) if cs is not None]

    def report(self, report: Any, plan: Any) -> None:
        """Note a graph's report (kept only where ``keep_reports``)."""
        if self.keep_reports:
            with self._lock:
                self.reports.append((report, plan))

    def warn_once(
        self,
        message: str,
        key: str | None = None,
        stacklevel: int = 2,
        process_wide: bool = False,
    ) -> None:
        """Warn with ``message`` unless this session already warned under ``key`` (default:
        the message itself); ``stacklevel`` as the caller would give ``warnings.warn``.
        ``process_wide``: a fact about the process (an optional dependency is missing),
        said once per process whatever the session."""
        key = message if key is None else key
        warned, lock = (
            (_PROCESS_WARNED, _PROCESS_LOCK) if process_wide else (self._warned, self._lock)
        )
        with lock:
            if key in warned:
                return
            warned.add(key)
        warnings.warn(message, stacklevel=stacklevel + 1)


# warnings about the process rather than one backend's compilations (see warn_once)
_PROCESS_WARNED: set[str] = set()
_PROCESS_LOCK = threading.Lock()
