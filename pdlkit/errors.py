"""The one base of every error pdlkit raises: ``except pdlkit.PdlkitError`` catches them all.

    before: PatternError(ValueError), KernelLoadError(RuntimeError), KernelCallError(RuntimeError),
            ... (14 classes with no common base); catching "anything pdlkit raised" meant
            listing them
    after:  each of them is also a PdlkitError; its other base is unchanged, so an
            ``except ValueError`` / ``except RuntimeError`` written before still catches it

This module imports nothing, so any pdlkit module can import it without an import cycle.
Every error pdlkit raises for another one keeps it as the cause (``raise ... from e``), or
says in the message why the cause adds nothing (``from None``).
"""

from __future__ import annotations


class PdlkitError(Exception):
    """Base class of the exceptions pdlkit raises (configuration, loading, matching, calls)."""


class ConfigError(PdlkitError, RuntimeError):
    """A configuration error: bad pattern, manifest or kernel file, unknown kernel pin, a
    target this host cannot run. (It was ``pdlkit.PdlkitError`` itself before the base
    class existed: a RuntimeError, as before.)"""


class KernelLoadError(PdlkitError, RuntimeError):
    """A kernel file could not be loaded; the message starts with ``file:line:``. (Here, not
    in runtime_abi/registry.py, which loads native libraries through native.py: both raise it.)"""


class KernelDependencyMissing(KernelLoadError):
    """A kernel file imports an optional package that is not installed: its kernels are
    skipped (one warning), the other files' kernels still load."""
