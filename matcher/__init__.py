"""pdlkit.matcher: pattern files -> MLIR PDL application on the Torch dialect -> FX rewrite.

The entry point is :func:`pdlkit.matcher.substitute.substitute`; it is not re-exported here
so that ``pdlkit.matcher.substitute`` always names the module. The names below are imported
on first use, as ``pdlkit``'s are: importing one of the package's modules does not load
``gen_pattern`` (whose own imports of the matching modules then made a cycle through this
package).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdlkit.lazy import lazy_names

_EXPORTS = {
    "Pattern": "pdlkit.matcher.patterns",
    "PatternError": "pdlkit.matcher.patterns",
    "PatternSet": "pdlkit.matcher.patterns",
    "load_patterns": "pdlkit.matcher.patterns",
    "pattern_from_function": "pdlkit.matcher.gen_pattern",
}

__all__ = ["Pattern", "PatternError", "PatternSet", "load_patterns", "pattern_from_function"]

if TYPE_CHECKING:
    from pdlkit.matcher.gen_pattern import pattern_from_function
    from pdlkit.matcher.patterns import Pattern, PatternError, PatternSet, load_patterns


__getattr__ = lazy_names(__name__, _EXPORTS, globals())
