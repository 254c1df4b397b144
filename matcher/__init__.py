"""pdlkit.matcher: pattern files -> MLIR PDL application on the Torch dialect -> FX rewrite.

The entry point is :func:`pdlkit.matcher.substitute.substitute`; it is not re-exported here
so that ``pdlkit.matcher.substitute`` always names the module.
"""

from pdlkit.matcher.gen_pattern import pattern_from_function
from pdlkit.matcher.patterns import Pattern, PatternError, PatternSet, load_patterns

__all__ = ["Pattern", "PatternError", "PatternSet", "load_patterns", "pattern_from_function"]
