"""A graph's match records kept on disk (matcher/record_memo.py), beside the re-traced graphs.

    before: a second compilation of a graph (decision cache warm, a new process) matched it
            again: bert-mini BF16, 2-core EPYC, 16 ms of its ~50 ms over Inductor's compile
    after:  the records are kept in ``<PDLKIT_CACHE_DIR or ~/.cache/pdlkit>/autotune/matches/``
            under a key that holds the whole-graph verdict's (Dynamo's graph, its inputs, the
            pattern and kernel files, the options), whether sites keep their subgraphs, the
            host's decisions file and the matcher's source; a later compilation replays them

Only graphs the whole-graph check measures have a verdict key, so only they are kept, and only
with ``autotune="cached"``, or as ``"off"`` matches for static priority's graph under that
verdict (graph_guard.STATIC; no other compilation has both). The records hold each site's
decision key and choice, and are replayed only while the decision cache still says the same
(``autotune="full"`` in another process may have measured a site again). A file that does
not parse or fit is ignored with one warning and rewritten.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

from pdlkit.kept_json import KeptJson
from pdlkit.matcher import record_memo
from pdlkit.runtime_abi import autotune

FILES = KeptJson("matches", record_memo.FORMAT, 256, "kept match records")


@functools.cache
def _code_digest() -> str:
    """The matcher and the runtime modules its choices read, by each file's name, size and
    modification time (an edit or a new install matches afresh; reading them all would cost
    a new process a few ms): every module of ``pdlkit.matcher`` and ``pdlkit.runtime_abi``."""
    import pdlkit.matcher
    import pdlkit.runtime_abi

    h = hashlib.sha256()
    for package in (pdlkit.matcher, pdlkit.runtime_abi):
        for path in sorted(Path(str(package.__file__)).parent.glob("*.py")):
            st = path.stat()
            h.update(f"{path.name} {st.st_size} {st.st_mtime_ns}|".encode())
    return h.hexdigest()


class DiskMemo:
    """record_memo.Memo over one file of :data:`FILES`."""

    def __init__(self, key: str):
        self.key = key

    def recall(self) -> dict[str, Any] | None:
        return FILES.read(self.key)

    def keep(self, body: dict[str, Any]) -> None:
        FILES.write(self.key, body)

    def ignore(self, why: Exception) -> None:
        FILES.ignore(self.key, why)


def memo(verdict_key: str, keep_sites: bool, mode: str | None) -> DiskMemo | None:
    """Where a compilation with autotune ``mode`` (None: ``PDLKIT_AUTOTUNE``'s) finds and keeps
    its records; None where it keeps none: no verdict key, ``"full"`` (it measures every site
    again), no usable decision cache. With a verdict key, ``"off"`` is static priority's
    graph under that verdict (graph_guard.STATIC)."""
    mode = autotune.resolve_mode(mode)
    if not verdict_key or mode == "full":
        return None
    host = autotune.decision_cache().path
    if host is None:
        return None
    text = f"{verdict_key}|{keep_sites}|{mode}|{host.name}|{_code_digest()}"
    return DiskMemo(hashlib.sha256(text.encode()).hexdigest()[:32])
