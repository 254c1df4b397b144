"""bert-mini 8 x 64 on one AArch64 core (Alibaba Yitian 710): pdlkit int8 / BF16 against PyTorch.

    python benchmarks/aarch64_bert.py                  # on the AArch64 host itself
    python benchmarks/aarch64_bert.py --repeats 50 --rounds 3 --threads 1

Refuses to run anywhere but AArch64 (this repository's x86 machine can only plan:
``pdlkit explain examples/yitian_bert.py:example --target yitian``, and estimate:
benchmarks/aarch64.md). On AArch64 the shipped kernel folder builds kernels/aarch64/a64_gemm.c
natively on first use (``pdlkit build-kernels`` runs the same command; needs ``cc``).

Model and inputs as benchmarks/x86_bert.py builds them (``transformers.BertModel``, 4 layers,
hidden 256, random weights, seed 0, eval, SDPA attention, 8 x 64 random ``input_ids``). The
configurations, each after ``torch._dynamo.reset()``, in ``--rounds`` interleaved passes:

1. ``fp32-eager``: the model as is (PyTorch: oneDNN + ACL GEMMs on AArch64);
2. ``fp32-inductor``: ``torch.compile(model)``;
3. ``bf16-inductor``: ``torch.compile(model.to(bfloat16))``;
4. ``int8-pt2e-inductor``: the PT2E int8 model (``pdlkit.quantization.quantize``, static,
   per-channel weights) under ``torch.compile`` with ``freezing = True``: PyTorch's own path;
5. ``pdlkit-int8``: ``pdlkit.optimize`` on that model (a64_*_i8mm kernels on i8mm cores);
6. ``pdlkit-bf16``: ``pdlkit.optimize`` on the BF16 model (a64_linear*_bf16 kernels).

Prints and writes (``results/aarch64_bert.md``) medians and 10th percentiles in ms, ratios
against FP32 eager and against the int8 peer (4), which kernels ran (and any fallbacks), the
cosine similarity against FP32 eager, and BladeDISC's published Yitian figures next to them
(one core: PyTorch FP32 127.8 ms, BladeDISC int8 31.1 ms; same model size and batch).
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from measure import write_report  # benchmarks/measure.py

HERE = Path(__file__).resolve().parent
BLADEDISC_YITIAN = {"PyTorch FP32 (BladeDISC's table)": 127.8, "BladeDISC int8": 31.1}


def _refuse_off_aarch64() -> None:
    arch = platform.machine().lower()
    if arch not in ("aarch64", "arm64"):
        sys.exit(
            f"aarch64_bert.py measures on an AArch64 host (e.g. Alibaba Yitian 710); this host is "
            f"{arch}. Here: `pdlkit explain examples/yitian_bert.py:example --target yitian` shows "
            "the plan, benchmarks/aarch64.md the estimate from the disassembly."
        )


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "aarch64_bert.md")
    return ap.parse_args()


def _configurations(threads: int) -> tuple[Any, Any, dict[str, Callable[[], Any]]]:
    """(the input ids, FP32 eager's last hidden state, each configuration's compile)."""
    import torch
    from pdlkit.quantization import quantize

    import pdlkit

    sys.path.insert(0, str(HERE.parent / "examples"))
    from yitian_bert import bert_mini

    torch.set_num_threads(threads)
    model, ids = bert_mini()
    with torch.no_grad():
        ref = model(ids)[0].float()
        bf16 = quantize(model, (ids,), scheme="bf16")
        int8 = quantize(model, (ids,), scheme="int8-static")

    configs = {
        "fp32-eager": lambda: model,
        "fp32-inductor": lambda: torch.compile(model),
        "bf16-inductor": lambda: torch.compile(bf16),
        "int8-pt2e-inductor": lambda: torch.compile(int8),
        "pdlkit-int8": lambda: pdlkit.optimize(int8),
        "pdlkit-bf16": lambda: pdlkit.optimize(bf16),
    }
    return ids, ref, configs


def _measure(
    args: argparse.Namespace, ids: Any, ref: Any, configs: dict[str, Callable[[], Any]]
) -> tuple[dict[str, list[float]], dict[str, float], dict[str, str]]:
    """Every configuration in ``args.rounds`` interleaved rounds: (timed calls in ms, cosine
    against FP32 eager and the kernels that ran, both from round 1)."""
    import statistics
    import time

    import torch
    import torch._inductor.config as ic
    from pdlkit.quantization import cosine_similarity

    import pdlkit

    times: dict[str, list[float]] = {name: [] for name in configs}
    cosine: dict[str, float] = {}
    kernels: dict[str, str] = {}
    for rnd in range(args.rounds):
        for name, make in configs.items():
            torch._dynamo.reset()
            ic.freezing = name in ("int8-pt2e-inductor", "pdlkit-int8")
            pdlkit.stats(reset=True)
            fn = make()
            with torch.no_grad():
                out = fn(ids)  # compiles
                for _ in range(args.warmup):
                    fn(ids)
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    out = fn(ids)
                    times[name].append((time.perf_counter() - t) * 1e3)
            if rnd == 0:
                cosine[name] = float(cosine_similarity(out[0].float(), ref))
                st = pdlkit.stats()["by_kernel"]
                kernels[name] = ", ".join(
                    f"{k} {v['kernel_calls']} calls / {v['fallbacks']} fallbacks"
                    for k, v in st.items()
                    if v["kernel_calls"] or v["fallbacks"]
                )
            print(
                f"round {rnd + 1} {name}: median {statistics.median(times[name]):.2f} ms",
                flush=True,
            )
    ic.freezing = False
    return times, cosine, kernels


def _report(
    args: argparse.Namespace,
    times: dict[str, list[float]],
    cosine: dict[str, float],
    kernels: dict[str, str],
    header: list[str],
) -> str:
    import statistics

    import torch
    from pdlkit.runtime_abi.capability import host

    def pct(v: list[float], q: float) -> float:
        return sorted(v)[int(q * (len(v) - 1))]

    med = {n: statistics.median(v) for n, v in times.items()}
    peer = med["int8-pt2e-inductor"]
    lines = [
        "# bert-mini 8 x 64 on AArch64",
        "",
        *header,  # CPU model, AMX, threads, GPU name, versions, commit
        f"- AArch64 features: {', '.join(sorted(host().features))}",
        f"- torch {torch.__version__}; {args.rounds} rounds x {args.repeats} timed calls",
        "",
        "| configuration | median ms | p10 ms | vs FP32 eager | vs PyTorch int8 | cosine vs FP32 | kernels |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, v in times.items():
        lines.append(
            f"| {n} | {med[n]:.2f} | {pct(v, 0.1):.2f} | {med['fp32-eager'] / med[n]:.2f}x | "
            f"{peer / med[n]:.2f}x | {cosine[n]:.4f} | {kernels.get(n, '')} |"
        )
    lines += ["", "BladeDISC's published Yitian figures (one core, same model and batch):", ""]
    lines += [f"- {k}: {v} ms" for k, v in BLADEDISC_YITIAN.items()]
    lines.append(f"- pdlkit int8 here: {med['pdlkit-int8']:.2f} ms")
    return "\n".join(lines) + "\n"


def main() -> int:
    args = _parse_args()
    _refuse_off_aarch64()
    from machine import host_header  # benchmarks/machine.py

    ids, ref, configs = _configurations(args.threads)
    header = host_header(args.threads)
    print("\n".join(header), flush=True)
    times, cosine, kernels = _measure(args, ids, ref, configs)
    write_report(args.out, _report(args, times, cosine, kernels, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
