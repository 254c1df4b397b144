"""Transformer models on an x86 CPU: pdlkit next to the compiler it replaces, per dtype (issue 21).

    python benchmarks/x86_models.py                          # all models, all dtypes, 1 thread
    python benchmarks/x86_models.py --quick                  # 1 round, fewer windows, bert-mini
    python benchmarks/x86_models.py --models bert-mini,gpt2 --dtypes fp32,int8-static
    python benchmarks/x86_models.py --threads 2 --rounds 3 --windows 20

Writes ``results/x86_models.md`` (``--out`` to change). Models (``--models``): transformers
configs with random weights (seed 0), eval mode, default (SDPA) attention, no mask, every call
under ``torch.no_grad()``: see ``MODELS`` (by default BERT, GPT-2, Llama and ViT; Qwen2, Phi-3,
a T5 encoder, DistilBERT and CLIP's vision tower on request). Dtypes (``--dtypes``), each through
``pdlkit.quantization.quantize``: ``fp32`` (the model as is), ``bf16``, ``int8-static``
(torchao PT2E, X86InductorQuantizer, calibrated once on the benchmark input),
``int8-dynamic`` (the same with the quantizer's dynamic config: the form the x86 patterns
match), and, on request only, ``int8-per-token`` (scheme ``int8-dynamic-per-token``: plain torch
ops around ``torch._int_mm``, the GPU form; no x86 pattern matches it) and ``int8-dynamic-arm``
(torchao's ArmInductorQuantizer, dynamic: int8 activations, per-tensor weights; not through
``quantize``, see ``_arm_dynamic``); ``torchao-int8-dynamic`` and ``torchao-int8-weight-only``
(torchao's ``quantize_`` with ``Int8DynamicActivationInt8WeightConfig`` /
``Int8WeightOnlyConfig`` on the FP32 model: its tensor subclasses, compiled by Inductor as
torchao's users compile them; the peer is Inductor), and ``torchao-int8-dynamic-bf16`` and
``torchao-intx-weight-only-bf16`` (the same on the BF16 model; ``IntxWeightOnlyConfig``'s
defaults).

Configurations per (model, dtype), all compiled in ONE process, on the same model object:

* the peer: ``torch.compile(m)`` (Inductor alone) for fp32 / bf16 / int8-per-token; PyTorch's
  own x86 int8 path for the PT2E dtypes: ``torch.compile(converted)`` with
  ``torch._inductor.config.freezing = True`` (Inductor's int8 lowering runs only then);
* ``pdlkit``: ``pdlkit.optimize(m, autotune="cached")`` (the default mode); while pdlkit has no
  ``autotune`` option, ``pdlkit.optimize(m)`` (today's static priority), said so in the results;
* ``pdlkit-off``: ``pdlkit.optimize(m, autotune="off")`` (static priority: what measurement
  changes); skipped, with a note, while the option does not exist;
* with ``--control``, ``control``: the peer again, from a copy of the model: its own weights,
  and under freezing (int8) its own compile; otherwise Dynamo reuses the peer's compiled graph
  with the copy's weights as its inputs. Its ratio to the peer is what this harness reads for
  the same code on this host: a pdlkit / peer ratio within it says nothing (on 2 threads of a
  2-vCPU VM, PyTorch's int8 Llama compiled twice read 1.041-1.044x).

pdlkit compiles with the same freezing setting as its peer. Before the first case, a small MLP
is compiled once with each (reported apart): a process's one-time costs stay out of the tables.
Each round (``--rounds``): a fresh, empty decision cache (``PDLKIT_CACHE_DIR``, a temporary
folder) and per configuration an empty Inductor cache folder of its own
(``TORCHINDUCTOR_CACHE_DIR``; Inductor's in-memory caches cleared whenever the folder is
switched, as ``torch._inductor.utils.fresh_cache`` does); ``torch._dynamo.reset()``, every
configuration's first compile (everything cold: a new machine); ``torch._dynamo.reset()``
again, keeping the folders, and every configuration's second compile (Inductor's caches and
the decision cache warm on disk). Then ``--warmup`` calls each, and ``--windows`` windows of
``--calls`` calls per configuration, the second compiles alive side by side and alternating
(order rotated per window) so that load from other users of the machine falls on all of them.
A compile time is the wall clock of ``optimize`` / ``torch.compile`` and the first call.

Reported per row: median latency per call over all windows, pdlkit / peer as the median of
per-window ratios (target <= 1.02), accuracy of the second compile's first output against the
same model run eagerly (max abs error, cosine), compile costs: pdlkit's first compile / the
peer's first compile (target <= 1.3x) and pdlkit's second compile / the peer's second compile
(target <= 1.05x), medians over rounds; the kernels pdlkit substituted (``pdlkit.stats()``),
with the whole-graph verdict pdlkit's first compile cached (and how many graphs it could not
time: ``stats()["graphs_not_measured"]``). ``--show-rounds`` prints the check's samples as
``x86_whole_graph.py --show-rounds`` does, inside this sequence of compiles.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from _x86_models_build import (  # x86_profile.py and others use them as x86_models.<name>
    DEFAULT_DTYPES,
    DEFAULT_MODELS,
    MODELS,
    PT2E,
    SCHEMES,
    Spec,  # noqa: F401  (x86_profile.py uses x86_models.Spec)
    build,
    int8_gemms,
    prepare,
)
from _x86_models_results import CONFIGS, CONTROL, Case, Conf, render
from machine import host_header  # benchmarks/machine.py
from measure import last_hidden  # benchmarks/measure.py

# The models and dtypes: benchmarks/_x86_models_build.py; what a case measured (Case, Conf),
# the targets and the report: benchmarks/_x86_models_results.py.

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "x86_models.md"


# -- compiling and measuring -----------------------------------------------------------------------


def autotune_supported() -> bool:
    import pdlkit

    return "autotune" in inspect.signature(pdlkit.optimize).parameters


def maker(conf: str, model: Any) -> Callable[[], Callable[..., Any]]:
    """A function that compiles ``model`` for ``conf`` (lazily: the first call compiles)."""
    if conf == "peer":
        return lambda: torch.compile(model)
    if conf == CONTROL:  # the same code, from weights of its own
        return lambda: torch.compile(copy.deepcopy(model))
    import pdlkit

    kwargs: dict[str, Any] = {}
    if autotune_supported():
        kwargs["autotune"] = "cached" if conf == "pdlkit" else "off"
    return lambda: pdlkit.optimize(model, **kwargs)


def tuning_counters(stats: dict[str, Any], chosen: bool = True) -> str:
    """The autotune counters of ``pdlkit.stats()`` (any key naming tuning), and what won."""
    keys = [k for k in stats if "tun" in k and isinstance(stats[k], int | float) and stats[k]]
    text = ", ".join(
        f"{k[:-3]} {stats[k] / 1e6:.2f} s" if k.endswith("_us") else f"{k} {stats[k]:g}"
        for k in sorted(keys)
    )
    won = {
        k: sum(n for e, n in v.items() if "tun" in e and not e.endswith("_us"))
        for k, v in stats.get("by_kernel", {}).items()
    }
    won_text = ", ".join(f"{k} {n}" for k, n in sorted(won.items()) if n)
    return (text or "none") + (f" (chosen: {won_text})" if chosen and won_text else "")


def verdicts(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """The whole-graph decisions (matcher/graph_guard.py) in a decision cache folder, each
    with its key."""
    from pdlkit.matcher.graph_guard import INDUCTOR, KERNELS, SUBSTITUTED

    found: list[tuple[str, dict[str, Any]]] = []

    def walk(o: Any, key: str = "") -> None:
        if isinstance(o, dict):
            names = [t[0] for t in o.get("timings", []) if isinstance(t, list) and t]
            if "choice" in o and any(n in (SUBSTITUTED, KERNELS, INDUCTOR) for n in names):
                found.append((key, o))
            for k, v in o.items():
                walk(v, str(k))
        elif isinstance(o, list):
            for v in o:
                walk(v, key)

    for p in folder.rglob("*.json"):
        try:
            walk(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return found


def verdict_text(folder: Path) -> str:
    """``verdict: <the graph that runs> (each graph's time)`` per whole-graph verdict cached
    in ``folder``; a graph whose verdict a busy host left uncached, or that was not timed
    (training, in-place ops, dynamic shapes: graph_guard.timeable), leaves none. A first look
    left to the look after the compile (graph_guard.LATER_KEY) reads ``look after the compile
    due: <the first look's choice> (...)``."""
    from pdlkit.matcher.graph_guard import LATER_KEY

    texts = []
    for key, v in verdicts(folder):
        times = ", ".join(
            f"{n} {us / 1e3:.2f} ms" if us is not None else f"{n} ({note})"
            for n, us, note, *_ in v["timings"]
        )
        what = "look after the compile due: first look" if key.endswith(LATER_KEY) else "verdict:"
        texts.append(f"{what} {v['choice']} ({times})")
    return "; ".join(texts) or "verdict: none cached"


def compile_once(
    conf: str, c: Conf, make: Callable[[], Any], x: torch.Tensor, attempt: str
) -> tuple[Any, Any]:
    """(compiled callable, first output), timing optimize/compile + the first call. A full
    garbage collection runs first, untimed: otherwise one lands inside some compiles and not
    others (BERT-base BF16 second compiles, 1 thread, the 2-core Xeon: 1.50-2.14 s without,
    1.48-1.53 s with it)."""
    import pdlkit

    pdlkit.stats(reset=True)
    gc.collect()
    t = time.perf_counter()
    fn = make()
    with torch.no_grad():
        out = fn(x)
    dt = time.perf_counter() - t
    (c.first_s if attempt == "first" else c.second_s).append(dt)
    if conf.startswith("pdlkit"):
        s = pdlkit.stats()
        c.tuning.append(tuning_counters(s, chosen=attempt == "first"))
        if conf == "pdlkit" and attempt == "first":  # what the whole-graph check read
            text = verdict_text(Path(os.environ["PDLKIT_CACHE_DIR"]))
            if s.get("graphs_not_measured"):  # graph_guard.untimeable: explain says why
                text += f"; {s['graphs_not_measured']} graph(s) not measured"
            c.tuning[-1] += f" [{text}]"
        by = {k: v.get("substitutions", 0) for k, v in s.get("by_kernel", {}).items()}
        c.kernels = ", ".join(f"{k} {n}" for k, n in sorted(by.items()) if n) or "none"
    return fn, out


def child_json(label: str, cmd: list[str], env: dict[str, str]) -> dict:
    """What a benchmark's child process (``cmd``, run with ``env``) prints as JSON on its
    last line; a child that fails raises RuntimeError with ``label``, its exit status and its
    stderr's end (x86_shipped_cache.py, x86_memory.py)."""
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{label}: exit {r.returncode}\n{r.stderr[-3000:]}")
    result: dict = json.loads(r.stdout.strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def inductor_cache(path: str) -> Iterator[None]:
    """Inductor's caches in ``path`` (TORCHINDUCTOR_CACHE_DIR), its in-memory caches cleared
    on entry and exit: what ``torch._inductor.utils.fresh_cache`` does, with a folder kept
    for the configuration's second compile."""
    from unittest import mock

    from torch._inductor.utils import clear_caches

    env = {"TORCHINDUCTOR_CACHE_DIR": path, "TRITON_CACHE_DIR": os.path.join(path, "triton")}
    with mock.patch.dict(os.environ, env):
        clear_caches()
        try:
            yield
        finally:
            clear_caches()


@contextlib.contextmanager
def cold_caches(dtype: str) -> Iterator[None]:
    """Every cache cold for a compile of a ``dtype`` model: Inductor's and pdlkit's decision
    cache in a temporary folder, freezing on for the PT2E dtypes (as PyTorch's int8 path needs
    it), no gradients; all as they were on exit."""
    with tempfile.TemporaryDirectory() as tmp, inductor_cache(tmp), torch.no_grad():
        with mock.patch.dict(os.environ, {"PDLKIT_CACHE_DIR": os.path.join(tmp, "pdlkit")}):
            with mock.patch.object(torch._inductor.config, "freezing", dtype in PT2E):
                yield


def compile_round(
    case: Case, model: Any, x: torch.Tensor, ref: torch.Tensor, tmp: str, rnd: int = 0
) -> dict:
    """First and second compile of every configuration, each in an Inductor cache folder of
    its own; returns the second compiles, alive side by side for the windows. Round ``rnd``
    compiles the configurations in an order rotated by ``rnd``: in one process the
    configuration compiled first ran slower than the others with the same kernels (bert-mini
    int8-static, 1 thread, the 2-core Xeon: 4.48-4.64 ms first, 4.28-4.40 ms second, in
    either order of pdlkit and pdlkit-off; 40 interleaved rounds), so with as many rounds as
    configurations each is first once."""
    from pdlkit.quantization import cosine_similarity, max_abs_error

    os.environ["PDLKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="decisions-", dir=tmp)
    dirs = {conf: tempfile.mkdtemp(prefix=f"inductor-{conf}-", dir=tmp) for conf in case.confs}
    fns: dict[str, Any] = {}
    names = list(case.confs)
    order = names[rnd % len(names) :] + names[: rnd % len(names)]
    for attempt in ("first", "second"):
        torch._dynamo.reset()  # the cache folders stay
        for conf in order:
            c = case.confs[conf]
            if c.error:
                continue
            try:
                with inductor_cache(dirs[conf]):
                    fn, out = compile_once(conf, c, maker(conf, model), x, attempt)
            except Exception as e:
                c.error = f"{attempt} compile: {describe(e)}"
                print(f"   {conf}: FAILED ({c.error})", flush=True)
                traceback.print_exc(limit=-3)
                continue
            if attempt == "second":
                y = last_hidden(out).detach().float()
                c.max_abs, c.cosine = max_abs_error(y, ref), cosine_similarity(y, ref)
                fns[conf] = fn
    return fns


def warm_process(tmp: str) -> str:
    """Compile a small MLP once with Inductor and once with pdlkit, with Inductor's freezing off
    and on (untimed in the results, reported apart): the one-time costs of a process
    (Inductor's imports, its freezing passes' pattern tables, ~3 s on first use; pdlkit's
    pattern set and kernels) would otherwise land on the first case's first compile, which
    is pdlkit's in round 0 (each round rotates the order: compile_round). pdlkit's
    decision cache is an empty folder of its own meanwhile: over a warm one the small MLP
    took a kept verdict, "Inductor's graph", and never loaded the matcher, whose imports
    (torch-mlir among them: up to 0.2 s on the 2-core Xeon) then landed on the first timed
    compile, while Inductor's had been paid here."""
    import torch._inductor.config as ic

    import pdlkit

    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    x = torch.randn(8, 64)
    out = []
    decisions = {"PDLKIT_CACHE_DIR": tempfile.mkdtemp(prefix="warm-decisions-", dir=tmp)}
    with mock.patch.dict(os.environ, decisions):
        for label, make in (("Inductor", torch.compile), ("pdlkit", pdlkit.optimize)):
            for freezing in (False, True):
                torch._dynamo.reset()
                ic.freezing = freezing
                with inductor_cache(tempfile.mkdtemp(prefix="warm-", dir=tmp)), torch.no_grad():
                    t = time.perf_counter()
                    make(m.eval())(x)
                    took = time.perf_counter() - t
                    out.append(f"{label}{' (freezing)' if freezing else ''} {took:.1f} s")
    ic.freezing = False
    torch._dynamo.reset()
    return "- process warm-up (a small MLP, compiled once each, not in the tables): " + ", ".join(
        out
    )


def measure_round(case: Case, fns: dict, x: torch.Tensor, args: argparse.Namespace) -> None:
    """``--warmup`` calls each, then alternating windows of ``--calls`` calls, each window
    after one untimed call of its own: timed right after another configuration, a
    configuration ran 6-8% slower than right after one with the same packed weights
    (int8-static bert-mini, 1 thread, the 2-core Xeon with AMX: 5.10 / 4.75 ms with the same
    kernels either way round), and the rotation below put pdlkit after the peer and
    pdlkit-off after pdlkit twice in three windows: the "same-kernels gap" of earlier runs."""
    names = list(fns)
    start = {n: len(case.confs[n].windows_ms) for n in names}
    with torch.no_grad():
        for n in names:
            for _ in range(args.warmup):
                fns[n](x)
        for w in range(args.windows):
            k = w % len(names)
            for n in names[k:] + names[:k]:
                fns[n](x)  # untimed: the window's calls follow the configuration's own
                t = time.perf_counter()
                for _ in range(args.calls):
                    fns[n](x)
                case.confs[n].windows_ms.append((time.perf_counter() - t) / args.calls * 1e3)
    for n in names:
        c = case.confs[n]
        c.round_medians.append(statistics.median(c.windows_ms[start[n] :]))


def describe(e: BaseException) -> str:
    """``Type: first line`` of the error's root (a BackendCompilerFailed's inner exception)."""
    while (inner := getattr(e, "inner_exception", None)) is not None:
        e = inner
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {(text[0] if text else '')[:300]}"


def run_case(name: str, dtype: str, base: tuple, args: argparse.Namespace, tmp: str) -> Case:
    import torch._inductor.config as ic

    import pdlkit

    model_fp32, x_fp32 = base
    peer = "PyTorch int8 (PT2E + Inductor, freezing)" if dtype in PT2E else "Inductor"
    case = Case(name, dtype, MODELS[name].shape(), peer)
    print(f"\n== {case.name}", flush=True)
    try:
        model, x = prepare(model_fp32, x_fp32, dtype)
        with torch.no_grad():
            ref = last_hidden(model(x)).detach().float()
        if dtype in PT2E:
            q, n = int8_gemms(model)
            case.note = f"{q} of {n} GEMMs with int8 weights"
            print(f"   {case.note}", flush=True)
            if q == 0:
                raise ValueError(f"not an int8 model: {case.note} (see int8_gemms)")
    except Exception as e:
        case.error = f"{dtype} model: {describe(e)}"
        print(f"   FAILED: {case.error}", flush=True)
        return case
    for conf in CONFIGS:
        if conf == "pdlkit-off" and not args.autotune:
            continue
        case.confs[conf] = Conf()
    if args.control:
        case.confs[CONTROL] = Conf()
    ic.freezing = dtype in PT2E
    try:
        for rnd in range(args.rounds):
            fns = compile_round(case, model, x, ref, tmp, rnd)
            measure_round(case, fns, x, args)
            lost = pdlkit.stats().get("calls_without_site", 0)  # since the last compile
            if lost:
                lost_note = f"{lost} kernel calls found no call site (slow path)"
                case.note = "; ".join(filter(None, [case.note, lost_note]))
                print(f"   warning: {lost} kernel calls found no call site", flush=True)
            case.loads.append(os.getloadavg()[0])
            print_round(case, rnd, args.rounds)
    finally:
        ic.freezing = False
        torch._dynamo.reset()
    return case


def print_round(case: Case, rnd: int, rounds: int) -> None:
    for conf, c in case.confs.items():
        if c.error:
            continue
        label = case.peer_label if conf == "peer" else conf
        ratio = case.ratio(conf) if conf != "peer" else 1.0
        print(
            f"   [{rnd + 1}/{rounds}] {label:<42} {c.round_medians[-1]:8.2f} ms  "
            f"x{ratio:5.3f}  compile {c.first_s[-1]:5.1f} / {c.second_s[-1]:5.1f} s  "
            f"max|err| {c.max_abs:.3g}  cos {c.cosine:.5f}"
            + (f"  [{c.kernels}; autotune: {'; '.join(c.tuning[-2:])}]" if c.kernels else ""),
            flush=True,
        )


# -- main ------------------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        help=f"comma-separated, of {', '.join(MODELS)} (default: {','.join(DEFAULT_MODELS)}; "
        "--quick: bert-mini)",
    )
    ap.add_argument(
        "--dtypes",
        default=",".join(DEFAULT_DTYPES),
        help=f"comma-separated, of {', '.join(SCHEMES)}",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--rounds", type=int, help="compile + measure rounds (default 2; --quick 1)")
    ap.add_argument("--windows", type=int, help="windows per configuration and round (20; 8)")
    ap.add_argument("--calls", type=int, default=3, help="calls per window")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls after the compiles")
    ap.add_argument("--quick", action="store_true", help="one round, 8 windows, bert-mini")
    ap.add_argument(
        "--control", action="store_true", help="also the peer compiled again: the same-code ratio"
    )
    ap.add_argument(
        "--show-rounds",
        action="store_true",
        help="print the whole-graph check's samples as x86_whole_graph.py --show-rounds does",
    )
    ap.add_argument(
        "--out", type=Path, default=RESULTS, help="the results file (a folder: x86_models.md in it)"
    )
    args = ap.parse_args(argv)
    default = "bert-mini" if args.quick else ",".join(DEFAULT_MODELS)
    args.models = (args.models or default).split(",")
    args.dtypes = args.dtypes.split(",")
    for bad in [m for m in args.models if m not in MODELS] + [
        d for d in args.dtypes if d not in SCHEMES
    ]:
        ap.error(f"unknown model or dtype {bad!r}")
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.windows = args.windows or (8 if args.quick else 20)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    tmp = tempfile.mkdtemp(prefix="x86_models-")
    torch.set_num_threads(args.threads)
    args.autotune = autotune_supported()
    if not args.autotune:
        print(
            "note: pdlkit.optimize has no autotune option yet: measuring pdlkit.optimize(m) "
            "(static priority) and skipping pdlkit-off",
            flush=True,
        )
    header = [*host_header(args.threads), warm_process(tmp)]
    print("\n".join(header), flush=True)
    if args.show_rounds:  # after the warm-up: the models' checks only
        import x86_whole_graph  # benchmarks/x86_whole_graph.py

        x86_whole_graph.show_rounds()
    start = time.perf_counter()
    cases: list[Case] = []
    if args.out.is_dir():  # e.g. run's $OUT: a folder passed as --out lost a run's file
        args.out = args.out / RESULTS.name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        try:
            base = build(name)
        except Exception as e:
            err = f"build: {describe(e)}"
            print(f"\n== {name}: build FAILED ({err})", flush=True)
            cases += [Case(name, d, MODELS[name].shape(), "-", error=err) for d in args.dtypes]
            continue
        for dtype in args.dtypes:
            cases.append(run_case(name, dtype, (copy.deepcopy(base[0]), base[1]), args, tmp))
            # after every case: a run cut short (a device call's time limit) keeps what it measured
            args.out.write_text(render(cases, args, header, time.perf_counter() - start))
    text = render(cases, args, header, time.perf_counter() - start)
    args.out.write_text(text)
    print("\n" + text + f"\nwritten to {args.out}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
