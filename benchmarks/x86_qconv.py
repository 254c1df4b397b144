"""int8 CNNs on x86: pdlkit's quantized convolutions against PyTorch's own int8 path.

    python benchmarks/x86_qconv.py [--threads 1] [--rounds 15] [--out benchmarks/results/x86_qconv.md]

A ResNet-18-shaped network (BasicBlocks with ReLU and residual adds, widths 64-128-256-512,
random weights) is quantized once with ``pdlkit.quantization.quantize`` (PT2E,
X86InductorQuantizer, calibrated on its example) and run as

* FP32 eager,
* PyTorch's int8 path: the converted model under ``torch.compile`` with
  ``torch._inductor.config.freezing = True`` (Inductor's oneDNN qconv lowering),
* pdlkit int8: ``pdlkit.optimize`` on the same converted model, as a user calls it (Inductor's
  defaults, no freezing); the convolutions go to ``kernels/x86/qconv_onednn.py`` through
  ``patterns/x86/qconv.pdl.mlir``,
* the same without the qconv kernels (what pdlkit did before them: without freezing, Inductor
  runs each convolution as dequantize + FP32 convolution).

The three are timed in alternating windows of a few calls (load on the machine hits all of
them alike); the table gives medians per call and pdlkit's time as a multiple of PyTorch's
(``0.95x`` = pdlkit takes 95% of its time). Outputs are compared with the converted model
run eagerly.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from machine import host_header  # benchmarks/machine.py
from measure import interleaved  # benchmarks/measure.py
from torch import nn


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)  # one module called twice, as in torchvision
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18Shaped(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (64, 128, 256, 512), classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
        )  # fmt: skip
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _randomize_bn(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)


def _without_qconv(tmp: Path) -> Path:
    """The shipped kernel folder without the qconv kernels (their patterns stay near misses)."""
    from pdlkit.config import shipped_kernels

    folder = tmp / "kernels"
    shutil.copytree(
        shipped_kernels(), folder, ignore=shutil.ignore_patterns("qconv_*", "__pycache__")
    )
    return folder


def measure(
    batch: int, size: int, rounds: int, calls: int, autotune: str, freezing: bool
) -> dict[str, Any]:
    import torch._inductor.config as ic
    from pdlkit.quantization import cosine_similarity, quantize

    import pdlkit

    torch.manual_seed(0)
    model = ResNet18Shaped().eval()
    _randomize_bn(model)
    x = torch.randn(batch, 3, size, size)
    q = quantize(model, (x,))
    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        ref = q(x)
        ic.freezing = True  # PyTorch's int8 path: Inductor lowers dq -> conv -> q to oneDNN
        peer = torch.compile(q)
        peer(x)
        ic.freezing = freezing  # default off: pdlkit as a user calls it, Inductor's defaults
        mine = pdlkit.optimize(q, autotune=autotune)
        mine(x)
        cos = cosine_similarity(mine(x), ref)
        without = pdlkit.optimize(q, autotune=autotune, kernels=_without_qconv(Path(tmp)))
        without(x)
        fns = {"fp32 eager": lambda: model(x), "PyTorch int8": lambda: peer(x),
               "pdlkit int8": lambda: mine(x), "pdlkit int8, no qconv kernels": lambda: without(x)}  # fmt: skip
        times = interleaved(fns, rounds, calls)
    report = pdlkit.explain(q, x, autotune="off")
    ratios = [m / p for m, p in zip(times["pdlkit int8"], times["PyTorch int8"], strict=True)]
    return {
        "batch": batch,
        "size": size,
        "ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
        "paired": statistics.median(ratios),
        "cos": cos,
        "subs": report.counts(),
        "convs": q.pdlkit_quantization.kinds.get("conv", 0),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--autotune",
        default="off",
        help="pdlkit's kernel choice (default off: the qconv kernels by priority)",
    )
    p.add_argument(
        "--freezing",
        action="store_true",
        help="compile pdlkit with Inductor's freezing too, as its peer: what the peer's "
        "compiler would do with the sites pdlkit leaves to it (with --autotune cached)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    header = host_header(args.threads)  # CPU model, AMX, GPU name, versions, commit
    print("\n".join(header), flush=True)
    rows = [
        measure(int(b), args.size, args.rounds, args.calls, args.autotune, args.freezing)
        for b in args.batches.split(",")
    ]
    lines = [
        f"# int8 ResNet-18-shaped CNN on x86 ({args.threads} thread(s), torch "
        f"{torch.__version__}, pdlkit autotune={args.autotune}"
        f"{', freezing' if args.freezing else ''})",
        "",
        *header,
        "",
        "| input | FP32 eager | PyTorch int8 | pdlkit int8 | pdlkit / PyTorch (paired) | "
        "pdlkit int8 without the qconv kernels | cos vs converted |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ms = r["ms"]
        lines.append(
            f"| {r['batch']}x3x{r['size']}x{r['size']} | {ms['fp32 eager']:.2f} ms | "
            f"{ms['PyTorch int8']:.2f} ms | {ms['pdlkit int8']:.2f} ms | {r['paired']:.2f}x | "
            f"{ms['pdlkit int8, no qconv kernels']:.2f} ms | {r['cos']:.6f} |"
        )
    lines += ["", "Substitutions: " + ", ".join(f"{k} x{n}" for k, n in rows[0]["subs"].items())
              + f" ({rows[0]['convs']} int8 convolutions)."]  # fmt: skip
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
