"""AArch64 kernels (kernels/aarch64/a64_gemm.c), verified on this x86 machine under emulation.

The library is cross-built with the documented command (aarch64-linux-gnu-gcc) and run
under qemu-aarch64 by ``abi_driver``, which calls it through the same entry points as
pdlkit's loader: pdlkit_register -> descriptor -> prepack -> meta -> run with a real call
frame. The tests write the inputs, the driver writes the outputs, and the tests compare
them with the reference semantics of each logical op (kernels/ops/logical_ops.py).
"""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from pdlkit.runtime_abi import native_abi as native  # the C ABI as ctypes sees it
from pdlkit.runtime_abi.native_build import build_driver, build_library
from pdlkit.runtime_abi.reference import lookup
from pdlkit.runtime_abi.registry import load_kernel_file

from pdlkit.config import shipped_kernels

CROSS = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")
SYSROOT = "/usr/aarch64-linux-gnu"
A64 = shipped_kernels() / "aarch64"
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Emulated:
    lib: Path
    driver: Path
    root: Path

    def run(self, cases: list[Path], cpu: str = "max") -> None:
        cmd = [str(QEMU), "-cpu", cpu, "-L", SYSROOT, str(self.driver), str(self.lib)]
        r = subprocess.run([*cmd, *map(str, cases)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr


@pytest.fixture(scope="session")
def a64(tmp_path_factory) -> Emulated:
    """The library and the driver, built once per session."""
    if CROSS is None:
        pytest.skip("needs the AArch64 cross compiler (apt-get install gcc-aarch64-linux-gnu)")
    if QEMU is None or not Path(SYSROOT).is_dir():
        pytest.skip(
            "needs qemu-aarch64 and the arm64 libc (apt-get install qemu-user libc6-dev-arm64-cross)"
        )
    out = tmp_path_factory.mktemp("a64")
    return Emulated(build_library(arch="aarch64", out_dir=out), build_driver("aarch64", out), out)


def _decls() -> dict[str, Any]:
    load_kernel_file(shipped_kernels() / "ops" / "logical_ops.py")  # the ops, then kernels
    return {k.name: k for k in load_kernel_file(A64 / "a64_gemm.py")}


def _reference(op: str) -> Any:
    load_kernel_file(shipped_kernels() / "ops" / "logical_ops.py")
    ref = lookup(op)
    assert ref is not None
    return ref.fn


_counter = iter(range(1_000_000))


def write_case(root: Path, kernel: str, args: tuple[Any, ...]) -> Path:
    """A case directory for ``abi_driver``: the kernel's tensors and attributes, in order."""
    decl = _decls()[kernel]
    d = root / f"case{next(_counter)}"
    d.mkdir()
    lines = [f"kernel {kernel}"]
    for i, (name, v) in enumerate(zip(decl.params, args, strict=True)):
        if v is None:
            lines.append("input none")
        elif isinstance(v, torch.Tensor):
            code, bits = native._DL_CODES[v.dtype]
            v = v.contiguous()
            (d / f"in{i}.bin").write_bytes(
                v.view(torch.uint8).numpy().tobytes() if v.numel() else b""
            )
            lines.append(f"input {code} {bits} {v.dim()} {' '.join(map(str, v.shape))} in{i}.bin")
        elif isinstance(v, str):
            lines.append(f"attr str {name} {v}".rstrip())
        elif isinstance(v, float):
            lines.append(f"attr float {name} {v.hex()}")
        else:
            lines.append(f"attr int {name} {int(v)}")
    (d / "case.txt").write_text("\n".join(lines) + "\n")
    return d


def read_result(case: Path) -> torch.Tensor | tuple[int, str]:
    """The output tensor, or (status, message) when the kernel did not return OK."""
    status, _, message = (case / "status.txt").read_text().strip().partition(" ")
    if int(status) != 0:
        return int(status), message
    code, bits, ndim, *shape = map(int, (case / "out0.txt").read_text().split())
    dtype = native._DTYPES[(code, bits)]
    raw = bytearray((case / "out0.bin").read_bytes())
    flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return flat.reshape(shape[:ndim])


# -- inputs -------------------------------------------------------------------------------------

SHAPES = [  # (leading dims of x, K, N): M = 1, K % 8 != 0, N % 8 != 0, 3-D, odd M, tiny
    ((1,), 1, 1), ((1,), 7, 3), ((1,), 64, 256), ((2,), 9, 17), ((5,), 33, 8), ((8,), 16, 16),
    ((13,), 130, 70), ((2, 3), 24, 40), ((17,), 1030, 9), ((0,), 8, 8), ((3,), 0, 5),
]  # fmt: skip


def qlinear_args(
    lead: tuple[int, ...], k: int, n: int, *, signed: bool, per_channel: bool, bias: bool,
    post: str, algo: str, seed: int,
) -> tuple[Any, ...]:  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    lo, hi, dt = (-128, 128, torch.int8) if signed else (0, 256, torch.uint8)
    x_q = torch.randint(lo, hi, (*lead, k), generator=g, dtype=dt)
    w_q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    w_scale = torch.rand(n if per_channel else 1, generator=g) * 0.01 + 1e-3
    if not per_channel:
        w_scale = w_scale.expand(n).contiguous()  # per-tensor as the PT2E per-channel op sees it
    w_zp = torch.zeros(n, dtype=torch.int64)
    b = torch.randn(n, generator=g) if bias else None
    x_zp = int(torch.randint(lo, hi, (1,), generator=g))
    return (x_q, 0.02, x_zp, w_q, w_scale, w_zp, b, post, algo)


def _posts(i: int) -> tuple[str, str]:
    return [("none", ""), ("relu", ""), ("gelu", "none"), ("gelu", "tanh")][i % 4]


def _close(got: Any, want: torch.Tensor, what: str) -> None:
    assert isinstance(got, torch.Tensor), f"{what}: kernel returned status {got}"
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if want.dtype in (torch.uint8, torch.int8):
        # requantization rounds a float; the kernel's exact int32 sum may land on the other side
        diff = (got.int() - want.int()).abs()
        assert diff.max().item() <= 1 if diff.numel() else True, what
        assert (diff > 0).float().mean().item() < 0.02 if diff.numel() else True, what
    elif want.dtype == torch.bfloat16:
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=what)
    else:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=what)


# -- the descriptors ------------------------------------------------------------------------------


def test_library_descriptors_equal_the_plan_only_declarations(a64):
    """The x86 plan (a64_gemm.py) declares exactly what the library registers under qemu."""
    cmd = [str(QEMU), "-L", SYSROOT, str(a64.driver), str(a64.lib), "--describe"]
    described = [json.loads(line) for line in subprocess.check_output(cmd, text=True).splitlines()]
    decls = _decls()
    assert [d["name"] for d in described] == list(decls)
    for d in described:
        k = decls[d["name"]]
        assert (k.op, k.priority, k.version, k.requires) == (
            d["op"], d["priority"], d["version"], frozenset(d["isa"]),
        ), k.name  # fmt: skip
        assert k.params == tuple(a["name"] for a in d["args"]), k.name
        assert k.prepack_arg == d["prepack_arg"] and k.workspace == d["workspace"], k.name
        for a in d["args"]:
            dts = tuple(native._DTYPES[tuple(c)] for c in a["dtypes"])  # type: ignore[index]
            assert k.dtypes.get(a["name"], ()) == dts, (k.name, a["name"])
            rule = k.shapes.get(a["name"])
            assert bool(rule and rule.contiguous) == bool(a["contiguous"]), (k.name, a["name"])
            assert (rule.rank if rule else None) == (tuple(a["ranks"]) or None), a["name"]
        optional = {a["name"] for a in d["args"] if a["optional"]}
        typed = re.findall(r"([\w?\[\]]+) (\w+)[,)]", k.schema)  # (type, name) per parameter
        assert optional == {name for typ, name in typed if typ == "Tensor?"}, k.name


# -- int8 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["i8mm", "sdot"])
def test_int8_kernels_match_the_reference_on_every_scheme(a64, variant):
    """Static (fp32 out and requantized u8 / s8) and dynamic, u8 and s8 activations,
    per-channel and per-tensor scales, with and without bias, every post op, edge shapes."""
    ref_f, ref_q, ref_d = (_reference(op) for op in ("qlinear", "qlinear_q", "qlinear_dynamic"))
    cases: list[tuple[Path, torch.Tensor, str]] = []
    for i, (lead, k, n) in enumerate(SHAPES):
        post, algo = _posts(i)
        signed, per_channel, bias = bool(i % 2), bool(i % 3), i % 5 != 4
        args = qlinear_args(lead, k, n, signed=signed, per_channel=per_channel, bias=bias,
                            post=post, algo=algo, seed=i)  # fmt: skip
        what = f"{lead} K={k} N={n} {'s8' if signed else 'u8'} {post}/{algo} bias={bias}"

        def case(kernel: str, a: tuple[Any, ...], one: bool = not per_channel and n > 0) -> Path:
            # per-tensor: the kernel gets the one scale, the reference it once per channel
            return write_case(a64.root, kernel, (*a[:4], a[4][:1].clone(), *a[5:]) if one else a)

        cases.append((case(f"a64_qlinear_{variant}", args), ref_f(*args), what))
        out_signed = i % 2 == 0
        qargs = (
            *args[:7],
            0.05,
            -3 if out_signed else 7,
            *((-128, 127) if out_signed else (0, 255)),
            post,
            algo,
        )
        cases.append((case(f"a64_qlinear_q_{variant}", qargs), ref_q(*qargs), what + " -> q"))
        x_q, xs, xzp, *rest = args
        dargs = (x_q, torch.tensor([xs], dtype=torch.float64), torch.tensor([xzp]), *rest)
        cases.append((case(f"a64_qlinear_dynamic_{variant}", dargs), ref_d(*dargs), what + " dyn"))
    a64.run([c for c, _, _ in cases])
    for case, want, what in cases:
        _close(read_result(case), want, f"{variant}: {what}")


def test_int8_extreme_values_are_exact(a64):
    """All -128 / 255 inputs with K = 1000: the int32 sums and the zero-point correction
    must not lose a bit (fp32 output compared with a float64 reference)."""
    k, n = 1000, 11
    x_q = torch.full((3, k), 255, dtype=torch.uint8)
    w_q = torch.full((n, k), -128, dtype=torch.int8)
    w_scale, w_zp = torch.full((n,), 1.0), torch.zeros(n, dtype=torch.int64)
    args = (x_q, 1.0, 0, w_q, w_scale, w_zp, None, "none", "")
    cases = [write_case(a64.root, f"a64_qlinear_{v}", args) for v in ("i8mm", "sdot")]
    a64.run(cases)
    for c in cases:
        assert torch.equal(read_result(c), torch.full((3, n), 255.0 * -128 * k))


def test_sdot_fallback_runs_where_i8mm_and_bf16_are_missing(a64):
    """qemu's Neoverse N1 has SDOT but neither i8mm nor BF16: the SDOT kernel computes, the
    i8mm and BF16 kernels decline (UNSUPPORTED, the host then falls back) instead of SIGILL."""
    args = qlinear_args((5,), 37, 19, signed=False, per_channel=True, bias=True, post="relu",
                        algo="", seed=7)  # fmt: skip
    x = torch.randn(3, 8).bfloat16()
    bf = (x, torch.randn(4, 8).bfloat16(), None)
    cases = [write_case(a64.root, k, args) for k in ("a64_qlinear_sdot", "a64_qlinear_i8mm")]
    cases.append(write_case(a64.root, "a64_linear_bf16", bf))
    a64.run(cases, cpu="neoverse-n1")
    _close(read_result(cases[0]), _reference("qlinear")(*args), "sdot on neoverse-n1")
    assert read_result(cases[1]) == (native.UNSUPPORTED, "this CPU lacks i8mm (hwcaps)")
    assert read_result(cases[2]) == (native.UNSUPPORTED, "this CPU lacks bf16 (hwcaps)")


def test_int8_kernels_decline_what_they_do_not_compute(a64):
    """Nonzero weight zero points and unknown post ops decline (per-call fallback on a host)."""
    args = list(qlinear_args((2,), 8, 8, signed=False, per_channel=True, bias=True, post="none",
                             algo="", seed=1))  # fmt: skip
    bad_zp = tuple(args[:5] + [torch.ones(8, dtype=torch.int64)] + args[6:])
    bad_post = tuple(args[:7] + ["hardswish", ""])
    cases = [write_case(a64.root, "a64_qlinear_i8mm", a) for a in (bad_zp, bad_post)]
    a64.run(cases)
    assert read_result(cases[0]) == (native.UNSUPPORTED, "weight zero points must be 0 (symmetric)")
    assert read_result(cases[1])[0] == native.UNSUPPORTED


# -- bf16 -----------------------------------------------------------------------------------------


def test_bf16_kernels_match_the_reference(a64):
    refs = {op: _reference(op) for op in ("linear", "linear_relu", "linear_gelu")}
    cases = []
    for i, (lead, k, n) in enumerate(SHAPES):
        g = torch.Generator().manual_seed(100 + i)
        x = (torch.randn(*lead, k, generator=g) * (1 + 7 * (i % 2))).bfloat16()  # GELU tails
        w = (torch.randn(n, k, generator=g) / max(k, 1) ** 0.5).bfloat16()
        b = [None, torch.randn(n, generator=g).bfloat16(), torch.randn(n, generator=g)][i % 3]
        for kernel, op, extra in [
            ("a64_linear_bf16", "linear", ()),
            ("a64_linear_relu_bf16", "linear_relu", ()),
            ("a64_linear_gelu_bf16", "linear_gelu", ("tanh" if i % 2 else "none",)),
        ]:
            args = (x, w, b, *extra)
            # the reference in bf16 (an fp32 bias is what the kernel adds before rounding)
            want_args = (x, w, b.bfloat16() if b is not None else None, *extra)
            want = refs[op](*[a.float() if isinstance(a, torch.Tensor) else a for a in want_args])
            cases.append(
                (write_case(a64.root, kernel, args), want.bfloat16(), f"{kernel} {lead} {k} {n}")
            )
    a64.run([c for c, _, _ in cases])
    for case, want, what in cases:
        _close(read_result(case), want, what)


# -- the build command and the disassembly ----------------------------------------------------


def test_build_kernels_command_prints_the_command_and_builds_an_aarch64_elf(a64, capsys):
    from pdlkit.cli import main

    assert main(["build-kernels", "--out", str(a64.root)]) == 0
    command, lib = capsys.readouterr().out.splitlines()[:2]
    assert command.startswith(f"{CROSS} -O3 -march=armv8-a -mtune=neoverse-n2 -shared -fPIC")
    assert Path(lib) == a64.lib  # the tests built exactly what the command builds
    header = Path(lib).read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64


def test_inner_loops_from_the_disassembly(a64):
    """benchmarks/aarch64_disasm.py: each micro-kernel's K loop is 16 matrix instructions on
    128 (MMLA) or 96 (SDOT, 4 rows) loaded bytes, nothing spilled."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "aarch64_disasm", ROOT / "benchmarks" / "aarch64_disasm.py"
    )
    assert spec is not None and spec.loader is not None
    disasm = importlib.util.module_from_spec(spec)
    sys.modules["aarch64_disasm"] = disasm  # dataclasses look their module up
    spec.loader.exec_module(disasm)
    funcs = disasm.disassemble(a64.lib)
    expect = {"tile_smmla": ("smmla", 128), "tile_usmmla": ("usmmla", 128),
              "tile_sdot": ("sdot", 96), "tile_bfmmla": ("bfmmla", 128)}  # fmt: skip
    for name, (insn, loaded) in expect.items():
        loop = disasm.hottest_loop(funcs[name])
        assert loop.mma == {insn: 16} and loop.loaded == loaded, (name, loop.mma, loop.loaded)
        assert not any(m.startswith("st") for m, _ in loop.insns), f"{name} spills in its K loop"
    assert (
        "| `tile_smmla` | int8 s8 x s8, SMMLA (i8mm) | 34 | 16 SMMLA | 128 | 0.125 | 4.0 |"
        in disasm.report(a64.lib)
    )


def _pack_like_the_readme(w: torch.Tensor, step: int) -> bytes:
    """kernels/aarch64/README.md's layout: a 64-byte header, [int8: int32 column sums], then
    panels of 8 columns; per K step, 4 vectors of (W[n][k:k+step], W[n+1][k:k+step])."""
    n, k = w.shape
    n_pad, k_pad = -(-n // 8) * 8, -(-k // step) * step
    wp = torch.zeros(n_pad, k_pad, dtype=w.dtype)
    wp[:n, :k] = w
    # [tile, pair, half, kstep, lane] -> [tile, kstep, pair, half, lane]
    panels = wp.reshape(n_pad // 8, 4, 2, k_pad // step, step).permute(0, 3, 1, 2, 4)
    body = panels.contiguous().view(torch.uint8).numpy().tobytes()
    if w.dtype == torch.int8:
        colsum = torch.zeros(n_pad, dtype=torch.int32)
        colsum[:n] = w.sum(dim=1, dtype=torch.int32)
        body = colsum.numpy().tobytes() + body
    return body


def test_prepacked_weights_follow_the_documented_layout(a64):
    g = torch.Generator().manual_seed(3)
    cases = []
    for n, k in [(1, 1), (3, 9), (16, 16), (19, 37)]:
        w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
        args = (torch.zeros(1, k, dtype=torch.uint8), 1.0, 0, w, torch.ones(n),
                torch.zeros(n, dtype=torch.int64), None, "none", "")  # fmt: skip
        cases.append((write_case(a64.root, "a64_qlinear_i8mm", args), w, 8))
        wb = torch.randn(n, k, generator=g).bfloat16()
        bargs = (torch.zeros(1, k).bfloat16(), wb, None)
        cases.append((write_case(a64.root, "a64_linear_bf16", bargs), wb, 4))
    a64.run([c for c, _, _ in cases])
    for case, w, step in cases:
        packed = (case / "packed.bin").read_bytes()
        magic, kind, n, k, n_pad, k_pad = struct.unpack_from("<IIqqqq", packed)
        assert (magic, kind, n, k) == (0x38413650, 1 if step == 8 else 2, *w.shape)
        assert (n_pad, k_pad) == (-(-n // 8) * 8, -(-k // step) * step)
        assert packed[64:] == _pack_like_the_readme(w, step), (tuple(w.shape), w.dtype)


@pytest.mark.parametrize("variant", ["i8mm", "sdot"])
def test_per_tensor_weight_kernels_match_the_reference(a64, variant):
    """qlinear*_pt (ArmInductorQuantizer graphs): the weight's scale and zero point are numbers."""
    refs = {op: _reference(op) for op in ("qlinear_pt", "qlinear_q_pt", "qlinear_dynamic_pt")}
    cases = []
    for i, (lead, k, n) in enumerate(SHAPES[:9]):
        post, algo = _posts(i)
        x_q, xs, xzp, w_q, w_scale, _, b, *_ = qlinear_args(
            lead, k, n, signed=i % 3 != 0, per_channel=False, bias=i % 4 != 3, post=post,
            algo=algo, seed=50 + i,
        )  # fmt: skip
        ws = float(w_scale[0]) if n else 0.01
        args = (x_q, xs, xzp, w_q, ws, 0, b, post, algo)
        qargs = (*args[:7], 0.05, -2, -128, 127, post, algo)
        dargs = (x_q, torch.tensor([xs], dtype=torch.float64), torch.tensor([xzp]), *args[3:])
        for kernel, op, a in [
            (f"a64_qlinear_pt_{variant}", "qlinear_pt", args),
            (f"a64_qlinear_q_pt_{variant}", "qlinear_q_pt", qargs),
            (f"a64_qlinear_dynamic_pt_{variant}", "qlinear_dynamic_pt", dargs),
        ]:
            cases.append(
                (write_case(a64.root, kernel, a), refs[op](*a), f"{kernel} {lead} {k} {n}")
            )
    a64.run([c for c, _, _ in cases])
    for case, want, what in cases:
        _close(read_result(case), want, what)


LAYOUT_PROBE = r"""
#include <stdio.h>
#include "pdlkit_abi.h"
#define S(T) printf(#T " %zu\n", sizeof(T))
#define O(T, F) printf(#T "." #F " %zu\n", offsetof(T, F))
int main(void) {
  S(DLTensor); O(DLTensor, shape); O(DLTensor, byte_offset);
  S(pdlkit_attribute); O(pdlkit_attribute, f); O(pdlkit_attribute, tensor);
  S(pdlkit_meta_frame); O(pdlkit_meta_frame, max_ndim);
  S(pdlkit_call_frame); O(pdlkit_call_frame, workspace);
  S(pdlkit_prepack_frame); O(pdlkit_prepack_frame, packed_size);
  S(pdlkit_arg_desc); O(pdlkit_arg_desc, optional);
  S(pdlkit_kernel_desc); O(pdlkit_kernel_desc, prepack_arg); O(pdlkit_kernel_desc, prepack);
  S(pdlkit_registration);
  return 0;
}
"""


def test_python_loader_frames_have_the_aarch64_c_layout(a64):
    """The ctypes structs the loader fills (on an AArch64 host too) match the header as
    aarch64-linux-gnu-gcc lays it out: same sizes, same field offsets."""
    src, exe = a64.root / "layout.c", a64.root / "layout"
    src.write_text(LAYOUT_PROBE)
    include = ROOT / "runtime_abi" / "include"
    subprocess.run([str(CROSS), "-I", str(include), str(src), "-o", str(exe)], check=True)
    out = subprocess.check_output([str(QEMU), "-L", SYSROOT, str(exe)], text=True)
    c = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    n = native
    py = {
        "DLTensor": n.DLTensor, "pdlkit_attribute": n.Attribute, "pdlkit_meta_frame": n.MetaFrame,
        "pdlkit_call_frame": n.CallFrame, "pdlkit_prepack_frame": n.PrepackFrame,
        "pdlkit_arg_desc": n.ArgDesc, "pdlkit_kernel_desc": n.KernelDesc,
        "pdlkit_registration": n.Registration,
    }  # fmt: skip
    for key, value in c.items():
        struct_name, _, field = key.partition(".")
        cls = py[struct_name]
        got = getattr(cls, field).offset if field else ctypes.sizeof(cls)
        assert got == value, (key, got, value)
    assert c["pdlkit_call_frame"] == struct.calcsize("@" + n._FRAME_FMT)  # the packed run() frame
