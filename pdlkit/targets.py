"""Command-line targets: ``module:function`` or ``path/to/file.py:function``.

    pdlkit explain mymodels:example          # mymodels.py in the current directory
    pdlkit explain examples/mlp.py:example
    pdlkit gen-pattern refs.py:linear_relu ...

A module name is looked up with the current directory first on ``sys.path``, as ``python -m``
and ``uvicorn`` do, so a module beside the command is found without installing it. Any
failure is a :class:`TargetError` with one line saying what could not be loaded and why.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pdlkit.errors import PdlkitError


class TargetError(PdlkitError, ValueError):
    """The target cannot be loaded; the message names it and says why."""


def split_target(spec: str, default: str | None = None) -> tuple[str, str]:
    """``"a.b:fn"`` -> ``("a.b", "fn")``; a missing ``:fn`` gives ``default`` (or an error)."""
    target, sep, name = spec.rpartition(":")
    if not sep or (len(target) == 1 and target.isalpha()):  # no ':' (or a drive letter)
        target, name = spec, ""
    if not name:
        if default is None:
            raise TargetError(f"{spec!r}: expected MODULE:FUNCTION or FILE.py:FUNCTION")
        name = default
    if not target:
        raise TargetError(f"{spec!r}: expected MODULE:FUNCTION or FILE.py:FUNCTION")
    return target, name


def _from_file(target: str) -> ModuleType:
    path = Path(target).resolve()
    if not path.is_file():
        raise TargetError(f"{target}: no such file")
    # Registered by name, so that pickling and inspect.getsource find it; a module of the
    # same name from another file keeps its name, this one gets a name of its own.
    name = path.stem
    other = sys.modules.get(name)
    if other is not None and getattr(other, "__file__", None) != str(path):
        name = f"{name}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    mspec = importlib.util.spec_from_file_location(name, path)
    if mspec is None or mspec.loader is None:
        raise TargetError(f"{target}: not a Python file")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[name] = module
    folder = str(path.parent)
    sys.path.insert(0, folder)  # its own imports of modules beside it
    try:
        mspec.loader.exec_module(module)
    except Exception as e:
        raise TargetError(f"{target}: importing it failed: {type(e).__name__}: {e}") from e
    finally:
        sys.path.remove(folder)
    return module


def _from_module(target: str) -> ModuleType:
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name is not None and (target == e.name or target.startswith(e.name + ".")):
            raise TargetError(
                f"cannot import {target!r}: no module {e.name!r} in the current directory "
                f"({cwd}) or on the Python path"
            ) from e
        raise TargetError(f"cannot import {target!r}: {e}") from e
    except Exception as e:
        raise TargetError(f"cannot import {target!r}: {type(e).__name__}: {e}") from e
    finally:
        sys.path.remove(cwd)


def load_target(spec: str, default: str | None = None) -> tuple[Any, str]:
    """The object ``spec`` names and the text naming it (``"mymodels:example"``)."""
    target, name = split_target(spec, default)
    is_file = target.endswith(".py") or os.sep in target or Path(target).is_file()
    module = _from_file(target) if is_file else _from_module(target)
    obj = getattr(module, name, None)
    if obj is None:
        raise TargetError(f"{target} has no attribute {name!r}")
    return obj, f"{target}:{name}"


def load_example(spec: str) -> tuple[Any, tuple[Any, ...]]:
    """``module:function`` returning ``(model, example_inputs)``; ``:example`` by default."""
    fn, where = load_target(spec, default="example")
    if not callable(fn):
        raise TargetError(f"{where} is not a function returning (model, example inputs)")
    out = fn()
    try:
        model, inputs = out
    except (TypeError, ValueError) as e:
        raise TargetError(
            f"{where} must return (model, example inputs), e.g. (MyModel().eval(), (x,)): {e}"
        ) from e
    return model, tuple(inputs) if isinstance(inputs, list | tuple) else (inputs,)
