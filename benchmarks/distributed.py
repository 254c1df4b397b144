"""A 2-layer Llama under tensor parallel 2: BF16 Inductor vs pdlkit (BF16 and int8), per rank.

    python benchmarks/distributed.py                         # CPU, gloo, a small config
    python benchmarks/distributed.py --device cuda --config llama2-7b   # 2 GPUs, NCCL

Two processes are spawned (one per rank, loopback); every rank builds the same
``transformers.LlamaModel`` (2 decoder layers, random weights, seed 0) and shards it:
q/k/v/gate/up column-wise, o/down row-wise. Paths, all on the same shards:

- ``bf16_inductor`` (the peer): :func:`pdlkit.tensor_parallel.tensor_parallel` (local
  linears + a functional all_reduce), BF16, ``torch.compile`` with Inductor;
- ``bf16_pdlkit_dtensor``: DTensor ``parallelize_module`` (Colwise/RowwiseParallel), BF16,
  ``torch.compile(backend="pdlkit")``;
- ``int8_per_token_pdlkit``: the local shards quantized by ``quantize(...,
  "int8-dynamic-per-token")``, pdlkit (its shipped kernels for this scheme are CUDA ones: on a
  CPU nothing is substituted and the row is Inductor's code for the per-token graph);
- ``int8_pt2e_pdlkit`` (CPU): the local shards quantized by PT2E (``quantize(...,
  "int8-static")``, X86InductorQuantizer), pdlkit (oneDNN / VNNI int8 kernels).

Timing is interleaved: rounds of ``--iters`` calls of each path in turn, both ranks calling
the same path together (barrier first); per-rank medians and ratios to ``bf16_inductor``
measured in the same run. Cosine of the last hidden state against the unsharded FP32
model. A second table counts, per rank, the local GEMMs pdlkit substitutes against the
unsharded model's count (``pdlkit.explain``, autotune off on both): the 2-layer Llama in BF16
(DTensor) and a bert-mini int8 (PT2E on local shards). ``--out`` writes the tables as
markdown with the host's facts (benchmarks/machine.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import socket
import statistics
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

CONFIGS = {
    "cpu-small": {"hidden": 512, "inter": 1408, "heads": 8, "kv": 8, "vocab": 4096},
    "llama2-7b": {"hidden": 4096, "inter": 11008, "heads": 32, "kv": 32, "vocab": 32000},
}
TP_PLAN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}
BERT_PLAN = {
    "encoder.layer.*.attention.self.query": "colwise",
    "encoder.layer.*.attention.self.key": "colwise",
    "encoder.layer.*.attention.self.value": "colwise",
    "encoder.layer.*.attention.output.dense": "rowwise",
    "encoder.layer.*.intermediate.dense": "colwise",
    "encoder.layer.*.output.dense": "rowwise",
}
PEER = "bf16_inductor"
_GEMM = re.compile(r"torch\.ops\.aten\.(linear|addmm|mm|_int_mm|matmul)\.default")


def build_llama(cfg: dict[str, int], dtype: torch.dtype, device: str) -> nn.Module:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=cfg["vocab"],
        hidden_size=cfg["hidden"],
        intermediate_size=cfg["inter"],
        num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv"],
        num_hidden_layers=2,
        max_position_embeddings=4096,
    )
    config._attn_implementation = "sdpa"
    config.use_cache = False  # no KV cache object in the outputs (PT2E exports the model)
    torch.manual_seed(0)
    model: Any = LlamaModel(config)
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
    return model.to(device=device, dtype=dtype).eval()


def _dtensor(model: nn.Module, device: str) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {}
    for name, _ in model.named_modules():
        for key, style in TP_PLAN.items():
            if re.fullmatch(key.replace(".", r"\.").replace("*", r"[^.]+"), name):
                plan[name] = styles[style]()
    return parallelize_module(model, mesh, plan)


def _local(model: nn.Module, plan: dict[str, str] = TP_PLAN) -> nn.Module:
    from pdlkit.tensor_parallel import tensor_parallel

    return tensor_parallel(copy.deepcopy(model), plan)


def _hidden(out: Any) -> torch.Tensor:
    from measure import last_hidden

    return last_hidden(out).float()


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def _paths(args: argparse.Namespace, ids: torch.Tensor) -> dict[str, Any]:
    """The compiled callables, each path's model sharded for this rank."""
    from pdlkit.quantization import quantize

    import pdlkit  # noqa: F401  (registers the backend)

    cfg = CONFIGS[args.config]
    bf16 = build_llama(cfg, torch.bfloat16, args.device)
    paths: dict[str, Any] = {
        PEER: torch.compile(_local(bf16), backend="inductor"),
        "bf16_pdlkit_dtensor": torch.compile(
            _dtensor(copy.deepcopy(bf16), args.device), backend="pdlkit"
        ),
        "int8_per_token_pdlkit": torch.compile(
            quantize(_local(bf16), (ids,), scheme="int8-dynamic-per-token"), backend="pdlkit"
        ),
    }
    if args.device == "cpu":
        fp32 = build_llama(cfg, torch.float32, args.device)
        calib = [(torch.randint(0, cfg["vocab"], ids.shape),) for _ in range(2)]
        q = quantize(_local(fp32), (ids,), scheme="int8-static", calibration=calib)
        paths["int8_pt2e_pdlkit"] = torch.compile(q, backend="pdlkit")
    return paths


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fn: Any, ids: torch.Tensor, iters: int, device: str) -> list[float]:
    out = []
    for _ in range(iters):
        _sync(device)
        t = time.perf_counter()
        fn(ids)
        _sync(device)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def run_rank(rank: int, args: argparse.Namespace, init: str, out_dir: str) -> None:
    """One rank: compile every path, time them interleaved, count substitutions."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    device = args.device
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo",
        init_method=init,
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=600),
    )
    import pdlkit

    cfg = CONFIGS[args.config]
    result: dict[str, Any] = {"rows": {}, "counts": {}}
    with torch.no_grad():
        reference = build_llama(cfg, torch.float32, device)
        for tokens in args.tokens:
            b, s = (int(v) for v in tokens.split("x"))
            torch.manual_seed(1)
            ids = torch.randint(0, cfg["vocab"], (b, s), device=device)
            ref = _hidden(reference(ids))
            paths = _paths(args, ids)
            row: dict[str, Any] = {}
            for name, fn in paths.items():
                before = pdlkit.stats()["substitutions"]
                dist.barrier()
                t = time.perf_counter()
                out = _hidden(fn(ids))
                row[name] = {
                    "compile_s": time.perf_counter() - t,
                    "cosine": _cosine(out, ref),
                    "substitutions": pdlkit.stats()["substitutions"] - before,
                    "ms": [],
                }
            for _ in range(args.rounds):
                for name, fn in paths.items():
                    dist.barrier()
                    row[name]["ms"] += _time(fn, ids, args.iters, device)
            result["rows"][tokens] = row
        if device == "cpu" and not args.no_counts:
            result["counts"] = _gemm_counts(cfg)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _gemms_substituted(model: Any, *inputs: Any) -> tuple[int, int]:
    """(GEMMs in the re-traced graphs, GEMMs substituted) by ``pdlkit.explain``."""
    import pdlkit

    torch._dynamo.reset()
    report = pdlkit.explain(model, *inputs, autotune="off")
    before = sum(len(_GEMM.findall(g.graph_before)) for g in report.graphs)
    after = sum(len(_GEMM.findall(g.graph_after)) for g in report.graphs)
    return before, before - after


def _gemm_counts(cfg: dict[str, int]) -> dict[str, Any]:
    """Local GEMMs substituted per rank against the unsharded model's count."""
    import transformers
    from pdlkit.quantization import quantize

    counts: dict[str, Any] = {}
    torch.manual_seed(1)
    ids = torch.randint(0, cfg["vocab"], (2, 32))
    bf16 = build_llama(cfg, torch.bfloat16, "cpu")
    counts["llama 2-layer BF16 (DTensor)"] = {
        "unsharded": _gemms_substituted(bf16, ids),
        "tp": _gemms_substituted(_dtensor(copy.deepcopy(bf16), "cpu"), ids),
    }
    torch.manual_seed(0)
    bert_cfg = transformers.BertConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    )
    bert = transformers.BertModel(bert_cfg).eval()
    bids = torch.randint(0, bert_cfg.vocab_size, (8, 64))
    calib = [(torch.randint(0, bert_cfg.vocab_size, (8, 64)),) for _ in range(2)]
    full = quantize(bert, (bids,), scheme="int8-static", calibration=calib)
    tp = quantize(_local(bert, BERT_PLAN), (bids,), scheme="int8-static", calibration=calib)
    counts["bert-mini int8 (PT2E, local shards)"] = {
        "unsharded": _gemms_substituted(full, bids),
        "tp": _gemms_substituted(tp, bids),
    }
    return counts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _markdown(args: argparse.Namespace, results: list[dict[str, Any]], wall: float) -> str:
    from machine import host_header

    lines = [
        "# Tensor parallel 2: a 2-layer Llama, BF16 Inductor vs pdlkit (benchmarks/distributed.py)",
        "",
        *host_header(args.threads),
        f"- command: `python benchmarks/distributed.py {' '.join(sys.argv[1:])}`",
        f"- ranks: 2 processes, {'NCCL' if args.device == 'cuda' else 'gloo on loopback'}, "
        f"{args.threads} thread(s) each; config {args.config} {CONFIGS[args.config]}; "
        f"{args.rounds} interleaved rounds x {args.iters} calls per path; wall {wall:.0f} s",
        "",
        "| tokens | path | rank 0 median ms | rank 1 median ms | ratio to bf16_inductor (r0 / r1) "
        "| substitutions (r0 / r1) | cosine vs unsharded FP32 (r0 / r1) | first call s (r0) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for tokens in args.tokens:
        rows = [r["rows"][tokens] for r in results]
        peer = [statistics.median(r[PEER]["ms"]) for r in rows]
        for name in rows[0]:
            med = [statistics.median(r[name]["ms"]) for r in rows]
            lines.append(
                f"| {tokens} | {name} | {med[0]:.2f} | {med[1]:.2f} | "
                f"{med[0] / peer[0]:.3f} / {med[1] / peer[1]:.3f} | "
                f"{rows[0][name]['substitutions']} / {rows[1][name]['substitutions']} | "
                f"{rows[0][name]['cosine']:.5f} / {rows[1][name]['cosine']:.5f} | "
                f"{rows[0][name]['compile_s']:.1f} |"
            )
    if results[0]["counts"]:
        lines += [
            "",
            "Local GEMMs substituted (pdlkit.explain, autotune off): unsharded model vs each rank",
            "",
            "| model | unsharded: GEMMs / substituted | rank 0 | rank 1 |",
            "|---|---|---|---|",
        ]
        for model, c in results[0]["counts"].items():
            r1 = results[1]["counts"][model]["tp"]
            lines.append(
                f"| {model} | {c['unsharded'][0]} / {c['unsharded'][1]} | "
                f"{c['tp'][0]} / {c['tp'][1]} | {r1[0]} / {r1[1]} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--config", choices=sorted(CONFIGS), default=None)
    p.add_argument("--tokens", default=None, help="comma-separated BxS, e.g. 1x128,4x128")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-counts", action="store_true", help="skip the GEMM count table")
    p.add_argument("--out", type=Path, default=None, help="markdown results file")
    args = p.parse_args()
    args.config = args.config or ("cpu-small" if args.device == "cpu" else "llama2-7b")
    default = "1x128,4x64" if args.device == "cpu" else "1x2048,8x512"
    args.tokens = (args.tokens or default).split(",")
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        raise SystemExit(f"--device cuda needs 2 GPUs (found {torch.cuda.device_count()})")
    import tempfile

    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"tcp://127.0.0.1:{_free_port()}"
        mp.spawn(run_rank, args=(args, init, tmp), nprocs=2)
        results = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    text = _markdown(args, results, time.perf_counter() - t)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
