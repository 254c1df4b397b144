"""A longer fuzzing run than CI's: every property of tests/fuzzing.py, and the x86 kernels'
edge cases below, for a time budget.

    python benchmarks/fuzz.py --budget 600        # seconds, shared by the properties

Random (not derandomized) examples, no example database. Prints the examples run per
property and outcome, and every falsifying example found; exits 1 if any was found.
Writes benchmarks/results/fuzz.md.

The x86 properties (where the host has AVX-512 VNNI and BF16) call each kernel as a compiled
graph does (pre-pack, then the declaration's function); a call the kernel declines
(KernelUnsupported) gets the reference's result, as pdlkit's per-call fallback gives it:

* NaN / inf / huge inputs: the BF16 linears (x, bias), the int8 linears (bias, weight
  scales), add + LayerNorm (the residual) and attention (q, k, v, the float mask) against
  eager torch: NaN and infinities where eager has them, codes within one step. One difference
  is allowed, and counted: erf GELU of a +inf pre-activation is +inf here, as Inductor
  computes it, where eager torch gives NaN.
* huge K: the int8 GEMMs (VNNI, oneDNN) at K around the int32 bounds (33025, 65793, 131071),
  extreme (x = 0 / 255, w = -128 / 127) or random data, any zero points, against the exact
  result in float64: exact, or declined; never a wrapped sum.
* aliasing and mutating kernels: a user kernel that returns a view of its input or memory
  shared with it, or modifies its input, under pdlkit.optimize with each verify mode: the
  caller's input survives and the result is eager's, or pdlkit refuses with an error naming the
  kernel (a kernel that only modifies its input is detectable by verification only).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from machine import ROOT, host_header  # benchmarks/machine.py

sys.path.insert(0, str(ROOT / "tests"))
import fuzzing  # noqa: E402  (tests/fuzzing.py)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import pdlkit  # noqa: E402

# -- x86 kernels: non-finite inputs, huge K ---------------------------------------------------------

X86 = ROOT / "kernels" / "x86"
SPECIAL = [math.nan, math.inf, -math.inf, 1e30, -1e30]
_DECLS: dict[str, Any] = {}


def _x86() -> dict[str, Any]:
    """The x86 kernels by name (loaded once), or {} on a host without VNNI / BF16."""
    if not _DECLS:
        from pdlkit.runtime_abi.capability import host
        from pdlkit.runtime_abi.registry import load_kernel_file

        if not {"avx512_vnni", "avx512_bf16"} <= host().features:
            return {}
        for name in ("linear_bf16.py", "qlinear_vnni.py", "qlinear_onednn.py"):
            _DECLS.update({k.name: k for k in load_kernel_file(X86 / name)})
        from pdlkit.kernels.x86 import attention

        _DECLS["x86_attention_q_bf16"] = attention.x86_attention_q_bf16
    return _DECLS


def _call(decl: Any, args: tuple[Any, ...], reference: Callable[..., Any], what: str) -> Any:
    """decl's result for args (pre-packing its prepack argument from the non-tensor args, as a
    compiled graph does), or the reference's where the kernel declines; counts both."""
    try:
        if decl.prepack is None:
            out = decl.fn(*args)
        else:
            i = decl.params.index(decl.prepack_arg)
            attrs = {
                p: a
                for p, a in zip(decl.params, args, strict=True)
                if not isinstance(a, torch.Tensor)
            }
            packed = decl.prepack(args[i], attrs)
            out = decl.fn(*args[:i], packed, *args[i + 1 :])
        fuzzing.CASES[f"{what}: computed"] += 1
        return out
    except pdlkit.KernelUnsupported:
        fuzzing.CASES[f"{what}: declined (reference runs)"] += 1
        return reference(*args)


def _plant(t: torch.Tensor, specials: list[tuple[float, float]]) -> torch.Tensor:
    """A copy of t with each (where in [0, 1), value) written at that flat position."""
    t = t.clone()
    flat = t.view(-1)
    for where, value in specials:
        if flat.numel():
            flat[int(where * flat.numel())] = value
    return t


def _same_floats(got: torch.Tensor, want: torch.Tensor, tol: torch.Tensor, what: str) -> None:
    """NaN and +-inf where want has them; finite values within tol (elementwise)."""
    g, w = got.double(), want.double()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert torch.equal(g.isnan(), w.isnan()), (what, "NaN positions", g, w)
    inf = w.isinf()
    assert torch.equal(g.isinf(), inf) and torch.equal(g[inf], w[inf]), (what, "inf", g, w)
    fin = w.isfinite()
    err = (g - w).abs()[fin]
    bad = err > tol.expand_as(w)[fin]
    assert not bad.any(), (what, "max error", err.max().item(), g, w)


def _same_codes(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if got.numel():
        diff = (got.int() - want.int()).abs().max().item()
        assert diff <= 1, (what, "codes differ by", diff)


nonfinite = st.fixed_dictionaries(
    {
        "kernel": st.sampled_from(
            [
                "bf16 none",
                "bf16 relu",
                "bf16 gelu",
                "bf16 gelu tanh",
                "int8 none",
                "int8 relu",
                "int8 gelu",
                "int8 gelu tanh",
                "int8 add+layernorm",
                "attention",
            ]
        ),  # fmt: skip
        "m": st.integers(1, 9),
        "k": st.integers(1, 70),
        "n": st.integers(1, 70),
        "out": st.sampled_from(["float32", "uint8", "int8"]),
        "family": st.sampled_from(["vnni", "onednn"]),  # the int8 linears' kernel
        "specials": st.lists(
            st.tuples(
                st.sampled_from(["a", "b"]),
                st.floats(0, 1, exclude_max=True),
                st.sampled_from(SPECIAL),
            ),
            max_size=3,
        ),  # fmt: skip
        "scale": st.sampled_from([0.5, 1.0, 3.0, 30.0]),
        "seed": st.integers(0, 2**16),
    }
)


def check_nonfinite(ex: dict[str, Any]) -> None:
    """An x86 kernel on inputs with NaN, +-inf or huge values gives what eager torch gives."""
    decls = _x86()
    if not decls:
        fuzzing.CASES["x86 NaN / inf: skipped (no AVX-512 VNNI / BF16)"] += 1
        return
    from pdlkit.kernels.ops import logical_ops as ref

    g = torch.Generator().manual_seed(ex["seed"])
    kind = ex["kernel"]
    at = {"a": [(w, v) for t, w, v in ex["specials"] if t == "a"]}
    at["b"] = [(w, v) for t, w, v in ex["specials"] if t == "b"]
    fuzzing.CASES[f"x86 NaN / inf: {kind}"] += 1
    if kind.startswith("bf16"):
        _nonfinite_bf16(decls, ex, g, at)
    elif kind.startswith("int8"):
        _nonfinite_int8(decls, ref, ex, g, at)
    else:
        _nonfinite_attention(decls, ref, ex, g, at)


_Specials = dict[str, list[tuple[float, float]]]  # "a" / "b": (where in [0, 1), value) to plant


def _nonfinite_bf16(
    decls: dict[str, Any], ex: dict[str, Any], g: torch.Generator, at: _Specials
) -> None:
    """A BF16 linear (+ ReLU / GELU): specials in x (a) and the bias (b)."""
    kind, m, k, n = ex["kernel"], ex["m"], ex["k"], ex["n"]
    act = kind.split(" ", 1)[1]
    x = _plant(torch.randn(m, k, generator=g) * ex["scale"], at["a"]).bfloat16()
    w = (torch.randn(n, k, generator=g) / k**0.5).bfloat16()
    b = _plant(torch.randn(n, generator=g), at["b"]).bfloat16()
    approx = "tanh" if "tanh" in act else "none"
    name = {"none": "linear_bf16", "relu": "linear_relu_bf16"}.get(act, "linear_gelu_bf16")

    def eager(x: Any, w: Any, b: Any, *a: Any) -> Any:
        y = F.linear(x, w, b)
        return torch.relu(y) if act == "relu" else F.gelu(y, approximate=approx) if a else y

    args: tuple[Any, ...] = (x, w, b, approx) if name == "linear_gelu_bf16" else (x, w, b)
    got = _call(decls[name], args, eager, f"x86 NaN / inf: {kind}")
    want = eager(*args)
    pre = F.linear(x.float(), w.float(), b.float())
    if name == "linear_gelu_bf16" and approx == "none":  # eager erf GELU(+inf) is NaN
        allowed = (pre == math.inf) & want.isnan() & (got == math.inf)
        fuzzing.CASES["x86 NaN / inf: erf GELU(+inf) = +inf (eager: NaN)"] += int(allowed.any())
        want = torch.where(allowed, got, want)
    # one bf16 rounding of each, from float32 sums in another order
    scale = x.float().abs() @ w.float().abs().t() + b.float().abs()
    _same_floats(got, want, 2**-6 * (want.float().abs() + scale), kind)


def _nonfinite_int8(
    decls: dict[str, Any], ref: Any, ex: dict[str, Any], g: torch.Generator, at: _Specials
) -> None:
    """An int8 linear (+ ReLU / GELU), or one with add + LayerNorm: specials in the weight
    scales (a) and the bias (b), or in the residual (a and b)."""
    kind, m, k, n = ex["kernel"], ex["m"], ex["k"], ex["n"]
    x_q = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
    w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ws = _plant(torch.rand(n, generator=g) * 0.01 + 1e-3, at["a"])
    b = _plant(torch.randn(n, generator=g) * ex["scale"], at["b"])
    wz = torch.zeros(n, dtype=torch.int64)
    head = (x_q, 0.02, int(torch.randint(0, 256, (1,), generator=g)), w_q, ws, wz, b)
    args: tuple[Any, ...]
    if kind == "int8 add+layernorm":
        res = _plant(torch.randn(m, n, generator=g) * 3, at["a"] + at["b"])
        ln = (res, [n], torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g), 1e-5)
        signed = ex["out"] == "int8"
        args = (*head[:4], torch.rand(n, generator=g) * 0.01 + 1e-3, wz, head[6], *ln,
                8 / 255, 0 if signed else 128, *((-128, 127) if signed else (0, 255)))  # fmt: skip
        want = ref.qlinear_add_layer_norm_q(*args)
        got = _call(decls["qlinear_add_layer_norm_q_vnni"], args,
                    ref.qlinear_add_layer_norm_q, "x86 NaN / inf: int8 add+layernorm")  # fmt: skip
        _same_floats(got[0], want[0], 1e-3 + 1e-4 * want[0].abs(), kind)
        _same_codes(got[1], want[1], kind)
        return
    post = kind.split(" ", 1)[1]
    post_op, algo = ("gelu", "tanh" if "tanh" in post else "none") if "gelu" in post else (post, "")
    what = f"x86 NaN / inf: {kind} ({ex['family']})"
    if ex["out"] == "float32":
        args = (*head, post_op, algo)
        got = _call(decls[f"qlinear_{ex['family']}"], args, ref.qlinear, what)
        want = ref.qlinear(*args)
        scale = (x_q.float() - head[2]).abs() @ (w_q.float().abs() * ws.abs()[:, None]).t()
        _same_floats(got, want, 1e-5 * (want.abs() + 0.02 * scale + b.abs()), kind)
    else:
        signed = ex["out"] == "int8"
        qr = (-128, 127) if signed else (0, 255)
        args = (*head, 0.05 * ex["scale"], 3 if signed else 120, *qr, post_op, algo)
        got = _call(decls[f"qlinear_q_{ex['family']}"], args, ref.qlinear_q, what)
        _same_codes(got, ref.qlinear_q(*args), kind)


def _nonfinite_attention(
    decls: dict[str, Any], ref: Any, ex: dict[str, Any], g: torch.Generator, at: _Specials
) -> None:
    kind, m, k = ex["kernel"], ex["m"], ex["k"]
    # attention: q, k, v [1, 2, m, k or 8], specials in q / k / v (a) or the float mask (b)
    d = 8 if k < 8 else k
    qkv = [torch.randn(1, 2, m, d, generator=g) * ex["scale"] for _ in "qkv"]
    which = ex["seed"] % 3
    qkv[which] = _plant(qkv[which], at["a"])
    mask = _plant(torch.randn(1, 1, m, m, generator=g), at["b"])
    y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)
    fin = y[y.isfinite()]
    lo, hi = (min(fin.min().item(), 0.0), max(fin.max().item(), 0.0)) if fin.numel() else (0, 1)
    out_scale = max(hi - lo, 1e-6) / 255
    args = (*qkv, mask, 0, 0.0, out_scale, min(255, round(-lo / out_scale)), 0, 255)
    got = _call(decls["x86_attention_q_bf16"], args, ref.attention_q, "x86 NaN / inf: attention")
    _same_codes(got, ref.attention_q(*args), kind)


hugek = st.fixed_dictionaries(
    {
        "kernel": st.sampled_from(["qlinear_vnni", "qlinear_onednn"]),
        "k": st.one_of(
            st.sampled_from([33025, 33026, 65793, 65794, 131071, 131072]),
            st.integers(30000, 140000),
        ),
        "x_zp": st.one_of(st.sampled_from([0, 128, 255]), st.integers(0, 255)),
        "w_zp": st.sampled_from(["zero", "127", "-128", "random"]),
        "data": st.sampled_from(["extreme", "random"]),
        "seed": st.integers(0, 2**16),
    }
)


def check_huge_k(ex: dict[str, Any]) -> None:
    """An int8 GEMM with K around its int32 bound: exact (float64 reference of the integer
    sums) or declined, never a wrapped sum."""
    decls = _x86()
    if not decls:
        fuzzing.CASES["huge K: skipped (no AVX-512 VNNI)"] += 1
        return
    g = torch.Generator().manual_seed(ex["seed"])
    k, n, x_zp = ex["k"], 8, ex["x_zp"]
    wz = {"zero": torch.zeros(n, dtype=torch.int64), "127": torch.full((n,), 127),
          "-128": torch.full((n,), -128),
          "random": torch.randint(-128, 128, (n,), generator=g)}[ex["w_zp"]]  # fmt: skip
    if ex["data"] == "extreme":  # every term at the largest magnitude
        x_q = torch.full((2, k), 255 if x_zp < 128 else 0, dtype=torch.uint8)
        w_q = torch.where(wz[:, None] >= 0, -128, 127).to(torch.int8).expand(n, k).contiguous()
    else:
        x_q = torch.randint(0, 256, (2, k), generator=g, dtype=torch.uint8)
        w_q = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    ws = torch.full((n,), 1e-6)
    args = (x_q, 1.0, x_zp, w_q, ws, wz, None, "none", "")
    exact = ((x_q.double() - x_zp) @ (w_q.double() - wz.double()[:, None]).t()) * 1e-6
    what = f"huge K: {ex['kernel']}"
    got = _call(decls[ex["kernel"]], args, lambda *a: exact.float(), what)
    torch.testing.assert_close(
        got.double(), exact, rtol=1e-6, atol=1e-9, msg=lambda m: f"{ex}: {m}"
    )


# -- user kernels that alias or modify their inputs ---------------------------------------------

_ALIASING = {
    "honest": "y = torch.relu(x @ w.t() + b)\n    return y",
    "view": "torch.relu(x @ w.t() + b, out=x)\n    return x.view(x.shape)",
    "numpy": "y = torch.relu(x @ w.t() + b)\n    x.copy_(y)\n    return torch.from_numpy(x.numpy())",
    "set_": "torch.relu(x @ w.t() + b, out=x)\n    return torch.empty(0).set_(x)",
    "mutates": "y = torch.relu(x @ w.t() + b)\n    x.zero_()\n    return y",
}
aliasing = st.fixed_dictionaries(
    {
        "body": st.sampled_from(sorted(_ALIASING)),
        "verify": st.sampled_from([False, "first_call", True]),
        "calls": st.integers(1, 3),
        "seed": st.integers(0, 2**16),
    }
)


def check_aliasing(ex: dict[str, Any]) -> None:
    """A linear + ReLU kernel whose output shares its input's memory, or that modifies its
    input: the caller's input survives and each result equals eager, or pdlkit raises an error
    naming the kernel. A kernel that only modifies its input (its output is right) can be
    caught by verification only: with verify off its input is not checked."""
    folder = Path(tempfile.mkdtemp(prefix="pdlkit-fuzz-alias-"))
    what = f"aliasing kernels: {ex['body']}, verify={ex['verify']}"
    fuzzing.CASES[what] += 1
    try:
        p, kf = folder / "p", folder / "k"
        p.mkdir()
        kf.mkdir()
        shutil.copy(fuzzing.SHIPPED_CPU_PATTERNS / "linear_relu.pdl.mlir", p)
        (kf / "k.py").write_text(
            "import torch\nimport pdlkit\nfrom torch import Tensor\n\n"
            "@pdlkit.kernel(op='linear_relu', meta=lambda x, w, b: x.new_empty(*x.shape[:-1], "
            "w.shape[0]), priority=100)\n"
            "def k_fuzz(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:\n"
            f"    {_ALIASING[ex['body']]}\n"
        )
        torch.manual_seed(ex["seed"])
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        torch._dynamo.reset()
        f = pdlkit.optimize(
            model, patterns=p, kernels=kf, verify=ex["verify"], default_codegen="eager",
            autotune="off",  # the kernel runs: a measured choice could leave the site to eager
        )  # fmt: skip
        for _ in range(ex["calls"]):
            x = torch.randn(3, 8)
            before = x.clone()
            try:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got = f(x)
            except (pdlkit.PdlkitError, pdlkit.KernelCallError) as e:
                assert "k_fuzz" in str(e), f"{ex}: an error that does not name the kernel: {e}"
                fuzzing.CASES[f"{what}: refused"] += 1
                return
            if ex["body"] == "mutates" and not ex["verify"]:
                fuzzing.CASES[f"{what}: not checked (verify off)"] += 1
                return
            assert torch.equal(x, before), f"{ex}: the caller's input was modified"
            with torch.no_grad():
                torch.testing.assert_close(got, model(before), msg=lambda m: f"{ex}: {m}")
        fuzzing.CASES[f"{what}: eager's result"] += 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


PROPERTIES: dict[str, tuple[Any, Callable[..., None]]] = {
    "random graphs vs eager": (fuzzing.graphs, fuzzing.check_graph),
    "corrupted PDL files": (
        st.tuples(st.sampled_from(sorted(fuzzing.PATTERN_FILES)), fuzzing.mutations),
        lambda ex: fuzzing.check_pdl_corruption(*ex),
    ),
    "corrupted manifests": (fuzzing.mutations, fuzzing.check_manifest_corruption),
    "corrupted kernel files": (
        fuzzing.mutations,
        lambda m: fuzzing.check_kernel_corruption(m, pinned=False),
    ),
    "corrupted pinned kernel files": (
        fuzzing.mutations,
        lambda m: fuzzing.check_kernel_corruption(m, pinned=True),
    ),
    "random native descriptors": (fuzzing.descriptors, fuzzing.check_descriptor),
    "x86 kernels on NaN / inf / huge values vs eager": (nonfinite, check_nonfinite),
    "int8 GEMMs at huge K vs exact": (hugek, check_huge_k),
    "kernels that alias or modify their inputs": (aliasing, check_aliasing),
}


def run_property(strategy: Any, check: Callable[..., None], seconds: float) -> list[str]:
    """Batches of random examples until ``seconds`` pass; the falsifying examples found."""
    failures: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:

        @settings(
            max_examples=25,
            database=None,
            deadline=60_000,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        )
        @given(strategy)
        def prop(ex: Any) -> None:
            check(ex)

        try:
            prop()
        except Exception as e:  # a falsifying example: report it, keep fuzzing
            failures.append("".join(traceback.format_exception(e)).strip())
    return failures


def run(
    budget: float, only: list[str] | None = None
) -> tuple[dict[str, int], dict[str, list[str]]]:
    names = [n for n in PROPERTIES if not only or n in only]
    fuzzing.CASES.clear()
    failures = {}
    for name in names:
        strategy, check = PROPERTIES[name]
        failures[name] = run_property(strategy, check, budget / len(names))
        print(f"{name}: done, {len(failures[name])} falsifying example(s)", flush=True)
    return dict(fuzzing.CASES), failures


def _last_error(trace: str) -> str:
    """The innermost error line of a (grouped) traceback."""
    lines = [ln.strip(" |+-") for ln in trace.splitlines()]
    errors = [ln for ln in lines if ln and ("Error" in ln or "Exception" in ln) and ":" in ln]
    return errors[-1] if errors else lines[-1]


def report(
    cases: dict[str, int], failures: dict[str, list[str]], budget: float, header: list[str]
) -> str:
    lines = [
        "# Fuzzing (hypothesis, random examples)",
        "",
        *header,  # date, CPU model, AMX, GPU name, versions, commit
        f"- budget {budget:.0f} s",
        "",
        "| property / outcome | examples |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v} |" for k, v in sorted(cases.items())]
    found = [(n, f) for n, fs in failures.items() for f in fs]
    lines += ["", f"Falsifying examples found: {len(found)}"]
    lines += [f"- {n}: `{_last_error(f)[:300]}`" for n, f in found]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=120, help="seconds in all (default 120)")
    ap.add_argument("--only", action="append", choices=sorted(PROPERTIES))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz.md")
    args = ap.parse_args()
    header = host_header()
    print("\n".join(header), flush=True)
    cases, failures = run(args.budget, args.only)
    for name, found in failures.items():
        for f in found:
            print(f"--- {name}: falsifying example ---\n{f}\n")
    text = report(cases, failures, args.budget, header)
    print(text)
    args.out.write_text(text)
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
