"""Kernel choice by measurement on this host, and the on-disk cache of the decisions.

    before (``autotune="off"``):    the eligible kernel of highest priority wins every site
    after  (``autotune="cached"``): the fastest of {every eligible kernel, keeping the
                                    replaced subgraph for Inductor} wins, per host and shape

This module times callables and remembers what won; what the candidates are and how a
site's arguments are made real is :mod:`pdlkit.matcher.choose`'s job.

* **Timing** (:func:`measure`): each candidate runs on the same arguments, warm-up first,
  then samples taken round-robin over the candidates (a burst of load on a shared machine
  hits them all alike); the median of each is compared. On CUDA the samples are CUDA
  events on the current stream. A per-site budget (``PDLKIT_AUTOTUNE_BUDGET`` seconds,
  default 2) stops sampling; a candidate that raises is excluded with its reason.
* **Decision cache**: one JSON file per host (CPU model, ISA flags, torch/triton versions,
  GPU name and SM count) under ``PDLKIT_CACHE_DIR`` (default ``~/.cache/pdlkit``), keyed
  by the site's key (candidates' identities, shapes with dynamic dims bucketed, dtypes,
  threads). Writes merge under a file lock and replace the file atomically, so processes
  compiling at once lose nothing; an unreadable file is ignored with one warning and
  rewritten. A decision only says which implementation runs, never what it computes.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import math
import os
import platform
import stat
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pdlkit.runtime_abi import capability
from pdlkit.runtime_abi.cuda_timing import gpu_seconds, issued_seconds

from pdlkit.errors import PdlkitError

MODES = ("cached", "off", "full")
MODE_ENV = "PDLKIT_AUTOTUNE"
CACHE_ENV = "PDLKIT_CACHE_DIR"
BUDGET_ENV = "PDLKIT_AUTOTUNE_BUDGET"
# how "keep the subgraph" is timed on the CPU (matcher/lowered.py): "proxy" (Inductor's library
# calls, the rest eagerly: no compile) or "compile" (the subgraph compiled by Inductor)
SUBGRAPH_ENV = "PDLKIT_AUTOTUNE_SUBGRAPH"
SUBGRAPH_MODES = ("proxy", "compile")
KEEP = "subgraph"  # the candidate that leaves the replaced ops to Inductor
_FORMAT = 1
_MAX_ENTRIES = 20_000
# a kernel must beat the subgraph by this fraction: on a tie pdlkit keeps Inductor's code
MARGIN = 0.03
# the kernels-only graph's tie (matcher/graph_guard.py's third candidate): kernels within this
# of a site's fastest go by priority there. Timed one site at a time, kernels this close did not
# always rank as the model ran them (a Xeon with AMX, one thread, single runs: ViT BF16 with one
# kind of site on oneDNN's linear ran 0.930x BF16 Inductor's time, with pdlkit's AMX kernel at
# every site 0.897x; BERT-base BF16's oneDNN sites, 25% ahead per site, were faster in the model
# too; the first of these is within the 4-9% that x86_models.py measured between static
# priority and pdlkit running the same kernels, x86_models_xeon_dev_rotated_33cccdc.md, so it is
# weak evidence). The whole-graph timing decides between the graphs.
KERNELS_TIE = 0.15


class AutotuneError(PdlkitError, ValueError):
    """A bad ``autotune=`` value or ``PDLKIT_AUTOTUNE`` / ``PDLKIT_AUTOTUNE_BUDGET`` /
    ``PDLKIT_AUTOTUNE_SUBGRAPH`` setting."""


def resolve_mode(value: str | None) -> str:
    """``autotune=`` argument, else ``PDLKIT_AUTOTUNE``, else ``"cached"``."""
    if value is None:
        value = os.environ.get(MODE_ENV, "").strip() or "cached"
        where = f"{MODE_ENV}={value!r}"
    else:
        where = f"autotune={value!r}"
    if value not in MODES:
        raise AutotuneError(f"{where}: expected one of {', '.join(MODES)}")
    if value != "off":
        subgraph_mode()
    return value


def subgraph_mode() -> str:
    """``PDLKIT_AUTOTUNE_SUBGRAPH``: ``proxy`` (the default) or ``compile``."""
    raw = os.environ.get(SUBGRAPH_ENV, "").strip() or "proxy"
    if raw not in SUBGRAPH_MODES:
        raise AutotuneError(f"{SUBGRAPH_ENV}={raw!r}: expected one of {', '.join(SUBGRAPH_MODES)}")
    return raw


def budget_s() -> float:
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return 2.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise AutotuneError(f"{BUDGET_ENV}={raw!r}: expected a positive number of seconds")
    return value


# -- what a decision is keyed by ------------------------------------------------------------------


@functools.cache
def host_key() -> dict[str, Any]:
    """What makes one machine's timings differ from another's (threads are per site)."""
    key: dict[str, Any] = {"machine": platform.machine(), "torch": torch.__version__}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in ("model name", "flags", "Features", "CPU part") and name not in key:
            key[name] = " ".join(sorted(value.split())) if name != "model name" else value.strip()
    off = capability.host().turned_off
    if off:  # the same CPU with AMX turned off times other kernels
        key["features off"] = sorted(off)
    try:
        import triton

        key["triton"] = triton.__version__
    except Exception:  # triton is optional on the CPU
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        key["gpu"] = f"{p.name}, {p.multi_processor_count} SMs"
    return key


def bucket(n: int) -> int:
    """A dynamic dim's bucket: the next power of two (1, 2, 4, ... ; 0 stays 0)."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


def site_key(parts: Sequence[Any]) -> str:
    """A stable key for one site's decision (parts are JSON-able: names, shapes, dtypes)."""
    # Inductor's freezing changes what the subgraph compiles to (int8: oneDNN's int8 GEMM)
    freezing = bool(torch._inductor.config.freezing)
    text = json.dumps([*parts, torch.get_num_threads(), freezing], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# -- timing ---------------------------------------------------------------------------------------


@dataclass
class Timing:
    name: str  # a kernel's name, or KEEP
    us: float | None = None  # median microseconds per call; None: excluded
    note: str = ""  # why excluded, or how it was timed ("Inductor", "eager bound")
    low: float | None = None  # a lower bound where ``us`` is an estimate (a proxy's time)
    # seconds per call of each round of :func:`measure` (not cached: a decision read back
    # from the cache has none)
    rounds: list[float] = field(default_factory=list, repr=False, compare=False)
    # with ``low``, on the CPU: one run of the library calls that bound Inductor's time from
    # below, their microseconds (matcher/lowered.extern_us; not cached), for the whole-graph
    # check's sweep of them (graph_guard.BELIEVABLE)
    extern: Callable[[], float] | None = field(default=None, repr=False, compare=False)

    def ran(self) -> bool:
        """Timed to the end: neither excluded nor stopped over the site's budget."""
        return self.us is not None and not self.note.startswith("stopped")

    def describe(self) -> str:
        t = f"{self.us:.1f} us" if self.us is not None else "excluded"
        return f"{self.name} {t}" + (f" ({self.note})" if self.note else "")


@dataclass
class Decision:
    choice: str  # a kernel's name, or KEEP
    timings: list[Timing] = field(default_factory=list)
    source: str = "measured"  # "measured" | "cache" | "static" | "pinned"

    def describe(self) -> str:
        times = ", ".join(t.describe() for t in self.timings)
        return f"{self.source}: {times} -> {self.choice}" if times else self.source

    def to_json(self) -> dict[str, Any]:
        rows = [
            [t.name, t.us, t.note] + ([t.low] if t.low is not None else []) for t in self.timings
        ]
        return {"choice": self.choice, "timings": rows}

    @classmethod
    def from_json(cls, d: Any) -> Decision:
        if not isinstance(d, dict) or not isinstance(d.get("choice"), str):
            raise ValueError("not a decision")
        timings = [Timing(str(n), None if us is None else float(us), str(note),
                          float(low[0]) if low and low[0] is not None else None)
                   for n, us, note, *low in d.get("timings", [])]  # fmt: skip
        return cls(d["choice"], timings, "cache")


class Excluded(PdlkitError):
    """A candidate that cannot be timed (it raised, declined, or lied about its output)."""


def device_of(values: Iterable[Any]) -> str:
    """The device type of the first tensor among ``values`` ("cpu" when none is a tensor)."""
    return next((v.device.type for v in values if isinstance(v, torch.Tensor)), "cpu")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _sample(
    fn: Callable[[], Any], device: str, reps: int, lead: int = 0, gpu_time: bool = True
) -> float:
    """Seconds per call over ``reps`` back-to-back calls, after ``lead`` untimed ones. On
    CUDA, with ``gpu_time``, the calls' GPU time, their launches enqueued ahead
    (runtime_abi/cuda_timing.py); without it, between two events around the calls as the
    host issues them, its launch cost included where it is the longer."""
    for _ in range(lead):
        fn()
    if device == "cuda":
        return gpu_seconds(fn, reps) if gpu_time else issued_seconds(fn, reps)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


# A candidate timed on copies of its weights (a rotation, matcher/cold.py) that is more than
# this many times slower than the fastest such candidate with its weights in the caches is not
# timed on the copies: their memory traffic adds to every candidate's time about alike, so it
# cannot catch up, and packing each copy is most of what a site's timing costs
HOT_SLACK = 2.0
NOT_TIMED_COLD = "not timed on copies of its weights"
STOPPED = "stopped: over the budget"  # a candidate over its share of a site's budget
# calls after the warm-up (below) whose fastest is a candidate's time with its weights in the
# caches: with two such calls, the dynamic AMX qlinear was excluded at GPT-2's first site as over
# HOT_SLACK times the fastest where it ran 0.3 ms
HOT_CALLS = 4
# untimed calls before those, until the candidate has run this long (its first call included;
# at most WARM_CALLS calls and half its share of the budget): a kernel's first calls in a
# process can run several times slower than later ones for a few milliseconds of its work, not
# a count of calls. The dynamic AMX qlinear at bert-mini's first int8-dynamic site (2-core Xeon
# with AMX, 1 thread), in ms: 2.6, then 1.35, 1.23, 1.39, 1.31, 1.29, 0.47, 0.41 in one process,
# 2.5, 1.43, 0.50 in another; at GPT-2's first site 3.8, 1.6, 1.6, 0.5. With HOT_CALLS alone it
# read 1.23 ms against VNNI's 0.55 and was excluded, so neither that site's choice nor the
# whole-graph check's kernels-only graph had it. In four more processes its slow calls ended
# after 2.7-11 ms of its work: twice that here
WARM_S, WARM_CALLS = 0.02, 32


def _warm(call: Callable[[], Any], device: str, spent: float, share: float) -> None:
    """Untimed calls of ``call`` until it has run :data:`WARM_S` in all (``spent`` so far), at
    most :data:`WARM_CALLS` of them and half of ``share``."""
    for _ in range(WARM_CALLS):
        if spent >= min(WARM_S, share / 2):
            return
        spent += _sample(call, device, 1)


def _prescreen(
    candidates: Sequence[tuple[str, Callable[[], Any]]], device: str, share: float, budget: float
) -> dict[str, Timing]:
    """The rotations among ``candidates`` (copies of their weights, matcher/cold.py) that are
    not timed on their copies, by a first call, a warm-up (:data:`WARM_S`) and
    :data:`HOT_CALLS` more on the first copy (the model's own weights; one, where those
    would take the first call past the ``share``): those whose first call took the whole
    ``budget``, or whose warm calls are over the budget's ``share`` there, or whose copies
    would be (stopped, timed by that), as :func:`_first_calls` decides for the others; and those over :data:`HOT_SLACK`
    times the fastest (excluded). One that raises is left to :func:`measure`, which says so."""
    done: dict[str, Timing] = {}
    hot: dict[str, float] = {}
    for name, fn in candidates:
        calls = getattr(fn, "calls", None)
        if not calls:
            continue
        try:
            t0 = time.perf_counter()
            calls[0]()
            _sync(device)
            first = time.perf_counter() - t0
            if first <= budget:  # a slow first call alone stops nothing (_first_calls)
                _warm(calls[0], device, first, share)
                # one warm call where HOT_CALLS more would overrun the share (GPT-2's BF16
                # GELU site on an AVX2-only EPYC: 0.6 s calls, the site's timing took 16 s)
                warm = HOT_CALLS if first * (1 + HOT_CALLS) <= share else 1
                hot[name] = min(_sample(calls[0], device, 1) for _ in range(warm))
        except Exception:  # noqa: BLE001 - measure() calls it again and reports the error
            continue
        if name not in hot or hot[name] * len(calls) > share:
            done[name] = Timing(name, max(first, hot.pop(name, 0.0)) * 1e6, STOPPED)
    best = min(hot.values(), default=0.0)
    for n, t in hot.items():
        if t > HOT_SLACK * best:
            note = f"{NOT_TIMED_COLD}: {t * 1e6:.0f} us with them in the caches, over "
            done[n] = Timing(n, None, note + f"{HOT_SLACK:g}x the fastest's {best * 1e6:.0f} us")
    return done


def _first_calls(
    fn: Callable[[], Any], device: str, share: float, budget: float
) -> tuple[float, bool]:
    """A candidate's first call and, unless that one took the whole ``budget``, a warm one:
    (seconds of the last, whether the candidate is stopped: the first call over ``budget``,
    or the warm one still over its ``share``). A slow first call alone stops nothing: it
    carries one-time costs, and on a loaded host a descheduled thread (a 41 us kernel's first
    call took 15-36 ms on the 2-core Xeon beside two busy processes, was stopped over its
    3 ms share, and the site kept a subgraph ten times slower)."""
    warm_up = getattr(fn, "warm_up", None)
    if warm_up is not None:
        warm_up()
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - t0
    if first > budget:
        return first, True
    second = _sample(fn, device, 1)  # warm: caches, pre-packed weights, lazy init
    return second, second > share


def measure(
    candidates: Sequence[tuple[str, Callable[[], Any]]],
    device: str,
    budget: float,
    *,
    samples: int = 9,
    lead: int = 0,
    lead_below: float = math.inf,
    gpu_time: bool = True,
    settled: Callable[[dict[str, list[float]]], bool] | None = None,
) -> list[Timing]:
    """Median time per call of each candidate, sampled round-robin within ``budget`` seconds.

    Every other round runs the candidates in reverse order, so that none always runs right
    after the same other one (whose data it would find in, or missing from, the caches).
    ``lead`` untimed calls start each sample of a candidate whose call takes under
    ``lead_below`` seconds, so that its timed calls follow its own, as a model's calls follow
    each other (whole graphs: see matcher/graph_guard.py).
    ``gpu_time``: on CUDA, time the GPU work alone (a site: see :func:`_sample`), or the calls
    as the host issues them (a whole graph, whose launches are its own cost). Each
    candidate's samples are kept in ``Timing.rounds``, round by round, for a paired
    comparison (matcher/graph_guard.py); ``settled``, given each one's samples after every
    round, may end the rounds early (graph_guard's decisive lead). A candidate that raises in
    its warm-up is excluded (its note says why); one whose first call takes the whole budget,
    or whose warm call still takes more than the budget's share, is stopped there and timed
    by that call (:func:`_first_calls`). A candidate with a ``warm_up`` method (a rotation
    through copies of its weights, matcher/cold.py) runs it first, untimed, unless
    :func:`_prescreen` decides it on its first copy alone."""
    deadline = time.perf_counter() + budget
    share = budget / max(1, len(candidates))
    timings = {name: Timing(name) for name, _ in candidates}
    live: list[tuple[str, Callable[[], Any], int, int]] = []
    found: dict[str, list[float]] = {}
    done = _prescreen(candidates, device, share, budget)
    for name, fn in candidates:
        if name in done:
            timings[name] = done[name]
            continue
        try:
            second, stopped = _first_calls(fn, device, share, budget)
            if stopped:
                timings[name].us, timings[name].note = second * 1e6, STOPPED
                continue
        except Excluded as e:
            timings[name].note = str(e)
            continue
        except Exception as e:
            timings[name].note = f"raised {type(e).__name__}: {e}"
            continue
        # a sample lasts about 1 ms (at least one call), so a 5 us kernel is not timer noise
        reps = max(1, min(1000, int(1e-3 / max(second, 1e-7))))
        live.append((name, fn, reps, lead if second < lead_below else 0))
        found[name] = []
    for i in range(samples):
        if time.perf_counter() > deadline and all(found[n] for n, *_ in live):
            break
        for name, fn, reps, led in live if i % 2 == 0 else live[::-1]:
            found[name].append(_sample(fn, device, reps, led, gpu_time))
        if settled is not None and settled(found):
            break
    for name, values in found.items():
        timings[name].us = statistics.median(values) * 1e6
        timings[name].rounds = values
    return [timings[name] for name, _ in candidates]


# -- the decision cache ---------------------------------------------------------------------------


def cache_dir() -> Path | None:
    """Where decisions are kept, or None (with one warning) when the place is not safe."""
    raw = os.environ.get(CACHE_ENV, "").strip()
    if raw and not Path(raw).expanduser().is_absolute():
        warn_once(f"pdlkit: {CACHE_ENV}={raw!r} is a relative path; decisions are not cached")
        return None
    base = Path(raw).expanduser() if raw else Path.home() / ".cache" / "pdlkit"
    folder = base / "autotune"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = folder.stat()
    except OSError as e:
        warn_once(f"pdlkit: autotune cache {folder} is not usable ({e}); decisions are not cached")
        return None
    if st.st_mode & stat.S_IWOTH or st.st_uid != os.getuid():
        warn_once(
            f"pdlkit: autotune cache {folder} is world-writable or owned by another user; "
            "decisions are not cached"
        )
        return None
    return folder


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)


class DecisionCache:
    """The decisions of one host, in ``<dir>/host-<hash>.json``; loaded once, merged on write."""

    def __init__(self, folder: Path | None):
        host = host_key()
        digest = hashlib.sha256(json.dumps(host, sort_keys=True).encode()).hexdigest()[:16]
        self.path = folder / f"host-{digest}.json" if folder is not None else None
        self._host = host
        self._lock = threading.Lock()
        self._entries: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
            if data.get("format") != _FORMAT or data.get("host") != self._host:
                raise ValueError("written for another host or format")
            entries = data["decisions"]
            if not isinstance(entries, dict):
                raise ValueError("no decisions table")
            return entries
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            warn_once(f"pdlkit: ignoring autotune cache {self.path} ({e}); it will be rewritten")
            return {}

    def get(self, key: str) -> Decision | None:
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            raw = self._entries.get(key)
        if raw is None:
            return None
        try:
            return Decision.from_json(raw)
        except (ValueError, TypeError):
            return None

    def put(self, key: str, decision: Decision) -> None:
        with self._lock:
            if self._entries is None:
                self._entries = self._read()
            self._entries[key] = decision.to_json()
            if self.path is None:
                return
            try:
                with _locked(self.path):
                    merged = {**self._read(), **self._entries}
                    if len(merged) > _MAX_ENTRIES:  # the oldest entries go first
                        merged = dict(list(merged.items())[-_MAX_ENTRIES:])
                    atomic_write(self.path, {"format": _FORMAT, "host": self._host,
                                             "decisions": merged})  # fmt: skip
                    self._entries = merged
            except OSError as e:
                warn_once(f"pdlkit: could not write autotune cache {self.path}: {e}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def atomic_write(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


_CACHES: dict[Path | None, DecisionCache] = {}


def decision_cache() -> DecisionCache:
    """The cache for the current ``PDLKIT_CACHE_DIR`` (one object per folder)."""
    folder = cache_dir()
    cache = _CACHES.get(folder)
    if cache is None:
        cache = _CACHES[folder] = DecisionCache(folder)
    return cache


# -- choosing -------------------------------------------------------------------------------------


# the spread of a timing's rounds (interquartile range over the median) past which the host
# was busy while it ran: on this project's 2-core Xeon a compiled GPT-2 timed in 21 rounds
# spread 0.02-0.12 quiet, 0.2-4.0 with one other busy process (2 threads, whose OpenMP
# workers then wait for each other); the per-site timings of such a compile were off by 10-50x
STEADY = 0.15


def spread(t: Timing) -> float | None:
    """The interquartile range of ``t``'s rounds over their median (None: under 4 rounds)."""
    if len(t.rounds) < 4:
        return None
    q1, med, q3 = statistics.quantiles(t.rounds, n=4)
    return (q3 - q1) / med if med > 0 else math.inf


# the spread past which a decision is not written to the decision cache: it holds for this
# compilation, and a later one measures again. Per-site timings of 9 rounds spread up to 0.26
# on a quiet host (bert-mini's sites on the 2-core Xeon, 1 thread); timed beside another busy
# process the same compile's timings were 10-50x slow, and a decision cached then would have
# been reused by every later compilation on this host
BUSY = 0.5


def trusted(decision: Decision) -> bool:
    """Whether every timing of ``decision`` was at most :data:`BUSY` unsteady (or had too
    few rounds to say): only such decisions are cached."""
    return all((s := spread(t)) is None or s <= BUSY for t in decision.timings)


def steady(t: Timing) -> bool:
    """Whether ``t``'s rounds were steady (:data:`STEADY`); True with too few rounds to say."""
    s = spread(t)
    return s is None or s <= STEADY


def fastest(timings: Sequence[Timing], order: Sequence[str], tie: float = MARGIN) -> str:
    """The fastest kernel, if it beats keeping the subgraph by ``MARGIN``; else KEEP.

    ``order`` is the static priority order. Kernels within ``tie`` of the fastest are a
    tie, which goes to the first in that order: a measured difference inside a shared host's
    noise does not overrule the kernel author's priority (seen on a Xeon with AMX: BF16
    bert-mini's sites, timed one by one, went to oneDNN's linear or stayed with Inductor, and
    the model ran 0.87-0.96x BF16 Inductor's time, where the AMX kernel of higher priority at
    every site ran 0.81-0.83x)."""
    keep = next((t.us for t in timings if t.name == KEEP), None)
    timed = [
        (t.us, order.index(t.name) if t.name in order else len(order), t.name)
        for t in timings
        if t.name != KEEP and t.ran() and t.us is not None
    ]
    if not timed:
        return KEEP
    best = min(timed)
    tied = sorted((t for t in timed if t[0] <= best[0] * (1 + tie)), key=lambda t: t[1])
    for us, _, name in [*tied, best]:  # the first of the tie that beats the subgraph, else
        if keep is None or us < keep * (1 - MARGIN):  # the fastest
            return name
    return KEEP
