from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from pdlkit.runtime_abi.capability import host
from pdlkit.runtime_abi.native_build import host_arch

import pdlkit

# This host's CPU, named once for every test file: the ISA features pdlkit's x86 kernels
# require (runtime_abi/capability.py reads them off /proc/cpuinfo), and whether torch's oneDNN
# has BF16 matmuls (not without avx512bw/vl/dq or avx_ne_convert: an AVX2-only CPU has none,
# and the oneDNN BF16 kernels are declared for FP32 only there).
VNNI = host_arch() == "x86_64" and "avx512_vnni" in host().features
AVX512_BF16 = host_arch() == "x86_64" and "avx512_bf16" in host().features
AMX_INT8 = "amx_int8" in host().features
AMX_BF16 = "amx_bf16" in host().features
ONEDNN_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())

# Tests of the substitution machinery expect the static choice (which kernel measures fastest
# depends on the host and its load); tests/test_autotune*.py turn measurement on where it is
# the subject. Decisions never go to the developer's own cache.
os.environ["PDLKIT_AUTOTUNE"] = "off"
os.environ["PDLKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="pdlkit-test-cache-")

# the GPU tests: run by benchmarks/run_gpu.sh on the lent GPU machine, skipped elsewhere
needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs an NVIDIA GPU (runs on the lent GPU machine)"
)


# The shipped x86 GEMM kernels with an AMX twin (kernels/x86: same op, same packed weight,
# higher priority, requires amx_int8 / amx_bf16).
_AMX_TWINS = {
    "linear_bf16", "linear_gelu_bf16", "linear_relu_bf16", "qlinear_add_layer_norm_vnni",
    "qlinear_add_layer_norm_q_vnni", "qlinear_vnni", "qlinear_dynamic_vnni",
    "qlinear_dynamic_pt_vnni", "qlinear_pt_vnni", "qlinear_q_vnni", "qlinear_q_pt_vnni",
}  # fmt: skip


def on_this_host(kernel: str) -> str:
    """The kernel that static priority runs on this host in place of the VNNI / AVX512_BF16
    ``kernel``: its AMX twin where the host has AMX (``qlinear_q_vnni`` -> ``qlinear_q_amx``,
    ``linear_bf16`` -> ``linear_bf16_amx``), else ``kernel`` itself."""
    amx = AMX_BF16 if kernel.endswith("bf16") else AMX_INT8
    if kernel not in _AMX_TWINS or not amx:
        return kernel
    return kernel.removesuffix("_vnni") + "_amx"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def steady_host(monkeypatch) -> None:
    """Every timed decision is cached, whatever the host's load: a test that reads the
    decision cache is not about a busy host's rounds, which spread past ``autotune.BUSY`` on a
    loaded 2-core CI machine and keep a decision out of the cache (``autotune.trusted``;
    tests/test_autotune_busy.py's subject)."""
    from pdlkit.runtime_abi import autotune

    monkeypatch.setattr(autotune, "BUSY", float("inf"))


def run_interpreted(script: str) -> dict:
    """``script`` run in a new Python under Triton's interpreter (TRITON_INTERPRET=1, which
    Triton reads at import), from the repository's root; the JSON its last line prints."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def refused(path: Path, message: str) -> None:
    """Loading the patterns at ``path`` (a file or folder) fails with a PatternError whose text
    matches ``message``."""
    from pdlkit.matcher import PatternError, load_patterns

    with pytest.raises(PatternError, match=message):
        load_patterns([path])


def counted_calls(monkeypatch: Any, owner: Any, name: str) -> list[tuple[Any, ...]]:
    """``owner.name`` (a function or method) wrapped for the test: each call's positional
    arguments are appended to the list returned, and the call goes on as before."""
    seen: list[tuple[Any, ...]] = []
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return seen


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def pdl_pattern(
    name: str,
    match: str,
    root: str,
    op: str,
    args: str,
    benefit: int = 1,
    rewrite: str | None = None,
    at: str | None = None,
) -> str:
    """A test pattern: ``match`` (its ops and constraints, a line each), then the rewrite of
    ``root`` into ``pdlkit_call(op, args..., root)``. ``args`` are values ("%x, %w"); "%r:operation"
    or "%s:attribute" pass another kind. ``rewrite``, when given, is a line before the call;
    ``at`` roots the rewrite at another op than ``root``."""
    names, kinds = [], []
    for arg in args.split(", "):
        value, _, kind = arg.partition(":")
        names.append(value)
        kinds.append(f"!pdl.{kind or 'value'}")
    before = "" if rewrite is None else f"\n    {rewrite}"
    return f"""
pdl.pattern @{name} : benefit({benefit}) {{
{match.strip(chr(10))}
  pdl.rewrite {at or root} {{
    %op = pdl.attribute = "{op}"{before}
    pdl.apply_native_rewrite "pdlkit_call"(%op, {", ".join(names)}, {root} : !pdl.attribute, {", ".join(kinds)}, !pdl.operation)
  }}
}}
"""


# The linear a test pattern starts from: %x, %w, %b, %t and %lin = linear(%x, %w, %b).
LINEAR = """
  %x = pdl.operand
  %w = pdl.operand
  %b = pdl.operand
  %t = pdl.type
  %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%t : !pdl.type)
""".strip("\n")

# LINEAR -> gelu(%y, %approx) as %gelu, and %tanh, the attribute "tanh" (lines 2-10)
LINEAR_GELU = f"""{LINEAR}
  %y = pdl.result 0 of %lin
  %approx = pdl.operand
  %gelu = pdl.operation "torch.aten.gelu"(%y, %approx : !pdl.value, !pdl.value) -> (%t : !pdl.type)
  %tanh = pdl.attribute = "tanh"
""".strip("\n")

# relu(%x) + %y, both results used: a match with two roots, %r and %a.
RELU_ADD = """
  %x = pdl.operand
  %y = pdl.operand
  %alpha = pdl.operand
  %t = pdl.type
  %r = pdl.operation "torch.aten.relu"(%x : !pdl.value) -> (%t : !pdl.type)
  %rv = pdl.result 0 of %r
  %a = pdl.operation "torch.aten.add.Tensor"(%rv, %y, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%t : !pdl.type)
""".strip("\n")


def op_pattern(name: str, op: str, root: str = "relu", benefit: int = 1) -> str:
    """One op, %r = ``root``(%x), replaced by a call of ``op`` with %x."""
    match = f"""
  %x = pdl.operand
  %t = pdl.type
  %r = pdl.operation "torch.aten.{root}"(%x : !pdl.value) -> (%t : !pdl.type)"""
    return pdl_pattern(name, match, "%r", op, "%x", benefit)


def linear_act(act: str) -> str:
    """The match of linear -> ``act``: LINEAR, then %y its result and %act = act(%y)."""
    return f"""{LINEAR}
  %y = pdl.result 0 of %lin
  %act = pdl.operation "torch.aten.{act}"(%y : !pdl.value) -> (%t : !pdl.type)"""


def linear_act_pattern(name: str, act: str, op: str, benefit: int = 1, extra: str = "") -> str:
    """linear -> ``act`` replaced by a call of ``op`` (x, w, b); ``extra`` lines (constraints)
    start at line 9."""
    lines = "\n  ".join(line.strip() for line in extra.splitlines())
    return pdl_pattern(name, f"{linear_act(act)}\n  {lines}", "%act", op, "%x, %w, %b", benefit)


KERNEL_HEADER = """
import torch
from torch import Tensor
import pdlkit

def meta(x, w, b):
    return x.new_empty((*x.shape[:-1], w.shape[0]))
"""


def lin_kernel(op: str, name: str, body: str, decl: str = "") -> str:
    """A kernel of ``op`` named ``name`` taking (x, w, b), whose body is ``body`` (any
    indentation); ``decl`` is more of its declaration (``', dtypes={...}'``)."""
    lines = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ")
    return f"""
@pdlkit.kernel(op="{op}", meta=meta{decl})
def {name}(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
{lines}
"""


def sigmoid_kernel(name: str = "k_lin_sigmoid", decl: str = "") -> str:
    """A ``lin_sigmoid`` kernel named ``name``: sigmoid(addmm(b, x, w.T))."""
    return lin_kernel("lin_sigmoid", name, "return torch.sigmoid(torch.addmm(b, x, w.t()))", decl)


def make_folders(
    root: Path, kernels: str, op: str = "lin_sigmoid", act: str = "sigmoid", file: str = "k.py"
) -> tuple[Path, Path]:
    """A user's two folders under ``root``: patterns/<op>.pdl.mlir, one linear -> ``act``
    pattern calling ``op``, and kernels/<file> (KERNEL_HEADER + ``kernels``)."""
    p, k = root / "patterns", root / "kernels"
    write(p, f"{op}.pdl.mlir", linear_act_pattern(op, act, op))
    write(k, file, KERNEL_HEADER + kernels)
    return p, k


def compile_static(model: torch.nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """``pdlkit.optimize(model, autotune="off")`` compiled afresh (Dynamo reset) and run on
    ``x`` (checked against eager); the stats of that compilation and call."""
    torch._dynamo.reset()
    pdlkit.stats(reset=True)
    with torch.no_grad():
        y = pdlkit.optimize(model, autotune="off")(x)
        torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
    return dict(pdlkit.stats())


class MLP(torch.nn.Module):
    """linear -> relu -> linear -> sigmoid: one linear+relu site, one linear+sigmoid site."""

    def __init__(self, d: int = 16, h: int = 32):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, h)
        self.fc2 = torch.nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc2(torch.relu(self.fc1(x))))


def tiny_bert(**config: Any) -> torch.nn.Module:
    """A random transformers BertModel, eval mode: 2 layers, hidden 64, 2 heads, intermediate
    128, vocabulary 100, 32 positions (``config`` overrides); skips the test without transformers."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    base = dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=100,
        max_position_embeddings=32,
    )
    return transformers.BertModel(transformers.BertConfig(**{**base, **config})).eval()


class LinRelu(torch.nn.Module):
    """relu(fc(x)), fc a Linear(k, 8): one linear -> relu call site, named relu."""

    def __init__(self, k: int = 8):
        super().__init__()
        self.fc = torch.nn.Linear(k, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return MLP().eval(), torch.randn(4, 16)


def explain(model, *inputs, **kw) -> pdlkit.matcher.report.Report:  # type: ignore[name-defined]
    return pdlkit.explain(model, *inputs, **kw)


def pt2e(model: torch.nn.Module, x: torch.Tensor, quantizer: Any) -> torch.nn.Module:
    """``model`` through torch.export and torchao's PT2E flow with ``quantizer``, calibrated
    once on ``x``."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(), quantizer)
    prepared(x)
    converted = convert_pt2e(prepared)
    if not any("quantize" in str(n.target) for n in converted.graph.nodes):
        # torch 2.11 with torchao 0.18 (the GPU machine's host): convert_pt2e gave a graph of
        # linear and relu only, while pdlkit.quantization.quantize's own flow quantizes there
        pytest.skip(f"torchao's PT2E flow quantized nothing here (torch {torch.__version__})")
    return converted


@pytest.fixture
def folders(tmp_path, monkeypatch, steady_host):
    """The autotune tests' folders (autotune_chain.py): patterns/chain.pdl.mlir, and a function
    of kernel sources giving (patterns, a new kernels folder whose chain.py is HEADER + them);
    the decision cache under tmp_path / "cache", written to however unsteady the timings
    (``steady_host``: the chain's calls take microseconds; once a corrupted cache was not
    written again, and the test failed)."""
    from autotune_chain import CHAIN_PATTERN, HEADER

    monkeypatch.setenv("PDLKIT_CACHE_DIR", str(tmp_path / "cache"))
    p = tmp_path / "patterns"
    write(p, "chain.pdl.mlir", CHAIN_PATTERN)

    def kernels(*bodies: str):
        k = tmp_path / f"kernels{len(list(tmp_path.glob('kernels*')))}"
        write(k, "chain.py", HEADER + "".join(bodies))
        return p, k

    return kernels
