"""Automatic verification: the first call of each shape runs the kernel *and* the subgraph
it replaced, and a kernel that disagrees is switched off for that shape.

    fast = pdlkit.optimize(model, verify="first_call")     # or PDLKIT_VERIFY=1
    fast(x)   # per call site and input shapes, once: kernel vs reference subgraph

A failure -- outputs apart by more than the tolerance, NaN/Inf where the reference has
none, an exception, or no answer within the pattern's ``timeout`` -- warns once, naming
the pattern, the kernel, the call site and the error, and every later call of that shape
at that site runs the reference subgraph. ``pdlkit.stats()`` counts ``verifications``
and ``disabled``.

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
from pdlkit.runtime_abi.binding import _fresh
from pdlkit.runtime_abi.binding_stats import count

MODES = ("off", "strict", "first_call")
ENV = "PDLKIT_VERIFY"
_RTOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3, torch.float64: 1e-9}


class VerifyTimeout(RuntimeError):
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
            finite = torch.isfinite(b)
            bad = ~torch.isfinite(a) & finite
            if bool(bad.any()):
                return (
                    f"output {i} has {int(bad.sum())} NaN/Inf value(s) where the reference has none"
                )
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
        if sig in self.verified:
            return attempt(cs, args)
        if sig in self.disabled:
            count("fallbacks", cs.kernel.name)
            return _fresh(cs.fallback(*args), args)
        with self.lock:  # one verification per signature, even with threads
            if sig in self.verified:
                return attempt(cs, args)
            if sig in self.disabled:
                count("fallbacks", cs.kernel.name)
                return _fresh(cs.fallback(*args), args)
            return self._verify(cs, args, attempt, sig)

    def _verify(self, cs: Any, args: tuple[Any, ...], attempt: Callable[..., Any], sig: Any) -> Any:
        name = cs.kernel.name
        ref = _fresh(cs.fallback(*args), args)
        try:
            out = _with_timeout(lambda: attempt(cs, args), self.timeout)
            why = compare(out, ref, self.tolerance)
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


def reference_only(cs: Any, args: tuple[Any, ...], attempt: Callable[..., Any]) -> Any:
    """An intercept that switches a site off: every call runs the replaced subgraph."""
    return _fresh(cs.fallback(*args), args)
