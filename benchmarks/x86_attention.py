"""The x86 attention kernel (``kernels/x86/attention.c``, op ``attention_q``) against eager torch.

    python benchmarks/x86_attention.py              # bert-mini shapes: [8, 4, 64, 64], one thread
    python benchmarks/x86_attention.py --bert-base  # + BERT-base shapes: [1, 12, 128, 64]
    python benchmarks/x86_attention.py --bert-mini-model  # + accuracy on real bert-mini activations
    python benchmarks/x86_attention.py --llama      # + [8, 8, 64, 64] with a causal bool mask
    python benchmarks/x86_attention.py --rounds 15 --calls 20

Inputs are laid out as in bert-mini's PT2E graph: q, k, v are [B, H, S, D] views of
[B, S, H * D] linear outputs (strides (S H D, D, H D, 1)); the mask is bool [B, 1, S, S] with
strides (0, S, 1, 0) (HF BERT's expanded mask, all True). out_scale / out_zp are calibrated
on the FP32 output's range (as PT2E's observers do). Variants, all under ``torch.no_grad()``:

* ``eager``: ``quantize_per_tensor(F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
  scale=1/sqrt(D)), ...)`` in eager torch (the baseline);
* ``inductor``: that same function under ``torch.compile`` (Inductor's code: the "keep the
  subgraph" candidate that pdlkit's measured choice compares the kernel with);
* ``compiled``: that same function under ``pdlkit.optimize(..., autotune="off")`` (the shipped
  pattern turns it into one ``torch.ops.pdlkit.x86_attention_q_bf16`` call: how a compiled
  graph calls the kernel). This includes the compiled function's fixed cost per call (Dynamo's guards, the
  AOT / Inductor wrappers: about 40 us here at tiny shapes), which a whole compiled model
  pays once per forward, not per attention;
* ``decl.fn``: the kernel declaration's Python function (ctypes call, no dispatcher; about
  30 us of it is the Python / ctypes marshalling in ``runtime_abi/native.py``);
* ``vector``: on a host with AMX-BF16 only, ``decl.fn`` of the same source built with
  ``-DPDLKIT_ATTENTION_NO_AMX`` (Q K^T and P V on the AVX512_BF16 vector units, as on a host
  without AMX): ``decl.fn / vector`` is what the tiles (``kernels/x86/attention_amx.h``) gain.

Rounds are interleaved (eager, compiled, decl.fn, eager, ...) in one process with
``torch.set_num_threads(1)``; each round times ``--calls`` back-to-back calls per variant and
keeps the mean per call. Printed: the median over rounds and its ratio to eager's median.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from machine import host_header  # benchmarks/machine.py
from measure import interleaved  # benchmarks/measure.py


def inputs(b: int, h: int, s: int, d: int, causal: bool = False) -> tuple[torch.Tensor, ...]:
    """q, k, v and BERT's expanded all-true mask, or (``causal``) a decoder's [B, 1, S, S]
    lower-triangular bool mask, as transformers' Llama passes to sdpa."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(b, s, h * d, generator=g).view(b, s, h, d).transpose(1, 2) for _ in "qkv"
    )
    mask = torch.ones(s, dtype=torch.bool)[None, None, :, None].expand(b, 1, s, s)
    if causal:
        mask = torch.ones(s, s, dtype=torch.bool).tril().expand(b, 1, s, s).contiguous()
    return q, k, v, mask


class AttentionQ(torch.nn.Module):
    def __init__(self, scale: float, out_scale: float, out_zp: int):
        super().__init__()
        self.scale, self.out_scale, self.out_zp = scale, out_scale, out_zp

    def forward(self, q: Any, k: Any, v: Any, mask: Any) -> Any:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return torch.ops.quantized_decomposed.quantize_per_tensor(
            y, self.out_scale, self.out_zp, 0, 255, torch.uint8
        )


def codes(out: torch.Tensor, want: torch.Tensor) -> str:
    diff = (out.int() - want.int()).abs()
    return f"max code diff {diff.max().item()}, differing {100 * (diff > 0).float().mean().item():.2f}%"


def vector_build() -> Any:
    """x86_attention_q_bf16 built with its AMX tiles off (None where the host has no AMX-BF16)."""
    from pdlkit.kernels.x86 import attention
    from pdlkit.runtime_abi.capability import host
    from pdlkit.runtime_abi.native_build import build_library
    from pdlkit.runtime_abi.native_load import load_native_library

    if "amx_bf16" not in host().features:
        return None
    path = build_library(
        attention.SOURCE, "x86_64", extra=("-fopenmp", "-DPDLKIT_ATTENTION_NO_AMX")
    )
    return {k.name: k for k in load_native_library(path)}["x86_attention_q_bf16"]


def timing(
    label: str, shape: tuple[int, int, int, int], rounds: int, calls: int, causal: bool = False
) -> None:
    from pdlkit.kernels.x86 import attention

    import pdlkit

    decl = attention.x86_attention_q_bf16
    b, h, s, d = shape
    q, k, v, mask = inputs(b, h, s, d, causal)
    scale = d**-0.5
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    lo, hi = min(y.min().item(), 0.0), max(y.max().item(), 0.0)
    out_scale = (hi - lo) / 255
    out_zp = round(-lo / out_scale)
    eager = AttentionQ(scale, out_scale, out_zp)
    torch._dynamo.reset()  # a fresh compilation per shape (no automatic dynamic shapes)
    inductor = torch.compile(eager)
    # autotune off: the kernel runs even where Inductor's code measures faster (what it compares)
    compiled = pdlkit.optimize(eager, autotune="off")
    pdlkit.stats(reset=True)
    variants = {
        "eager": lambda: eager(q, k, v, mask),
        "inductor": lambda: inductor(q, k, v, mask),
        "compiled": lambda: compiled(q, k, v, mask),
        "decl.fn": lambda: decl.fn(q, k, v, mask, 0, scale, out_scale, out_zp, 0, 255),
    }
    vec = vector_build()
    if vec is not None:
        variants["vector"] = lambda: vec.fn(q, k, v, mask, 0, scale, out_scale, out_zp, 0, 255)
    with torch.no_grad():
        want = variants["eager"]()
        for name in [n for n in variants if n != "eager"]:
            print(f"{label} {name}: {codes(variants[name](), want)}")
        st = pdlkit.stats()["by_kernel"].get(decl.name, {})
        assert st.get("kernel_calls") == 1 and st.get("fallbacks") == 0, st  # the kernel ran
        for f in variants.values():
            for _ in range(3):
                f()
        times = interleaved(variants, rounds, calls)
    base = statistics.median(times["eager"])
    print(f"{label} {list(shape)}, 1 thread, {rounds} interleaved rounds x {calls} calls:")
    for name, t in times.items():
        med = statistics.median(t)
        print(f"  {name:<10} median {med * 1e6:8.1f} us   ratio {med / base:.3f}")


def model_accuracy() -> None:
    """Kernel vs PT2E eager at the 4 attention sites of a random-weight bert-mini (8 x 64)."""
    import transformers
    from pdlkit.kernels.x86 import attention
    from pdlkit.quantization import quantize

    cfg = transformers.BertConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    )
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (8, 64))
    q = quantize(model, (ids,), scheme="int8-static")
    sites: dict[str, list[Any]] = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            if n.op == "call_function" and "scaled_dot_product" in str(n.target):
                sites[n.name] = [self.env[a] if isinstance(a, torch.fx.Node) else a for a in n.args]
                sites[n.name].append(n.kwargs.get("scale", 0.0))
            elif n.op == "call_function" and "quantize_per_tensor" in str(n.target):
                src = n.args[0]
                while isinstance(src, torch.fx.Node) and "scaled_dot" not in str(src.target):
                    if not any(s in str(src.target) for s in ("reshape", "transpose", "view")):
                        break
                    src = src.args[0]
                if isinstance(src, torch.fx.Node) and src.name in sites:
                    sites[src.name].append((n.args[1:5], out))
            return out

    with torch.no_grad():
        Capture(q).run(ids)
    for name, (qq, kk, vv, mask, scale, ((os_, zp, lo, hi), want)) in sites.items():
        got = attention.x86_attention_q_merged_bf16.fn(qq, kk, vv, mask, 0, scale, os_, zp, lo, hi)
        print(f"bert-mini PT2E {name}: {codes(got, want)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bert-base", action="store_true")
    ap.add_argument("--bert-mini-model", action="store_true")
    ap.add_argument("--llama", action="store_true", help="+ [8, 8, 64, 64], a causal mask")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print("\n".join(host_header(threads=1)))
    import torchao.quantization.pt2e  # noqa: F401  (registers quantized_decomposed)

    timing("bert-mini", (8, 4, 64, 64), args.rounds, args.calls)
    if args.bert_base:
        timing("bert-base", (1, 12, 128, 64), args.rounds, args.calls)
    if args.llama:
        timing("llama causal", (8, 8, 64, 64), args.rounds, args.calls, causal=True)
    if args.bert_mini_model:
        model_accuracy()


if __name__ == "__main__":
    main()
