"""JSON files that pdlkit keeps for later processes, in a folder of its private cache.

One home for what the re-traced graphs (pdlkit/trace_store.py) and the match records
(pdlkit/match_store.py) share: the folder (``<PDLKIT_CACHE_DIR or ~/.cache/pdlkit>/autotune/
<name>/``, mode 0700), atomic writes, a checksum, a format number and the key written into
each file, reading through :func:`trust.read_private_file` (data only: no pickle, no code),
and pruning the oldest files past a limit.

    files = KeptJson("traces", version=1, max_files=128, what="kept trace")
    files.write(key, {"nodes": [...]})   # False where the folder is not usable
    files.read(key)                      # the body, or None: none kept, or unusable (said once)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from pdlkit.errors import PdlkitError
from pdlkit.runtime_abi.autotune import atomic_write, cache_dir, warn_once
from pdlkit.runtime_abi.trust import TrustError, read_private_file


class Unreadable(PdlkitError, ValueError):
    """A kept file that cannot be used: it is ignored and written again."""


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class KeptJson:
    """The files of one kind (``name``), each a JSON object under its key."""

    def __init__(self, name: str, version: int, max_files: int, what: str):
        self.name, self.version, self.max_files = name, version, max_files
        self.what = what  # in warnings: "kept trace", "kept match records"

    def folder(self) -> Path | None:
        base = cache_dir()
        return None if base is None else base / self.name

    def write(self, key: str, body: dict[str, Any]) -> bool:
        """Keep ``body`` under ``key``; False (one warning) where the folder is not usable."""
        folder = self.folder()
        if folder is None:
            return False
        body = {"format": self.version, "key": key, **body}
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            atomic_write(folder / f"{key}.json", {**body, "sha256": _checksum(body)})
            self._prune(folder)
        except OSError as e:
            warn_once(f"pdlkit: could not keep a {self.what} in {folder}: {e}")
            return False
        return True

    def read(self, key: str) -> dict[str, Any] | None:
        """The body kept under ``key``, or None: none kept, one of another format (another
        pdlkit version wrote it: no warning), or one that does not parse, fails its checksum
        or was written for another key (said once, via :meth:`ignore`)."""
        folder = self.folder()
        if folder is None:
            return None
        try:
            raw = read_private_file(folder / f"{key}.json")
            if raw is None:
                return None
            data = json.loads(raw)
            body = {k: v for k, v in data.items() if k != "sha256"}
            if data.get("sha256") != _checksum(body):
                raise Unreadable("checksum does not match")
            if data.get("format") != self.version:
                return None  # another pdlkit's: expected after an upgrade, written again
            if data.get("key") != key:
                raise Unreadable("written for another key")
            return body
        except (OSError, TrustError, ValueError, AttributeError) as e:
            self.ignore(key, e)
            return None

    def ignore(self, key: str, why: Exception) -> None:
        """Say once that the file kept under ``key`` is not used, and why."""
        folder = self.folder()
        warn_once(
            f"pdlkit: ignoring the {self.what} {folder / f'{key}.json' if folder else key} "
            f"({why}); it will be written again"
        )

    def _prune(self, folder: Path) -> None:
        """The oldest files past ``max_files`` removed; another process pruning at the same
        time may remove a file first (it is then skipped)."""
        dated = []
        for p in folder.glob("*.json"):
            with contextlib.suppress(FileNotFoundError):
                dated.append((p.stat().st_mtime, p))
        for _, old in sorted(dated)[: max(0, len(dated) - self.max_files)]:
            old.unlink(missing_ok=True)
