"""Decode steps over a growing cache on a GPU: does a compiled Llama compile again every step?

    python benchmarks/cuda_growing_cache.py [--config llama3-gqa] [--batch 1] [--ctx 128]
        [--steps 8] [--paths bf16_inductor pdlkit_int8] [--out DIR]

The model of ``benchmarks/cuda_llama.py`` (transformers' ``LlamaModel``, 2 decoder layers,
random weights, BF16) with transformers' ``DynamicCache``: a prefill of ``--ctx`` tokens
(BF16 eager) fills the cache, then each path, compiled once (``torch.compile`` /
``pdlkit.optimize``, dynamic shapes as torch decides: static first, the cache's length
dynamic from the second length on), takes ``--steps`` decode steps of one token per sequence
on its own copy of that cache, one token longer each step. Per step: Dynamo's graphs compiled
during it, its wall time, the cosine of its hidden state against BF16 eager's step on a copy
of its own. Also the Triton kernels compiled for the decode attention outside Inductor (the
per-call runner of a site chosen per shape bucket), and pdlkit's substitutions.

``--device cpu --config tiny`` (with ``TRITON_INTERPRET=1``) runs the same code on the CPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_llama import (  # noqa: E402
    CONFIGS,
    INTERPRETER_TARGET,
    VOCAB,
    build_model,
    cosine,
)


class Step(nn.Module):
    """One decode step: the model's last hidden state, the cache updated in place."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
        return out.last_hidden_state


def compiled(path: str, model: nn.Module, ids: torch.Tensor, device: str) -> Any:
    if path == "bf16_inductor":
        return torch.compile(Step(model))
    from pdlkit.quantization import quantize

    import pdlkit

    q = quantize(copy.deepcopy(model), (ids,), scheme="int8-dynamic-per-token")
    return pdlkit.optimize(Step(q), target=INTERPRETER_TARGET if device == "cpu" else None)


def attention_kernels() -> int:
    """Triton kernels compiled so far for the decode attention by Triton's own launcher."""
    try:
        from pdlkit.kernels.cuda import _triton_attention as T
    except ImportError:
        return 0
    caches = getattr(T.decode_attention_kernel, "device_caches", {})
    return sum(len(c[0]) for c in caches.values())


def decode(path: str, model: nn.Module, cache: Any, a: argparse.Namespace) -> dict[str, Any]:
    """``a.steps`` steps of ``path`` over its own copy of ``cache``, against BF16 eager."""
    from torch._dynamo.utils import counters

    g = torch.Generator(device=a.device).manual_seed(3)
    steps = [
        torch.randint(0, VOCAB, (a.batch, 1), generator=g, device=a.device) for _ in range(a.steps)
    ]
    torch._dynamo.reset()
    fn = compiled(path, model, steps[0], a.device)
    ours, ref = copy.deepcopy(cache), copy.deepcopy(cache)
    eager = Step(model)
    r: dict[str, Any] = {"graphs": [], "ms": [], "cosine": [], "cache_len": []}
    kernels = attention_kernels()
    if path.startswith("pdlkit"):
        import pdlkit

        pdlkit.stats(reset=True)
    with torch.no_grad():
        for ids in steps:
            graphs = counters["stats"]["unique_graphs"]
            sync(a.device)
            t0 = time.perf_counter()
            h = fn(ids, ours)
            sync(a.device)
            r["ms"].append((time.perf_counter() - t0) * 1e3)
            r["graphs"].append(counters["stats"]["unique_graphs"] - graphs)
            r["cosine"].append(cosine(h, eager(ids, ref)))
            r["cache_len"].append(ours.get_seq_length())
    r["attention_kernels_compiled_by_triton"] = attention_kernels() - kernels
    if path.startswith("pdlkit"):
        import pdlkit

        by = pdlkit.stats()["by_kernel"]
        r["kernels"] = {k: v["substitutions"] for k, v in by.items() if v.get("substitutions")}
        r["runner_calls"] = sum(v.get("kernel_calls", 0) for v in by.values())
    return r


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    from transformers import DynamicCache

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="llama3-gqa", choices=sorted(CONFIGS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--paths", nargs="*", default=["bf16_inductor", "pdlkit_int8"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    torch._logging.set_logs(recompiles=True)  # why each graph after the first was compiled
    model = build_model(a.config, a.device)
    ids = torch.randint(0, VOCAB, (a.batch, a.ctx), device=a.device)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    res: dict[str, Any] = {"argv": sys.argv[1:], "torch": torch.__version__, "paths": {}}
    for path in a.paths:
        res["paths"][path] = r = decode(path, model, cache, a)
        print(path, json.dumps(r), flush=True)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "cuda_growing_cache.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
