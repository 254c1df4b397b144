"""A hand-written Hopper decode GEMM, with and without the activation tile shared by a cluster's
CTAs, against the Triton loop pdlkit ships and the 80% copy-rate target (issue 23, item 3; a
probe, not a library kernel)

    python benchmarks/cuda_multicast_probe.py [--out DIR] [--cases '64 down' ...]
        [--variants mc_32_256_6_1_1_1_0_0_0 ...]

Builds ``cuda_multicast_gemm.cu`` with nvcc for sm_90a (its header says what the kernels do
and how their operands are packed), launches it with CuPy on PyTorch's stream, and times each
variant as ``cuda_decode_probe.py`` times the Triton loop: calls back to back in one CUDA
graph over weight copies three times L2's size, the better of two interleaved timings. Beside
them, in the same run: the Triton loop at the committed tile (``cuda_decode_probe``'s
``base``, 64 x 32 tiles, K steps of 256, six stages), the read floor of the weights' bytes
(``cuda_decode.stream_floor``) and the time at 80% of the 1 GiB copy rate.

Variant names: ``mc_<BN>_<BK>_<stages>_<cluster>_<A>_<hint>_<arrive>_<k outer>_<prefetch>``
(kernel ``gemm``): columns per CTA, K bytes per step, buffers, CTAs per cluster sharing the
activation tile (1: each CTA loads its own), whether activations are loaded at all (0: the
weights' stream alone, wrong sums), an L2 evict-first hint on the weights, how a CTA tells
the cluster's producers it has read a buffer (the .cu's last comment), the weights packed K
step outer (at one step the CTAs read one run of bytes), and weight steps prefetched into L2
past the ring. ``rings_<BN>_<BK>_<weight buffers>_<activation buffers>_<A>`` (kernel
``gemm_rings``): separate rings with a producer each. ``cp_<BN>_<BK>_<stages>_<hint>`` (kernel
``gemm_cpasync``): no producer warp, the warpgroup's own 16-byte ``cp.async`` copies, Ampere's
way. Every variant's relative error against
a float64 reference is reported; a wrong one's time is kept but marked.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_decode import _rotation, copy_rate, graph_ms, stream_floor, weight_copies  # noqa: E402
from cuda_decode_probe import _WS, operands  # noqa: E402
from cuda_decode_probe import run as triton_run  # noqa: E402
from machine import host_header  # noqa: E402
from measure import write_report  # noqa: E402

SOURCE = Path(__file__).resolve().parent / "cuda_multicast_gemm.cu"
CASES = [
    (64, 4096, 11008, "down 4096x11008"),
    (64, 4096, 14336, "GQA down 4096x14336"),
    (64, 4096, 4096, "o 4096x4096"),
    (16, 4096, 11008, "down 4096x11008"),
]
TRITON_TILE = (32, 256, 4, 6)  # the committed pick at these shapes (pick_split_config)


def variants() -> list[str]:
    """The entry points the .cu file instantiates (its VARIANT and RINGS lines), by name."""
    text = SOURCE.read_text()
    found = []
    for macro, prefix in (("VARIANT", "mc"), ("RINGS", "rings"), ("CPASYNC", "cp")):
        for args in re.findall(rf"^{macro}\(([\d, ]+)\)", text, re.M):
            found.append(prefix + "_" + "_".join(x.strip() for x in args.split(",")))
    return found


def build() -> Any:
    import cupy

    cubin = Path(tempfile.mkdtemp()) / "mc.cubin"
    cmd = ["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17",
           "-Xptxas", "-v", "-o", str(cubin), str(SOURCE)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    print(done.stdout[-2000:], done.stderr[-4000:], flush=True)
    done.check_returncode()
    return cupy.RawModule(path=str(cubin))


def pack_a(a: torch.Tensor, bk: int) -> torch.Tensor:
    """[M, K] int8 -> [K/bk][MR/8][bk/16][8][16] (MR: M rounded up to 8), the .cu's layout."""
    m, k = a.shape
    mr = -(-m // 8) * 8
    x = torch.zeros(mr, k, dtype=torch.int8, device=a.device)
    x[:m] = a
    return x.view(mr // 8, 8, k // bk, bk // 16, 16).permute(2, 0, 3, 1, 4).contiguous()


def pack_w(w: torch.Tensor, bn: int, bk: int, k_outer: bool = False) -> torch.Tensor:
    """[N, K] int8 -> [N/bn][K/bk][bn/8][bk/16][8][16] (k_outer: [K/bk][N/bn]...)."""
    n, k = w.shape
    x = w.view(n // bn, bn // 8, 8, k // bk, bk // 16, 16)
    return x.permute(*((3, 0) if k_outer else (0, 3)), 1, 4, 2, 5).contiguous()


class Launcher:
    """One variant's kernel, launched on PyTorch's current stream (inside graph capture too)."""

    def __init__(self, module: Any, name: str) -> None:
        kind, *nums = name.split("_")
        v = [int(x) for x in nums]
        self.bn, self.bk = v[0], v[1]
        self.k_outer = kind == "mc" and v[7] == 1
        self.fn = module.get_function(name)
        if kind == "mc":  # STAGES buffers of both operands
            self.block, self.smem = 160, v[2] * ((64 + self.bn) * self.bk + 16)
        elif kind == "cp":  # the same buffers, no barriers: one warpgroup copies and multiplies
            self.block, self.smem = 128, v[2] * (64 + self.bn) * self.bk
        else:  # WS weight buffers, AS activation buffers
            self.block = 192
            self.smem = v[2] * (self.bn * self.bk + 16) + v[3] * (64 * self.bk + 16)
        self.fn.max_dynamic_shared_size_bytes = self.smem

    def __call__(self, a: Any, w: Any, sa: Any, sw: Any, c: Any, m: int, n: int, k: int) -> None:
        import cupy
        import numpy as np

        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            args = (a, w, sa, sw, c, np.int32(m), np.int32(n), np.int32(k // self.bk))
            self.fn((n // self.bn,), (self.block,), args, shared_mem=self.smem)


def probe_case(module: Any, m: int, n: int, k: int, names: list[str], gbs: float) -> dict[str, Any]:
    import cupy

    copies = weight_copies(n * k)
    ws, a, sa, sw, c = operands(m, n, k, copies)
    ref = ((a.double() @ ws[0].double().T) * sa[:, None].double() * sw.double()).float()
    row: dict[str, Any] = {"m": m, "n": n, "k": k, "errors": {}}
    row["floor_us"] = stream_floor(n * k, copies)["read_graph_ms"] * 1e3
    row["target_us"] = n * k / gbs / 1e3 / 0.8
    calls: dict[str, list[Any]] = {}
    for key in (
        "ws",
        "counters",
        "zeroed",
    ):  # the Triton loop's split-K scratch (one slice: unused)
        _WS[key] = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    calls["triton base"] = [
        functools.partial(triton_run, a, w, c, sa, sw, TRITON_TILE, "base") for w in ws
    ]
    packed_by_shape: dict[tuple[int, int, bool], tuple[Any, list[Any]]] = {}
    cp = cupy.from_dlpack
    for v in variants():
        if v not in names:
            continue
        launch = Launcher(module, v)
        if k % launch.bk:  # K steps of this size do not divide K
            continue
        layout = (launch.bn, launch.bk, launch.k_outer)
        if layout not in packed_by_shape:
            pa = cp(pack_a(a, launch.bk))
            packed_by_shape[layout] = (pa, [cp(pack_w(w, *layout)) for w in ws])
        pa, pws = packed_by_shape[layout]
        calls[v] = [
            functools.partial(launch, pa, pw, cp(sa), cp(sw), cp(c.view(torch.int16)), m, n, k)
            for pw in pws
        ]
    for label, fns in calls.items():
        c.fill_(float("nan"))
        fns[0]()
        torch.cuda.synchronize()
        err = ((c.double() - ref.double()).norm() / ref.double().norm()).item()
        row["errors"][label] = err
    times: dict[str, float] = {}
    for _ in range(2):
        for label, fns in calls.items():
            us = graph_ms(_rotation(fns)) * 1e3
            times[label] = min(times.get(label, us), us)
    row["us"] = times
    print(row, flush=True)
    return row


def markdown(rows: list[dict[str, Any]], gbs: float) -> str:
    labels = list(dict.fromkeys(lab for r in rows for lab in r["us"]))
    lines = [f"# A hand-written Hopper decode GEMM against the Triton loop ({torch.cuda.get_device_name()})",
             "", *host_header(), "", f"Copy rate {gbs:.0f} GB/s. us per call; `(wrong)`: relative "
             "error over 1e-2 (variants that load no activations, or a descriptor reading that "
             "is not the hardware's).", "",
             "| M | GEMM (N x K) | read floor us | 80% of copy us | " + " | ".join(labels) + " |",
             "|" + "---|" * (len(labels) + 4)]  # fmt: skip
    for r in rows:
        cells = []
        for lab in labels:
            if lab not in r["us"]:
                cells.append("-")
                continue
            bad = " (wrong)" if not r["errors"][lab] < 1e-2 else ""
            cells.append(f"{r['us'][lab]:.1f}{bad}")
        lines.append(f"| {r['m']} | {r['n']}x{r['k']} | {r['floor_us']:.1f} | {r['target_us']:.1f} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--cases", nargs="*", help="only the cases whose 'M name' holds one of these")
    ap.add_argument("--variants", nargs="*", help="entry points (default: all the .cu defines)")
    args = ap.parse_args()
    names = args.variants or variants()
    module = build()
    cases = [c for c in CASES if not args.cases or any(w in f"{c[0]} {c[3]}" for w in args.cases)]
    gbs = copy_rate()
    rows = [probe_case(module, m, n, k, names, gbs) for m, n, k, _ in cases]
    out = Path(args.out)
    write_report(out / "cuda_multicast_probe.md", markdown(rows, gbs))
    (out / "cuda_multicast_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
