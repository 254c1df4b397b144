"""Automatic verification: the first call of each shape runs the kernel *and* the subgraph
it replaced, and a kernel that disagrees is switched off for that shape.

    fast = pdlkit.optimize(model, verify="first_call")     # or PDLKIT_VERIFY=1
    fast(x)   # per call site and input shapes, once: kernel vs reference subgraph

The kernel runs on copies of its inputs (the weight it pre-packs excepted: it receives the
packed form), so that one that modifies an input in place is caught and the caller's
tensors are left alone. A failure -- outputs apart by more than
the tolerance, NaN/Inf where the reference has none or a number where it has NaN/Inf, an
input modified, an exception, or no answer within the pattern's ``timeout`` -- warns once,
naming the pattern, the kernel, the call site and the error, and every later call of that
shape at that site runs the reference subgraph. ``pdlkit.stats()`` counts
``verifications`` and ``disabled``. ``verify=True`` (:func:`strict`) checks each site's
first call the same way (counted in ``verifications`` too) and raises
:class:`KernelCallError` instead.

Tolerances per output dtype, unless the pattern's manifest entry declares ``tolerance:``
(a number is rtol, or ``{rtol: ..., atol: ...}``) or ``timeout:`` (seconds): floating outputs pass when
``max|kernel - ref| <= atol + rtol * max|ref|`` with rtol 1e-5 for float32 (bfloat16 1e-2,
float16 1e-3, float64 1e-9) and atol 0; integer outputs (quantized activations) may differ
by one quantization step (atol 1); booleans must be equal.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from pdlkit.runtime_abi.binding_stats import count
from pdlkit.runtime_abi.kernel import KernelDecl
from pdlkit.runtime_abi.outputs import KernelCallError, as_list
from pdlkit.runtime_abi.outputs import fresh as _fresh

from pdlkit.errors import PdlkitError

MODES = ("off", "strict", "first_call")
ENV = "PDLKIT_VERIFY"
_RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3, torch.float64: 1e-9}


class VerifyTimeout(PdlkitError, RuntimeError):
    pass


def resolve_mode(verify: Any) -> str:
    """``False``/``None`` -> ``PDLKIT_VERIFY`` or "off"; ``True`` -> "strict" (a mismatch is an
    error, the original behaviour); ``"first_call"`` -> verify and disable per shape."""
    if verify is None or verify is False or verify == "off":
        env = os.environ.get(ENV, "").strip().lower()
        if env in ("", "0", "off", "false"):
            return "off"
        if env in ("1", "true", "first_call"):
            return "first_call"
        if env == "strict":
            return "strict"
        raise ValueError(f"{ENV}={env!r}: use 1 (first_call), strict or 0")
    if verify is True or verify == "strict":
        return "strict"
    if verify == "first_call":
        return "first_call"
    raise ValueError(f"verify must be False, True, 'strict' or 'first_call', got {verify!r}")


def tolerance(
    dtype: torch.dtype, declared: tuple[float | None, float | None] | None = None
) -> tuple[float, float]:
    """(rtol, atol) for an output of ``dtype``; ``declared`` (from the manifest) wins where set."""
    if dtype.is_floating_point:
        rtol, atol = _RTOL.get(dtype, 1e-2), 0.0
    elif dtype == torch.bool:
        rtol, atol = 0.0, 0.0
    else:
        rtol, atol = 0.0, 1.0  # one quantization step
    if declared is not None:
        rtol = declared[0] if declared[0] is not None else rtol
        atol = declared[1] if declared[1] is not None else atol
    return rtol, atol


def compare(got: Any, want: Any, declared: tuple[float | None, float | None] | None = None) -> str:
    """Why ``got`` is not ``want`` within tolerance ("" when it is); tensors or tuples of them."""
    g = list(got) if isinstance(got, tuple | list) else [got]
    w = list(want) if isinstance(want, tuple | list) else [want]
    if len(g) != len(w):
        return f"{len(g)} outputs, the reference has {len(w)}"
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return (
                f"output {i} is {list(a.shape)} {a.dtype}, the reference {list(b.shape)} {b.dtype}"
            )
        if a.numel() == 0:
            continue
        rtol, atol = tolerance(b.dtype, declared)
        if b.dtype.is_floating_point:
            why = _nonfinite(i, a, b)
            if why:
                return why
            finite = torch.isfinite(b)
            a64, b64 = a[finite].double(), b[finite].double()
        else:
            a64, b64 = a.double(), b.double()
        if a64.numel() == 0:
            continue
        err = float((a64 - b64).abs().max())
        scale = float(b64.abs().max())
        if err > atol + rtol * scale:
            what = f"rtol {rtol:g} x max|ref| {scale:.3g}" if rtol else ""
            limit = " + ".join(x for x in (f"atol {atol:g}" if atol or not rtol else "", what) if x)
            return f"output {i} ({b.dtype}): max abs error {err:.3g} exceeds {limit}"
    return ""


def _nonfinite(i: int, a: torch.Tensor, b: torch.Tensor) -> str:
    """Why output ``i`` puts NaN / Inf elsewhere than the reference ``b`` does ("" if not):
    NaN where ``b`` is NaN and the same infinity where ``b`` has one are fine."""
    finite = torch.isfinite(b)
    bad = ~torch.isfinite(a) & finite
    if bool(bad.any()):
        return f"output {i} has {int(bad.sum())} NaN/Inf value(s) where the reference has none"
    bad = ~finite & ~((a == b) | (torch.isnan(a) & torch.isnan(b)))
    if bool(bad.any()):
        at = tuple(int(j) for j in bad.nonzero()[0])
        return (
            f"output {i} differs at {int(bad.sum())} position(s) where the reference is NaN or "
            f"Inf (at {list(at)}: {a[at].item()}, the reference {b[at].item()})"
        )
    return ""


def snapshot(decl: KernelDecl, args: Sequence[Any]) -> tuple[Any, ...]:
    """Copies of the tensors among ``args`` (lists included) for a kernel to run on: each
    over a copy of its whole storage, with the same sizes, strides and offset. The weight a
    kernel pre-packs stays as it is: the kernel receives its packed form, which the
    pre-pack cache finds for the weight itself (a copy would be packed again)."""
    packed = decl.params.index(decl.prepack_arg) if decl.prepack_arg is not None else -1
    return tuple(
        a
        if i == packed
        else _copy(a)
        if isinstance(a, torch.Tensor)
        else [_copy(t) if isinstance(t, torch.Tensor) else t for t in a]
        if isinstance(a, list)
        else a
        for i, a in enumerate(args)
    )


def _copy(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        try:
            storage = t.untyped_storage().clone()
        except (RuntimeError, NotImplementedError):  # no storage (mkldnn, sparse)
            return t.clone()
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(
            storage, t.storage_offset(), t.size(), t.stride()
        )


def _changed(t: torch.Tensor, copy: torch.Tensor) -> bool:
    """Whether a kernel changed ``copy`` (made by :func:`snapshot` from ``t``): its view
    or any byte of its storage (NaNs included)."""
    view = (t.dtype, t.size(), t.stride(), t.storage_offset())
    if view != (copy.dtype, copy.size(), copy.stride(), copy.storage_offset()):
        return True
    try:
        mine, theirs = t.untyped_storage(), copy.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return not torch.equal(t, copy)
    before, after = (torch.empty(0, dtype=torch.uint8, device=t.device) for _ in "ab")
    return not torch.equal(before.set_(mine), after.set_(theirs))


def modified(decl: KernelDecl, args: Sequence[Any], copies: Sequence[Any]) -> str:
    """How a kernel run on ``copies`` (:func:`snapshot` of ``args``) modified its inputs
    ("" if it did not)."""
    for i, (a, c) in enumerate(zip(args, copies, strict=True)):
        pairs = zip(a, c, strict=False) if isinstance(a, list) else [(a, c)]
        for t, copy in pairs:
            if isinstance(t, torch.Tensor) and copy is not t and _changed(t, copy):
                name = decl.params[i] if i < len(decl.params) else f"#{i}"
                return (
                    f"it modified its input {name!r} in place (a kernel must not; verification "
                    "ran it on a copy, the caller's tensors are unchanged)"
                )
    return ""


def _with_timeout(fn: Callable[[], Any], seconds: float | None) -> Any:
    if not seconds:
        return fn()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            with torch.no_grad():  # grad mode is per thread; kernels run below autograd
                box["out"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["err"] = e

    t = threading.Thread(target=work, name="pdlkit-verify", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():  # a thread cannot be stopped: it is left running, its result ignored
        raise VerifyTimeout(f"no result within the declared timeout of {seconds:g} s")
    if "err" in box:
        raise box["err"]
    return box["out"]


def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
    return tuple([(a.shape, a.dtype) for a in args if isinstance(a, torch.Tensor)])


@dataclass
class FirstCallVerifier:
    """The ``CallSite.intercept`` of ``verify="first_call"``: per input signature, once."""

    tolerance: tuple[float | None, float | None] | None = None
    timeout: float | None = None
    verified: set[tuple[Any, ...]] = field(default_factory=set)
    disabled: dict[tuple[Any, ...], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, cs: Any, args: tuple[Any, ...], attempt: Callable[..., Any]) -> Any:
        sig = _signature(args)
        if sig not in self.verified and sig not in self.disabled:
            with self.lock:  # one verification per signature, even with threads
                if sig not in self.verified and sig not in self.disabled:
                    return self._verify(cs, args, attempt, sig)
        if sig in self.verified:
            return attempt(cs, args)
        count("fallbacks", cs.kernel.name)
        return _fresh(cs.fallback(*args), args)

    def _verify(self, cs: Any, args: tuple[Any, ...], attempt: Callable[..., Any], sig: Any) -> Any:
        name = cs.kernel.name
        ref = _fresh(cs.fallback(*args), args)
        copies = snapshot(cs.kernel, args)
        try:
            out = _with_timeout(lambda: attempt(cs, copies), self.timeout)
            why = modified(cs.kernel, args, copies) or compare(out, ref, self.tolerance)
        except Exception as e:
            out, why = None, f"{type(e).__name__}: {e}"
        count("verifications", name)
        if not why:
            self.verified.add(sig)
            return out
        self.disabled[sig] = why
        count("disabled", name)
        shapes = ", ".join(f"{list(s)} {str(d).removeprefix('torch.')}" for s, d in sig)
        warnings.warn(
            f"pdlkit verify: kernel {name!r} ({cs.kernel.source}) disagrees with the replaced "
            f"subgraph at {cs.where()} for inputs ({shapes}): {why}; this substitution is "
            "disabled for these shapes and the replaced subgraph's result is used",
            RuntimeWarning,
            stacklevel=2,
        )
        return ref


# verify=True: elementwise tolerances (torch.allclose) per output dtype
_STRICT = {
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-9),
}


def strict(cs: Any, args: tuple[Any, ...], attempt: Callable[..., Any]) -> Any:
    """``verify=True``: a site's first call runs the replaced subgraph and the kernel (on
    copies of the inputs); outputs apart (NaN / Inf included) or an input modified in place
    raise :class:`KernelCallError`, naming the kernel and the call site."""
    decl = cs.kernel
    ref = as_list(cs.fallback(*args))
    copies = snapshot(decl, args)
    out = attempt(cs, copies)
    count("verifications", decl.name)  # as first_call counts them (stats() showed 0 here)
    why = modified(decl, args, copies)
    if why:
        raise KernelCallError(
            f"pdlkit verify: kernel {decl.name!r} ({decl.source}) at {cs.where()}: {why}"
        )
    for i, (a, b) in enumerate(zip(as_list(out), ref, strict=True)):
        # integer outputs (quantized activations) one quantization step apart, as first_call
        # allows: a BF16 attention or an int8 GEMM whose codes round differently by one
        # step is within what its kernel promises (a strict check failed every one of them)
        rtol, atol = _STRICT.get(b.dtype, (0.0, 0.0 if b.dtype == torch.bool else 1.0))
        if not torch.allclose(a.to(b.dtype), b, rtol=rtol, atol=atol, equal_nan=True):
            err = (a.double() - b.double()).abs().max().item()
            raise KernelCallError(
                f"pdlkit verify: kernel {decl.name!r} ({decl.source}) output {i} differs from the "
                f"replaced subgraph at {cs.where()}: max abs error {err:.3g} "
                f"(tolerance rtol={rtol}, atol={atol}; NaN and Inf must match)"
            )
    cs.verified = True
    return out


def reference_only(cs: Any, args: tuple[Any, ...], attempt: Callable[..., Any]) -> Any:
    """An intercept that switches a site off: every call runs the replaced subgraph."""
    return _fresh(cs.fallback(*args), args)
