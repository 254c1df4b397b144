"""Transformer models on an x86 CPU: pdlkit next to the compiler it replaces, per dtype (issue 21).

    python benchmarks/x86_models.py                          # all models, all dtypes, 1 thread
    python benchmarks/x86_models.py --quick                  # 1 round, fewer windows, bert-mini
    python benchmarks/x86_models.py --models bert-mini,gpt2 --dtypes fp32,int8-static
    python benchmarks/x86_models.py --threads 2 --rounds 3 --windows 20

Writes ``results/x86_models.md`` (``--out`` to change). Models (``--models``): transformers
configs with random weights (seed 0), eval mode, default (SDPA) attention, no mask, every call
under ``torch.no_grad()``: see ``MODELS``. Dtypes (``--dtypes``), each through
``pdlkit.quantization.quantize``: ``fp32`` (the model as is), ``bf16``, ``int8-static``
(torchao PT2E, X86InductorQuantizer, calibrated once on the benchmark input),
``int8-dynamic`` (the same with the quantizer's dynamic config: the form the x86 patterns
match), and, on request only, ``int8-per-token`` (scheme ``int8-dynamic-per-token``: plain torch
ops around ``torch._int_mm``, the GPU form; no x86 pattern matches it) and ``int8-dynamic-arm``
(torchao's ArmInductorQuantizer, dynamic: int8 activations, per-tensor weights; not through
``quantize``, see ``_arm_dynamic``).

Configurations per (model, dtype), all compiled in ONE process, on the same model object:

* the peer: ``torch.compile(m)`` (Inductor alone) for fp32 / bf16 / int8-per-token; PyTorch's
  own x86 int8 path for the PT2E dtypes: ``torch.compile(converted)`` with
  ``torch._inductor.config.freezing = True`` (Inductor's int8 lowering runs only then);
* ``pdlkit``: ``pdlkit.optimize(m, autotune="cached")`` (the default mode); while pdlkit has no
  ``autotune`` option, ``pdlkit.optimize(m)`` (today's static priority), said so in the results;
* ``pdlkit-off``: ``pdlkit.optimize(m, autotune="off")`` (static priority: what measurement
  changes); skipped, with a note, while the option does not exist.

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
(target <= 1.05x), medians over rounds; the kernels pdlkit substituted (``pdlkit.stats()``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import inspect
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from machine import host_header  # benchmarks/machine.py
from measure import last_hidden, p10  # benchmarks/measure.py

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "x86_models.md"
RATIO_TARGET = 1.02  # pdlkit latency / the peer's (issue 21)
FIRST_TARGET = 1.3  # pdlkit's first compile / the peer's
SECOND_TARGET = 1.05  # pdlkit's second compile (decision cache warm) / the peer's


@dataclass(frozen=True)
class Spec:
    family: str  # bert | gpt2 | llama | vit
    config: dict[str, Any]
    batch: int
    size: int  # tokens per sequence, or the image side in pixels

    def shape(self) -> str:
        if self.family == "vit":
            return f"{self.batch}x3x{self.size}x{self.size}"
        return f"{self.batch}x{self.size}"


_MINI = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
_LLAMA = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=2, num_attention_heads=8)
MODELS: dict[str, Spec] = {
    "bert-mini": Spec("bert", _MINI, 8, 64),
    "bert-base": Spec("bert", {}, 1, 128),  # BertConfig() defaults: 12 layers, hidden 768
    "gpt2": Spec("gpt2", dict(n_layer=2, n_embd=256, n_head=4, n_positions=256), 8, 64),
    # GQA: 8 query heads over 4 key/value heads
    "llama": Spec(
        "llama", {**_LLAMA, "num_key_value_heads": 4, "max_position_embeddings": 256}, 8, 64
    ),
    "vit": Spec("vit", {**_MINI, "image_size": 224, "patch_size": 16}, 2, 224),
}
# dtype -> pdlkit.quantization scheme (None: the FP32 model as is)
SCHEMES = {
    "fp32": None,
    "bf16": "bf16",
    "int8-static": "int8-static",
    "int8-dynamic": "int8-dynamic",
    "int8-per-token": "int8-dynamic-per-token",
    "int8-dynamic-arm": "arm-dynamic",  # torchao's ArmInductorQuantizer, dynamic (_arm_dynamic)
}
DEFAULT_DTYPES = ("fp32", "bf16", "int8-static", "int8-dynamic")
# peer: PyTorch's int8 path (Inductor with freezing)
PT2E = ("int8-static", "int8-dynamic", "int8-dynamic-arm")
CONFIGS = ("pdlkit", "pdlkit-off", "peer")


@dataclass
class Conf:
    """One configuration of one case: its compiles, windows and accuracy."""

    first_s: list[float] = field(default_factory=list)  # per round
    second_s: list[float] = field(default_factory=list)
    windows_ms: list[float] = field(default_factory=list)  # per window: ms per call
    round_medians: list[float] = field(default_factory=list)
    max_abs: float = float("nan")
    cosine: float = float("nan")
    kernels: str = ""  # substitutions by kernel, from pdlkit.stats()
    tuning: list[str] = field(default_factory=list)  # autotune counters, first / second compile
    error: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.windows_ms) if self.windows_ms else float("nan")


@dataclass
class Case:
    model: str
    dtype: str
    shape: str
    peer_label: str
    confs: dict[str, Conf] = field(default_factory=dict)
    error: str = ""
    note: str = ""  # int8: how many GEMMs the quantizer made int8
    loads: list[float] = field(default_factory=list)  # 1-min load average after each round

    @property
    def name(self) -> str:
        return f"{self.model} {self.shape} {self.dtype}"

    def ratio(self, conf: str) -> float:
        """Median of per-window ratios conf / peer (windows of one round alternate)."""
        a, b = self.confs.get(conf), self.confs.get("peer")
        if not a or not b or a.error or b.error or len(a.windows_ms) != len(b.windows_ms):
            return float("nan")
        return statistics.median(x / y for x, y in zip(a.windows_ms, b.windows_ms, strict=True))


# -- models ----------------------------------------------------------------------------------------


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """(FP32 model with random weights in eval mode, one input batch)."""
    try:
        import transformers as tf
    except ImportError as e:
        raise ImportError("the models need transformers (or carry its wheel in)") from e
    spec = MODELS[name]
    torch.manual_seed(0)
    kinds = {
        "bert": (tf.BertConfig, tf.BertModel),
        "gpt2": (tf.GPT2Config, tf.GPT2Model),
        "llama": (tf.LlamaConfig, tf.LlamaModel),
        "vit": (tf.ViTConfig, tf.ViTModel),
    }
    cfg_cls, model_cls = kinds[spec.family]
    cfg = cfg_cls(**spec.config)
    if spec.family in ("gpt2", "llama"):
        cfg.use_cache = False  # no KV cache object in the outputs: export and compile see tensors
    model = model_cls(cfg).eval()  # random weights, nothing downloaded
    if spec.family == "vit":
        x = torch.randn(spec.batch, 3, spec.size, spec.size)
    else:
        x = torch.randint(0, cfg.vocab_size, (spec.batch, spec.size), dtype=torch.int64)
    return model, x


def prepare(model: torch.nn.Module, x: torch.Tensor, dtype: str) -> tuple[Any, torch.Tensor]:
    """The model and input of ``dtype`` (through pdlkit.quantization, whose int8 schemes need
    torchao: imported only then)."""
    scheme = SCHEMES[dtype]
    if scheme is None:
        return model, x
    if scheme == "arm-dynamic":
        return _arm_dynamic(model, x), x
    from pdlkit.quantization import quantize

    with torch.no_grad():
        qm = quantize(model, (x,), scheme=scheme)
    if scheme == "bf16" and x.is_floating_point():
        x = x.to(torch.bfloat16)
    return qm, x


def _arm_dynamic(model: torch.nn.Module, x: torch.Tensor) -> Any:
    """torchao's ArmInductorQuantizer with its dynamic config (int8 activations quantized per
    call, per-tensor weights: an Arm-style model run on x86), through torch.export and PT2E."""
    import torchao.quantization.pt2e.quantizer.arm_inductor_quantizer as aiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with torch.no_grad():
        exported = torch.export.export(model.eval(), (x,), strict=False).module()
        config = aiq.get_default_arm_inductor_quantization_config(is_dynamic=True)
        prepared = prepare_pt2e(exported, aiq.ArmInductorQuantizer().set_global(config))
        prepared(x)
        return convert_pt2e(prepared)


def int8_gemms(model: Any) -> tuple[int, int]:
    """(GEMMs with int8 weights, all GEMMs) of a PT2E model. X86InductorQuantizer annotates
    linear layers only: GPT-2's Conv1D, an addmm, stays FP32; and on torch < 2.12 it finds
    none in a non-strict ``torch.export`` graph (no ``source_fn_stack``; checked on 2.11)."""
    calls = [n for n in model.graph.nodes if n.op == "call_function"]
    gemms = [n for n in calls if "addmm" in str(n.target) or "aten.linear" in str(n.target)]

    def dequantized(w: Any) -> bool:  # per channel, or per tensor (ArmInductorQuantizer)
        return isinstance(w, torch.fx.Node) and "dequantize_per" in str(w.target)

    return sum(len(n.args) > 1 and dequantized(n.args[1]) for n in gemms), len(gemms)


# -- compiling and measuring -----------------------------------------------------------------------


def autotune_supported() -> bool:
    import pdlkit

    return "autotune" in inspect.signature(pdlkit.optimize).parameters


def maker(conf: str, model: Any) -> Callable[[], Callable[..., Any]]:
    """A function that compiles ``model`` for ``conf`` (lazily: the first call compiles)."""
    if conf == "peer":
        return lambda: torch.compile(model)
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


def compile_once(
    conf: str, c: Conf, make: Callable[[], Any], x: torch.Tensor, attempt: str
) -> tuple[Any, Any]:
    """(compiled callable, first output), timing optimize/compile + the first call."""
    import pdlkit

    pdlkit.stats(reset=True)
    t = time.perf_counter()
    fn = make()
    with torch.no_grad():
        out = fn(x)
    dt = time.perf_counter() - t
    (c.first_s if attempt == "first" else c.second_s).append(dt)
    if conf != "peer":
        s = pdlkit.stats()
        c.tuning.append(tuning_counters(s, chosen=attempt == "first"))
        by = {k: v.get("substitutions", 0) for k, v in s.get("by_kernel", {}).items()}
        c.kernels = ", ".join(f"{k} {n}" for k, n in sorted(by.items()) if n) or "none"
    return fn, out


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


def compile_round(case: Case, model: Any, x: torch.Tensor, ref: torch.Tensor, tmp: str) -> dict:
    """First and second compile of every configuration, each in an Inductor cache folder of
    its own; returns the second compiles, alive side by side for the windows."""
    from pdlkit.quantization import cosine_similarity, max_abs_error

    os.environ["PDLKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="decisions-", dir=tmp)
    dirs = {conf: tempfile.mkdtemp(prefix=f"inductor-{conf}-", dir=tmp) for conf in case.confs}
    fns: dict[str, Any] = {}
    for attempt in ("first", "second"):
        torch._dynamo.reset()  # the cache folders stay
        for conf, c in case.confs.items():
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
    is pdlkit's (it compiles first in each round)."""
    import torch._inductor.config as ic

    import pdlkit

    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    x = torch.randn(8, 64)
    out = []
    for label, make in (("Inductor", torch.compile), ("pdlkit", pdlkit.optimize)):
        for freezing in (False, True):
            torch._dynamo.reset()
            ic.freezing = freezing
            with inductor_cache(tempfile.mkdtemp(prefix="warm-", dir=tmp)), torch.no_grad():
                t = time.perf_counter()
                make(m.eval())(x)
                out.append(
                    f"{label}{' (freezing)' if freezing else ''} {time.perf_counter() - t:.1f} s"
                )
    ic.freezing = False
    torch._dynamo.reset()
    return "- process warm-up (a small MLP, compiled once each, not in the tables): " + ", ".join(
        out
    )


def measure_round(case: Case, fns: dict, x: torch.Tensor, args: argparse.Namespace) -> None:
    """``--warmup`` calls each, then alternating windows of ``--calls`` calls."""
    names = list(fns)
    start = {n: len(case.confs[n].windows_ms) for n in names}
    with torch.no_grad():
        for n in names:
            for _ in range(args.warmup):
                fns[n](x)
        for w in range(args.windows):
            k = w % len(names)
            for n in names[k:] + names[:k]:
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
    ic.freezing = dtype in PT2E
    try:
        for rnd in range(args.rounds):
            fns = compile_round(case, model, x, ref, tmp)
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
            + (f"  [{c.kernels}; autotune: {'; '.join(c.tuning[-2:])}]" if conf != "peer" else ""),
            flush=True,
        )


# -- report ----------------------------------------------------------------------------------------


def fmt(x: float, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x != x else f"{x:{spec}}{suffix}"  # NaN: not measured


def verdict(x: float, target: float) -> str:
    return "-" if x != x else ("met" if x <= target else "**NOT met**")


def latency_rows(cases: list[Case]) -> list[str]:
    head = (
        "| model | dtype | input | peer | peer ms (p10) | pdlkit ms (p10) | pdlkit / peer "
        f"| <= {RATIO_TARGET} | pdlkit-off ms | off / peer | max abs err: peer / pdlkit / off "
        "| cosine: peer / pdlkit / off |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in cases:
        if r.error:
            rows.append(f"| {r.model} | {r.dtype} | {r.shape} | {r.error} |" + " |" * 8)
            continue
        cs = {k: r.confs.get(k, Conf(error="not run")) for k in CONFIGS}

        def ms(c: Conf) -> str:
            return f"{c.median:.2f} ({p10(c.windows_ms):.2f})" if c.windows_ms else "-"

        order = ("peer", "pdlkit", "pdlkit-off")
        acc = [
            " / ".join(fmt(getattr(cs[k], a), s) for k in order)
            for a, s in (("max_abs", ".3g"), ("cosine", ".5f"))
        ]
        rows.append(
            f"| {r.model} | {r.dtype}{f' ({r.note})' if r.note else ''} | {r.shape} "
            f"| {r.peer_label} | {ms(cs['peer'])} "
            f"| {ms(cs['pdlkit'])} | {fmt(r.ratio('pdlkit'), '.3f', 'x')} "
            f"| {verdict(r.ratio('pdlkit'), RATIO_TARGET)} | {ms(cs['pdlkit-off'])} "
            f"| {fmt(r.ratio('pdlkit-off'), '.3f', 'x')} | {acc[0]} | {acc[1]} |"
        )
    return rows


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def compile_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a / b (both measured in the same round)."""
    return med([x / y for x, y in zip(a, b, strict=False)])


def compile_rows(cases: list[Case]) -> list[str]:
    head = (
        "| model | dtype | peer 1st / 2nd s | pdlkit 1st / 2nd s | pdlkit-off 1st / 2nd s "
        f"| 1st: pdlkit / peer | <= {FIRST_TARGET} | 2nd: pdlkit / peer | <= {SECOND_TARGET} |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in cases:
        if r.error or "peer" not in r.confs or "pdlkit" not in r.confs:
            continue
        p, k = r.confs["peer"], r.confs["pdlkit"]
        off = r.confs.get("pdlkit-off", Conf())
        r1, r2 = compile_ratio(k.first_s, p.first_s), compile_ratio(k.second_s, p.second_s)

        def pair(c: Conf) -> str:
            return f"{fmt(med(c.first_s), '.1f')} / {fmt(med(c.second_s), '.1f')}"

        rows.append(
            f"| {r.model} | {r.dtype} | {pair(p)} | {pair(k)} | {pair(off)} "
            f"| {fmt(r1, '.2f', 'x')} | {verdict(r1, FIRST_TARGET)} | {fmt(r2, '.2f', 'x')} "
            f"| {verdict(r2, SECOND_TARGET)} |"
        )
    return rows


def kernel_rows(cases: list[Case]) -> list[str]:
    rows = [
        "| model | dtype | configuration | substitutions by kernel | autotune (1st; 2nd compile) |",
        "|---|---|---|---|---|",
    ]
    for r in cases:
        for conf in ("pdlkit", "pdlkit-off"):
            c = r.confs.get(conf)
            if c and c.kernels:
                tuning = "; ".join(c.tuning[:2]) or "-"
                rows.append(f"| {r.model} | {r.dtype} | {conf} | {c.kernels} | {tuning} |")
    return rows


def failures(cases: list[Case]) -> list[str]:
    out = [f"- {r.name}: {r.error}" for r in cases if r.error]
    for r in cases:
        out += [f"- {r.name}, {k}: {c.error}" for k, c in r.confs.items() if c.error]
    return out or ["none"]


def detail_rows(cases: list[Case]) -> list[str]:
    head = (
        "| case | configuration | windows | medians per round ms | 1st compiles s | 2nd compiles s "
        "| load (1 min) after each round |"
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]

    def j(xs: list[float], spec: str = ".2f") -> str:
        return ", ".join(f"{v:{spec}}" for v in xs) or "-"

    for r in cases:
        for conf, c in r.confs.items():
            rows.append(
                f"| {r.name} | {conf} | {len(c.windows_ms)} | {j(c.round_medians)} "
                f"| {j(c.first_s, '.1f')} | {j(c.second_s, '.1f')} | {j(r.loads)} |"
            )
    return rows


def render(cases: list[Case], args: argparse.Namespace, header: list[str], secs: float) -> str:
    tuned = (
        '`pdlkit` = `pdlkit.optimize(m, autotune="cached")`, `pdlkit-off` = `autotune="off"`'
        if args.autotune
        else "**pdlkit.optimize has no `autotune` option at this commit**: `pdlkit` = "
        "`pdlkit.optimize(m)` (today's static priority); `pdlkit-off` not run"
    )
    return "\n".join(
        [
            "# Transformer models on x86: pdlkit against the compiler it replaces (issue 21)",
            "",
            f"Generated by `python benchmarks/x86_models.py {' '.join(sys.argv[1:])}` "
            f"in {secs:.0f} s (the script's docstring says how): {args.rounds} round(s) per "
            f"case, each: first and second compiles, {args.warmup} warm-up calls, "
            f"{args.windows} alternating windows of {args.calls} calls per configuration.",
            "",
            *header,
            "",
            f"{tuned}. Peer: `torch.compile(m)` (Inductor alone) for fp32 / bf16 / "
            "int8-per-token; PyTorch's own x86 int8 path for int8-static / int8-dynamic "
            "(`torch.compile(converted)` with `torch._inductor.config.freezing = True`; pdlkit "
            "compiles with freezing on too). "
            "Ratios are medians of per-window ratios (lower is faster); latencies the median "
            "(and 10th percentile) of per-call times over all windows. Accuracy: the second "
            "compile's first output against the same model (same dtype) run eagerly.",
            "",
            "## Latency",
            "",
            *latency_rows(cases),
            "",
            "## Compile cost",
            "",
            "Wall clock of `optimize` / `torch.compile` plus the first call, medians over rounds; "
            "ratios per round, then the median. Every configuration compiles in an Inductor cache "
            "folder of its own. 1st: everything cold (Inductor's caches, pdlkit's decision cache: "
            "a new machine); 2nd: after `torch._dynamo.reset()`, Inductor's in-memory caches "
            "cleared, its folder and the decision cache folder warm (pdlkit's in-process state "
            "is not cleared: a new process would have only the folders).",
            "",
            *compile_rows(cases),
            "",
            "## Kernels pdlkit substituted",
            "",
            "`pdlkit.stats()` after the compile: substitutions per kernel, and its tuning "
            "counters (hits, misses, time measuring; what won per site) in round 1.",
            "",
            *kernel_rows(cases),
            "",
            "## Failures",
            "",
            *failures(cases),
            "",
            "## Details",
            "",
            *detail_rows(cases),
            "",
            "Models: "
            + "; ".join(
                f"{n} = {s.family} {s.config or 'defaults'}, input {s.shape()}"
                for n, s in MODELS.items()
            )
            + ".",
            "",
        ]
    )


# -- main ------------------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        help=f"comma-separated, of {', '.join(MODELS)} (default: all; --quick: bert-mini)",
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
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.models = (args.models or ("bert-mini" if args.quick else ",".join(MODELS))).split(",")
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
    start = time.perf_counter()
    cases: list[Case] = []
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
    text = render(cases, args, header, time.perf_counter() - start)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("\n" + text + f"\nwritten to {args.out}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
