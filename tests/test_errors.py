"""Every error pdlkit raises is a ``pdlkit.PdlkitError``, keeps its other base and its cause."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
import torch

import pdlkit
from pdlkit.errors import ConfigError, PdlkitError

_PACKAGES = ("pdlkit", "pdlkit.matcher", "pdlkit.runtime_abi", "pdlkit.quantization")
_OPTIONAL = {"pdlkit.cli", "pdlkit.demo"}  # import nothing pdlkit raises that others do not


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every public exception class defined in a pdlkit module (private ones, such as
    why.py's ``_Mismatch``, are signals that never leave their module)."""
    found: dict[str, type[BaseException]] = {}
    for pkg_name in _PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            name = f"{pkg_name}.{info.name}"
            if name in _OPTIONAL:
                continue
            try:
                module = importlib.import_module(name)
            except ImportError:  # an optional dependency of that module is missing
                continue
            for attr, value in vars(module).items():
                if (
                    inspect.isclass(value)
                    and issubclass(value, BaseException)
                    and value.__module__ == name
                    and not attr.startswith("_")
                ):
                    found[f"{name}.{attr}"] = value
    return found


def test_every_public_exception_class_derives_from_pdlkit_error() -> None:
    classes = _exception_classes()
    assert len(classes) >= 14, sorted(classes)
    outside = sorted(n for n, c in classes.items() if not issubclass(c, PdlkitError))
    assert outside == []


@pytest.mark.parametrize(
    ("name", "other_base"),
    [
        ("pdlkit.matcher.patterns.PatternError", ValueError),
        ("pdlkit.runtime_abi.outputs.KernelCallError", RuntimeError),
        ("pdlkit.runtime_abi.registry.KernelLoadError", RuntimeError),
        ("pdlkit.runtime_abi.kernel.KernelDeclarationError", ValueError),
        ("pdlkit.config.PathError", ValueError),
        ("pdlkit.errors.ConfigError", RuntimeError),
    ],
)
def test_exception_keeps_its_other_base(name: str, other_base: type[BaseException]) -> None:
    module, _, attr = name.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), attr), other_base)


def test_public_names_are_the_base_and_the_config_error() -> None:
    assert pdlkit.PdlkitError is PdlkitError
    assert pdlkit.ConfigError is ConfigError


def test_a_bad_pattern_file_is_a_config_error_whose_cause_is_kept(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pdl.mlir"
    bad.write_text('pdl.pattern @p : benefit(1) {\n  %r = pdl.operation "torch.aten.relu"\n')
    with pytest.raises(ConfigError, match=str(bad)) as err:
        pdlkit.optimize(torch.nn.ReLU(), patterns=str(bad), kernels=str(tmp_path))
    assert isinstance(err.value, RuntimeError)
    assert err.value.__cause__ is not None
    assert isinstance(err.value.__cause__, PdlkitError)


def test_explain_names_a_misspelled_argument() -> None:
    with pytest.raises(TypeError, match="patern"):
        pdlkit.explain(torch.nn.ReLU(), torch.randn(2), patern="p")  # type: ignore[call-arg]
