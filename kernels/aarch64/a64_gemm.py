"""The AArch64 GEMM kernels of ``a64_gemm.c``, on every host.

The kernels themselves are C (``a64_gemm.c``, pdlkit C ABI 1.1). This file is what the
registry loads from this folder, and it does one of two things:

* **On an AArch64 host** it builds the library with the documented command (cached, see
  :mod:`pdlkit.runtime_abi.native_build`) and loads it through the native loader: the
  kernels registered are the library's own descriptors, called through the C ABI.
* **On any other host** it declares the same kernels as *plan-only* declarations: the same
  names, logical ops, priorities, required ISA features, dtypes, shape rules and pre-pack
  argument, with Python meta functions. ``pdlkit explain --target yitian`` can then show
  which substitution would use which kernel without loading an AArch64 binary. A plan-only
  kernel never runs: its requirements (i8mm / asimddp / bf16) keep it from being chosen for
  an x86 host, and called anyway it declines (per-call fallback to the replaced subgraph).

``tests/test_aarch64.py`` checks that the table below equals the library's descriptors
(read under qemu-aarch64 by ``abi_driver --describe``), so the two cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from pdlkit.runtime_abi.kernel import KernelDecl, KernelUnsupported, declare
from pdlkit.runtime_abi.native_build import host_arch

SOURCE = Path(__file__).resolve().with_suffix(".c")

_Q_DTYPES = {
    "x_q": (torch.uint8, torch.int8),
    "w_q": (torch.int8,),
    "w_scale": (torch.float32,),
    "w_zp": (torch.int64, torch.int32),
    "bias": (torch.float32,),
}
_DYN_DTYPES = {
    **_Q_DTYPES,
    "x_scale": (torch.float32, torch.float64),
    "x_zp": (torch.int64, torch.int32),
}
# per-tensor weight qparams are numbers (ArmInductorQuantizer graphs): the *_pt ops
_PT_DTYPES = {k: v for k, v in _Q_DTYPES.items() if k not in ("w_scale", "w_zp")}
_DYN_PT_DTYPES = {k: v for k, v in _DYN_DTYPES.items() if k not in ("w_scale", "w_zp")}
_BF16_DTYPES = {
    "x": (torch.bfloat16,),
    "weight": (torch.bfloat16,),
    "bias": (torch.bfloat16, torch.float32),
}
_Q_SHAPES = {"x_q": {"contiguous": True}, "w_q": {"rank": 2}}
_BF16_SHAPES = {"x": {"contiguous": True}, "weight": {"rank": 2}}


# name, op, priority, ISA, dtypes, shape rules, prepack argument (parameters, schema and meta
# are the op's: kernels/ops/logical_ops.py)
KERNELS: list[tuple[Any, ...]] = [
    ("a64_qlinear_i8mm", "qlinear", 20, ("i8mm",), _Q_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_q_i8mm", "qlinear_q", 20, ("i8mm",), _Q_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_dynamic_i8mm", "qlinear_dynamic", 20, ("i8mm",), _DYN_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_sdot", "qlinear", 10, ("asimddp",), _Q_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_q_sdot", "qlinear_q", 10, ("asimddp",), _Q_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_dynamic_sdot", "qlinear_dynamic", 10, ("asimddp",), _DYN_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_pt_i8mm", "qlinear_pt", 20, ("i8mm",), _PT_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_q_pt_i8mm", "qlinear_q_pt", 20, ("i8mm",), _PT_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_dynamic_pt_i8mm", "qlinear_dynamic_pt", 20, ("i8mm",), _DYN_PT_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_pt_sdot", "qlinear_pt", 10, ("asimddp",), _PT_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_q_pt_sdot", "qlinear_q_pt", 10, ("asimddp",), _PT_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_qlinear_dynamic_pt_sdot", "qlinear_dynamic_pt", 10, ("asimddp",), _DYN_PT_DTYPES, _Q_SHAPES, "w_q"),
    ("a64_linear_bf16", "linear", 20, ("bf16",), _BF16_DTYPES, _BF16_SHAPES, "weight"),
    ("a64_linear_relu_bf16", "linear_relu", 20, ("bf16",), _BF16_DTYPES, _BF16_SHAPES, "weight"),
    ("a64_linear_gelu_bf16", "linear_gelu", 20, ("bf16",), _BF16_DTYPES, _BF16_SHAPES, "weight"),
]  # fmt: skip


def _plan_only(spec: tuple[Any, ...]) -> KernelDecl:
    name, op, priority, isa, dtypes, shapes, packed = spec
    why = (
        f"{name} is an AArch64 kernel ({SOURCE.name}); this {host_arch()} host can plan with "
        "it (target='yitian') but cannot run it"
    )

    def fn(*args: Any) -> Any:
        raise KernelUnsupported(why)

    def prepack(weight: torch.Tensor, attrs: Any) -> Any:
        raise KernelUnsupported(why)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Plan-only declaration of {name} (from {SOURCE.name}); runs on AArch64 only."
    return declare(
        fn,
        implements=op,
        name=name,
        priority=priority,
        device="cpu",
        dtypes=dtypes,
        requires=isa,
        shapes=shapes,
        traits=("deterministic",),
        prepack=prepack,
        prepack_arg=packed,
        source=f"{SOURCE}:{name} (plan only on {host_arch()})",
    )


def _load() -> dict[str, KernelDecl]:
    if host_arch() == "aarch64":
        from pdlkit.runtime_abi.native_build import build_and_load

        return build_and_load(SOURCE, "aarch64", "AArch64 kernels")
    return {spec[0]: _plan_only(spec) for spec in KERNELS}


globals().update(_load())
