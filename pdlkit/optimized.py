"""``explain`` and ``bisect`` report on what ``optimize`` built, with the same options.

    fast = pdlkit.optimize(model, patterns="my/patterns", kernels="my/kernels")
    print(pdlkit.explain(fast, x))   # the substitutions of my/patterns and my/kernels
    print(pdlkit.bisect(fast, x))

``optimize`` remembers the model, its options and its ``dynamic`` on the callable it returns
(:func:`remember`); :func:`unwrap` and :func:`dynamic_of` give them back, with any option
passed explicitly taking precedence. A model compiled by ``torch.compile`` directly is unwrapped to the model it
compiles (its options are the defaults: the environment's or the shipped folders).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from pdlkit.plan import Options

_ATTR = "_pdlkit_optimized"


def remember(
    compiled: Any, model: Any, options: Any, session: Any = None, dynamic: bool | None = None
) -> Any:
    """Note on ``compiled`` (optimize's result) the model, options and ``dynamic`` it was
    built with, and its backend's compile session (pdlkit/session.py)."""
    # object.__setattr__: torch.compile's module wrapper forwards attributes to the model,
    # which must not carry one optimize() call's options into the next.
    object.__setattr__(compiled, _ATTR, (model, options, session, dynamic))
    return compiled


def dynamic_of(compiled: Any) -> bool | None:
    """The ``dynamic`` ``optimize`` compiled ``compiled`` with (None for anything else): an
    explanation traces with it, so that the graph it reports, and the decisions it reads
    from the cache (per shape bucket where shapes are dynamic), are the ones that run."""
    found = getattr(compiled, "__dict__", {}).get(_ATTR)
    return found[3] if found is not None else None


def session_of(compiled: Any) -> Any:
    """The compile session of ``optimize``'s result (None for anything else): the call
    sites its compilations made, in order."""
    found = getattr(compiled, "__dict__", {}).get(_ATTR)
    return found[2] if found is not None else None


def unwrap(model: Any, given: dict[str, Any]) -> tuple[Any, Any]:
    """``(model to trace, Options)`` for ``explain`` / ``bisect``.

    ``given`` holds the options passed explicitly (None = not given); they override the
    ones ``optimize`` was called with when ``model`` is its result."""
    explicit = {k: v for k, v in given.items() if v is not None}
    found = getattr(model, "__dict__", {}).get(_ATTR)
    if found is not None:
        inner, options = found[:2]
        return inner, replace(options, **explicit)
    inner = getattr(model, "_orig_mod", None) or getattr(model, "_torchdynamo_orig_callable", None)
    return (inner if inner is not None else model), Options(**explicit)


def is_optimized(model: Any) -> bool:
    """``model`` is a result of ``pdlkit.optimize``."""
    return _ATTR in getattr(model, "__dict__", {})


def as_keywords(options: Any) -> dict[str, Any]:
    """``Options`` as ``optimize``'s keyword arguments (values as they are, not copied)."""
    return {f.name: getattr(options, f.name) for f in fields(options)}
