"""A transformers Llama end to end on a GPU: BF16 Inductor vs torchao int8 vs pdlkit int8.

Run on a GPU machine (``benchmarks/run_gpu.sh --llama`` runs it after the GPU tests):

    python benchmarks/cuda_llama.py [--config llama2-7b|llama3-gqa] [--rows ...] [--out DIR]

The model is ``transformers.LlamaModel`` with 2 decoder layers at the config's sizes
(Llama-2-7B: hidden 4096, intermediate 11008, 32 heads; the GQA config: 8 KV heads,
intermediate 14336), random weights (std 0.02), BF16. Rows:

- prefill ``B x S``: ``model(input_ids)``, no cache;
- decode ``B``: one token for each of B sequences over a static KV cache of ``--ctx``
  earlier tokens: the model's own embedding, rotary embedding, decoder layers and final
  norm, called by :class:`DecodeStep` with a small cache object of its own that writes the
  new keys and values in place at position ``ctx`` (transformers' ``StaticCache`` moves its
  position counter with every call from 5.x on, so timing one step again and again would
  run past its end).

Paths: BF16 eager (the reference), BF16 Inductor (``torch.compile``), torchao's
``Int8DynamicActivationInt8WeightConfig`` + Inductor (where torchao imports), pdlkit int8
(``quantize(..., "int8-dynamic-per-token")`` + ``pdlkit.optimize``), and ``pdlkit_bf16``:
the BF16 model through ``pdlkit.optimize`` unquantized (what pdlkit does to a model nobody
quantized: its decode attention, where measured faster; never slower than BF16 Inductor), and
``pdlkit_torchao_int8``: torchao's int8 model through ``pdlkit.optimize``; ``torchao_w8`` /
``pdlkit_torchao_w8`` the same for torchao's int8 weight-only config. Each compiled path is
timed as compiled and as a CUDA graph of its compiled call (captured after warm-up;
``graph ms``; a path whose capture fails says why), medians of ``triton.testing.do_bench``.
Also: compile time (first call), cosine of the last hidden state against BF16 eager, and for
decode rows the agreement of greedy next tokens under a random 32000-word head.

``--device cpu --config tiny`` (with ``TRITON_INTERPRET=1``) runs the same code on tiny
shapes on the CPU, the kernels in Triton's interpreter: a smoke test, no timing worth reading.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cuda_llama_report import markdown, summary  # noqa: E402  benchmarks/_cuda_llama_report.py

CONFIGS = {
    "llama2-7b": {"hidden_size": 4096, "intermediate_size": 11008, "heads": 32, "kv_heads": 32},
    "llama3-gqa": {"hidden_size": 4096, "intermediate_size": 14336, "heads": 32, "kv_heads": 8},
    "tiny": {"hidden_size": 64, "intermediate_size": 96, "heads": 4, "kv_heads": 2},
    "tiny-mha": {"hidden_size": 128, "intermediate_size": 160, "heads": 4, "kv_heads": 4},
}
ROWS = ["prefill 1x2048", "prefill 8x512", "decode 1", "decode 16", "decode 64", "decode 256"]
TINY_ROWS = ["prefill 1x32", "prefill 2x16", "decode 1", "decode 4"]
PATHS = [
    "bf16_eager",
    "bf16_inductor",
    "pdlkit_int8",
    "torchao_int8",
    "pdlkit_torchao_int8",
    "torchao_w8",
    "pdlkit_torchao_w8",
    "pdlkit_int8_static_launch",
    "pdlkit_bf16",
]
# pdlkit asking for Inductor's static launcher for its Triton kernels through the config key:
# the same as pdlkit_int8 since importing pdlkit's backend turns the launcher on (the environment
# variable TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS, pdlkit/inductor_options.py)
_STATIC_LAUNCH = {"static_launch_user_defined_triton_kernels": True}
VOCAB = 32000


def build_model(name: str, device: str) -> nn.Module:
    from transformers import LlamaConfig, LlamaModel

    c = CONFIGS[name]
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"],
        num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"],
        num_hidden_layers=2,
        max_position_embeddings=4096,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model: Any = LlamaModel(config)
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
    return model.to(device=device, dtype=torch.bfloat16).eval()


class _StaticKV:
    """What a decoder layer's attention calls ``update`` on: the step's keys and values are
    written in place at position ``ctx`` of fixed buffers, which are returned whole."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], ctx: int):
        self.keys, self.values, self.ctx = keys, values, ctx

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int, *_: Any, **__: Any) -> Any:
        self.keys[layer][:, :, self.ctx : self.ctx + 1].copy_(k)
        self.values[layer][:, :, self.ctx : self.ctx + 1].copy_(v)
        return self.keys[layer], self.values[layer]


class DecodeStep(nn.Module):
    """One decode step of ``model`` for B sequences over ``ctx`` cached tokens."""

    def __init__(self, model: Any, kv: _StaticKV):
        super().__init__()
        self.model, self.kv = model, kv
        pos = torch.full((1, 1), kv.ctx, dtype=torch.long, device=kv.keys[0].device)
        self.register_buffer("pos", pos)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        m: Any = self.model
        h = m.embed_tokens(ids)
        rope = m.rotary_emb(h, self.pos)
        for layer in m.layers:
            h = layer(h, position_ids=self.pos, past_key_values=self.kv, position_embeddings=rope)
        return m.norm(h)


class Prefill(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=False).last_hidden_state


def parse_row(row: str) -> tuple[str, int, int]:
    kind, size = row.split()
    if kind == "prefill":
        b, s = size.split("x")
        return kind, int(b), int(s)
    return kind, int(size), 1


def make_kv(model: Any, batch: int, ctx: int, device: str) -> _StaticKV:
    """Random keys and values for ``ctx`` earlier tokens (never zeros), one slot more."""
    cfg = model.config
    shape = (batch, cfg.num_key_value_heads, ctx + 1, cfg.hidden_size // cfg.num_attention_heads)
    g = torch.Generator(device=device).manual_seed(1)
    keys, values = [], []
    for _ in range(cfg.num_hidden_layers):
        keys.append(torch.randn(shape, generator=g, device=device).to(torch.bfloat16))
        values.append(torch.randn(shape, generator=g, device=device).to(torch.bfloat16))
    return _StaticKV(keys, values, ctx)


# -- paths --------------------------------------------------------------------------------------


def quantized_copies(
    model: nn.Module, ids: torch.Tensor, paths: list[str]
) -> dict[str, nn.Module | str]:
    """The int8 models: pdlkit's scheme, and torchao's (or why there is none)."""
    from pdlkit.quantization import quantize

    out: dict[str, nn.Module | str] = {}
    if "pdlkit_int8" in paths or "pdlkit_int8_static_launch" in paths:
        out["pdlkit_int8"] = quantize(model, (ids,), scheme="int8-dynamic-per-token")
        out["pdlkit_int8_static_launch"] = out["pdlkit_int8"]
    for name, config in (("torchao_int8", "Int8DynamicActivationInt8WeightConfig"),
                         ("torchao_w8", "Int8WeightOnlyConfig")):  # fmt: skip
        if name in paths or f"pdlkit_{name}" in paths:
            out[name] = out[f"pdlkit_{name}"] = _torchao_copy(model, config)
    return out


def _torchao_copy(model: nn.Module, config: str) -> nn.Module | str:
    """``model`` quantized by torchao's ``config`` (or why there is none). pdlkit_<path>:
    the same model compiled by pdlkit (matcher/canonical_int8.py, patterns/cuda/torchao_*)."""
    try:
        import torchao.quantization as tq

        ao = copy.deepcopy(model)
        # set_inductor_config=False: by default the config turns on Inductor's coordinate
        # descent tuning for the whole process (torchao's recommended_inductor_config_setter),
        # which changed BF16 Inductor's code too in runs that had torchao among their paths
        # (decode 1: cuBLAS calls became fused Triton reductions, 42 kernels a step became 21).
        # --inductor-config sets such keys for every path alike.
        tq.quantize_(ao, getattr(tq, config)(set_inductor_config=False))
        return ao
    except Exception as e:  # not installed, or its config missing in this version
        return f"torchao unavailable: {type(e).__name__}: {str(e)[:120]}"


# the interpreter smoke test (--device cpu): the CUDA patterns planned for the CPU
INTERPRETER_TARGET = {"name": "cpu-triton-interpreter", "devices": ["cpu", "cuda"]}


def compile_path(
    path: str, runner: nn.Module, device: str, mode: str | None = None
) -> Callable[..., Any]:
    """``runner`` compiled as ``path`` compiles it; ``mode="reduce-overhead"``: with
    Inductor's CUDA graphs (pdlkit passes the mode to Inductor, pdlkit/inductor_options.py)."""
    if path == "bf16_eager":
        return runner
    if path.startswith("pdlkit"):
        import pdlkit

        target = INTERPRETER_TARGET if device == "cpu" else None
        extra = _STATIC_LAUNCH if path == "pdlkit_int8_static_launch" else None
        return pdlkit.optimize(
            runner, target=target, dynamic=False, mode=mode, inductor_config=extra
        )
    return torch.compile(runner, dynamic=False, mode=mode)


def runner_for(kind: str, model: Any, kv: _StaticKV | None) -> nn.Module:
    return DecodeStep(model, kv) if kind == "decode" and kv is not None else Prefill(model)


# -- measuring ----------------------------------------------------------------------------------


def bench_ms(fn: Callable[[], Any], device: str) -> float:
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_replay(fn: Callable[[], Any]) -> tuple[Callable[[], Any] | None, str]:
    """The compiled call captured in a CUDA graph: its replay (GPU time without launches),
    or None and why the capture failed."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        return graph.replay, ""
    except Exception as e:
        torch.cuda.synchronize()
        return None, f"capture failed: {type(e).__name__}: {str(e)[:160]}"


def interleave(
    timers: dict[str, dict[str, Callable[[], Any]]],
    results: dict[str, Any],
    device: str,
    rounds: int = 21,
    calls: int = 30,
) -> None:
    """Time every path's calls again, round-robin (measure.interleaved): per round and path,
    ``calls`` back-to-back calls and one synchronize, the wall time per call; the median of
    the rounds is kept, and BF16 Inductor's ratio per round. Without CUDA graphs a decode
    step is host-bound, and the shared host's load swings it by up to 2x within a minute:
    paths timed one after the other (the ``<key>_sequential`` figures) gave pdlkit's Llama-2
    decode 64 0.64x and 1.56x of BF16 Inductor in two runs of the same code on an H100."""
    from measure import interleaved

    def window(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(calls):
                fn()
            if device == "cuda":
                torch.cuda.synchronize()

        return run

    fns = {(p, k): window(fn) for p, d in timers.items() for k, fn in d.items()}
    for fn in fns.values():
        fn()
    per = interleaved({f"{p} {k}": fn for (p, k), fn in fns.items()}, rounds, 1)
    for p, k in fns:
        ms = [t / calls * 1e3 for t in per[f"{p} {k}"]]
        r = results[p]
        if r.get(k) is not None:
            r[f"{k}_sequential"] = r[k]
        r[k], r[f"{k}_rounds"] = statistics.median(ms), rounds
        base = per.get(f"bf16_inductor {k}")
        if base is not None and p != "bf16_inductor":
            ratios = sorted(b / t for b, t in zip(base, per[f"{p} {k}"], strict=True))
            r[f"{k}_round_ratio_vs_bf16_inductor"] = [
                ratios[0],
                statistics.median(ratios),
                ratios[-1],
            ]


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


def agreement(h: torch.Tensor, ref: torch.Tensor, head: torch.Tensor) -> float:
    """Share of sequences whose greedy next token (last position, random head) matches."""
    a = (h[:, -1].float() @ head.T).argmax(-1)
    b = (ref[:, -1].float() @ head.T).argmax(-1)
    return (a == b).float().mean().item()


def host_profile(fn: Callable[[], Any], calls: int = 5) -> dict[str, Any]:
    """Per call: kernels launched and CPU time until the call returns (torch.profiler); and
    the host time of back-to-back calls (returns without waiting for the GPU)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    launches = [e for e in prof.events() if "LaunchKernel" in e.name]
    launch_us = statistics.median([e.cpu_time_total for e in launches]) if launches else 0.0
    return {
        "kernels_per_call": len(kernels) / calls,
        "host_us_per_call": host * 1e6,
        "launch_api_us_median": launch_us,
        "gpu_us_by_kernel": gpu_time_by_kernel(kernels, calls),
    }


def gpu_time_by_kernel(kernels: list[Any], calls: int, top: int = 10) -> list[tuple[str, float]]:
    """The GPU time per call of the ``top`` kernels that took most (name cut to 60 characters,
    us): where a step's time goes, to set against the weights' bytes over HBM bandwidth."""
    by_name: dict[str, float] = {}
    for e in kernels:
        name = e.name[:60]
        by_name[name] = by_name.get(name, 0.0) + e.device_time_total / calls
    return sorted(by_name.items(), key=lambda kv: -kv[1])[:top]


def measure_row(
    row: str,
    models: dict[str, Any],
    ctx: int,
    device: str,
    head: torch.Tensor,
    save: Callable[[dict[str, Any]], None],
    graphs: str = "capture",
    rounds: int = 21,
) -> dict[str, Any]:
    """Every path of ``models`` on one row; the first (BF16 eager) is the reference.
    ``save`` gets the row's results after each path (a run stopped by its time limit keeps
    what it measured)."""
    kind, batch, seq = parse_row(row)
    base = models["bf16_eager"]
    g = torch.Generator(device=device).manual_seed(2)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g, device=device)
    kv = make_kv(base, batch, ctx, device) if kind == "decode" else None
    results: dict[str, Any] = {}
    timers: dict[str, dict[str, Callable[[], Any]]] = {}
    ref = None
    for path in [p for p in PATHS if p in models]:
        model = models.get(path)
        if not isinstance(model, nn.Module):
            results[path] = {"skipped": model or "not built"}
            continue
        try:
            r = measure_path(path, runner_for(kind, model, kv), ids, device, graphs, timers)
        except RuntimeError as e:  # a peer that cannot run this row (torchao: _int_mm's M > 16)
            results[path] = {"skipped": f"failed: {str(e).splitlines()[0][:120]}"}
            print(f"  {row:16s} {path:17s} failed: {e}")
            traceback.print_exc(limit=-12)
            save(results)
            continue
        results[path] = r
        ro_out = r.pop("ro_out", None)
        if ref is None:
            ref = r.pop("out")
        else:
            out = r.pop("out")
            r["cosine_vs_bf16_eager"] = cosine(out, ref)
            if kind == "decode":
                r["greedy_agreement"] = agreement(out, ref, head)
            if ro_out is not None:
                r["ro_cosine_vs_bf16_eager"] = cosine(ro_out, ref)
        print(f"  {row:16s} {path:14s} {summary(r)}", flush=True)
        save(results)
    with torch.no_grad():
        interleave(timers, results, device, rounds)
    for path in timers:
        r = results[path]
        graph = f", graph {r['graph_ms']:.3f} ms" if r.get("graph_ms") else ""
        print(f"  {row:16s} {path:14s} interleaved: {r['ms']:.3f} ms{graph}", flush=True)
    save(results)
    return results


def measure_path(
    path: str,
    runner: nn.Module,
    ids: torch.Tensor,
    device: str,
    graphs: str = "capture",
    timers: dict[str, dict[str, Callable[[], Any]]] | None = None,
) -> dict[str, Any]:
    """Compile, time (medians), profile the host side; with CUDA graphs as ``graphs`` says:
    ``capture`` the compiled call in a CUDA graph of our own, ``inductor`` compiled again
    with ``mode="reduce-overhead"`` (Inductor's CUDA graph trees), ``both``. ``timers``
    gets the path's call and graph replay, for :func:`interleave`."""
    fn = compile_path(path, runner, device)
    r: dict[str, Any] = {}
    mine: dict[str, Callable[[], Any]] = {"ms": lambda: fn(ids)}

    def first() -> None:  # compiles
        r["out"] = fn(ids)
        if device == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        t0 = time.perf_counter()
        if path.startswith("pdlkit"):
            pdlkit_stats_during(r, first)
        else:
            first()
        r["compile_s"] = time.perf_counter() - t0
        out = r["out"]
        r["ms"] = bench_ms(lambda: fn(ids), device)
        if device == "cuda" and path != "bf16_eager":
            r.update(host_profile(lambda: fn(ids)))
            if graphs in ("capture", "both"):
                replay, r["graph_note"] = graph_replay(lambda: fn(ids))
                r["graph_ms"] = bench_ms(replay, device) if replay else None
                if replay:
                    mine["graph_ms"] = replay
            if graphs in ("inductor", "both"):
                r.update(reduce_overhead(path, runner, ids, device))
        r["out"] = out.detach().clone()
    if timers is not None:
        timers[path] = mine
    return r


def reduce_overhead(path: str, runner: nn.Module, ids: torch.Tensor, device: str) -> dict[str, Any]:
    """The path compiled with ``mode="reduce-overhead"``: time, compile time, and whether
    Inductor skipped its CUDA graphs (and why: its counter)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    skips = counters["inductor"]["cudagraph_skips"]
    try:
        fn = compile_path(path, runner, device, mode="reduce-overhead")
        t0 = time.perf_counter()
        for _ in range(3):  # warm-up, record, replay
            out = fn(ids)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        ms = bench_ms(lambda: fn(ids), device)
    except Exception as e:
        return {"ro_note": f"reduce-overhead failed: {type(e).__name__}: {str(e)[:160]}"}
    skipped = counters["inductor"]["cudagraph_skips"] - skips
    r: dict[str, Any] = {"ro_ms": ms, "ro_compile_s": compile_s, "ro_skips": skipped}
    r["ro_out"] = out.detach().clone() if isinstance(out, torch.Tensor) else None
    return r


def pdlkit_stats_during(r: dict[str, Any], run: Callable[[], Any]) -> None:
    """What pdlkit substituted while ``run`` compiled and ran (stats, per kernel)."""
    import pdlkit

    pdlkit.stats(reset=True)
    run()
    by = pdlkit.stats()["by_kernel"]
    r["kernels"] = {k: v.get("substitutions", 0) for k, v in by.items() if v.get("substitutions")}
    r["runner_calls"] = sum(v.get("kernel_calls", 0) for v in by.values())
    r["undone"] = sum(v.get("substitutions_undone", 0) for v in by.values())  # graph_guard


def merged_rows(path: str | None, res: dict[str, Any]) -> dict[str, Any]:
    """The rows of an earlier run (``--merge``), noted in ``res["earlier"]``."""
    if not path or not Path(path).exists():
        return {}
    old = json.loads(Path(path).read_text())
    res["earlier"] = [*old.get("earlier", []), {k: old[k] for k in ("argv", "device", "machine")}]
    return dict(old["rows"])


def versions() -> dict[str, str]:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__}
    for name in ("triton", "torchao"):
        try:
            out[name] = __import__(name).__version__
        except Exception as e:
            out[name] = f"not available ({type(e).__name__})"
    return out


def set_inductor_config(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items (values as Python literals) set in ``torch._inductor.config`` for
    the whole process: BF16 Inductor and pdlkit (whose compile_fx reads the same config) alike."""
    import ast

    import torch._inductor.config as inductor_config

    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = ast.literal_eval(value)
    inductor_config.patch(out).__enter__()  # left on until the process ends
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="llama2-7b", choices=sorted(CONFIGS))
    ap.add_argument("--rows", nargs="*", help="rows to run, e.g. 'prefill 1x2048' 'decode 64'")
    ap.add_argument("--ctx", type=int, default=128, help="cached tokens in decode rows")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--paths", nargs="*", default=PATHS[1:4], help=f"besides bf16_eager: {PATHS[1:]}"
    )
    ap.add_argument("--merge", help="an earlier run's JSON: its rows stay unless run again")
    ap.add_argument(
        "--graphs",
        default="capture",
        choices=["capture", "inductor", "both"],
        help="CUDA graphs: capture the compiled call, or compile with mode='reduce-overhead'",
    )
    ap.add_argument(
        "--inductor-config",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="Inductor config keys set for every compiled path, e.g. coordinate_descent_tuning=True",
    )
    ap.add_argument("--rounds", type=int, default=21, help="interleaved rounds per row")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    if any(p.startswith("pdlkit") for p in a.paths):  # as a script using pdlkit imports it:
        import pdlkit.backend  # noqa: F401  before any compile (the static launcher's setting)
    set_inductor_config(a.inductor_config)
    warnings.filterwarnings("ignore", message=".*TF32.*")
    rows = a.rows or (TINY_ROWS if a.config == "tiny" else ROWS)
    res: dict[str, Any] = {"argv": sys.argv[1:], "config": a.config, "ctx": a.ctx, **versions()}
    res["rounds"] = a.rounds
    res["sizes"] = CONFIGS[a.config]
    res["device"] = torch.cuda.get_device_name() if a.device == "cuda" else "CPU (interpreter)"
    try:
        from machine import host_header

        res["machine"] = " ".join(host_header())  # CPU model, AMX, GPU name, commit
    except Exception:
        res["machine"] = ""
    print(res["machine"])
    print(res["device"], {k: res[k] for k in ("torch", "triton", "transformers", "torchao")})
    model = build_model(a.config, a.device)
    ids = torch.randint(0, VOCAB, (1, 16), device=a.device)
    # pdlkit_bf16: the same BF16 model through pdlkit (its decode attention, nothing quantized):
    # the rule that pdlkit never makes a model slower than Inductor, for a model not quantized
    models: dict[str, Any] = {"bf16_eager": model, "bf16_inductor": model, "pdlkit_bf16": model}
    models.update(quantized_copies(model, ids, a.paths))
    models = {k: v for k, v in models.items() if k == "bf16_eager" or k in a.paths}
    head = torch.randn(VOCAB, CONFIGS[a.config]["hidden_size"], device=a.device)
    res["rows"] = merged_rows(a.merge, res)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "cuda_llama" if a.config == "llama2-7b" else f"cuda_llama_{a.config}"
    for row in rows:
        torch._dynamo.reset()

        def save(results: dict[str, Any], row: str = row) -> None:
            res["rows"][row] = results
            (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
            (out / f"{name}.md").write_text(markdown(res))

        measure_row(row, models, a.ctx, a.device, head, save, a.graphs, a.rounds)
    print(markdown(res))


if __name__ == "__main__":
    main()
