"""pdlkit.matcher: pattern files -> MLIR PDL application on the Torch dialect -> FX rewrite."""

from pdlkit.matcher.patterns import Pattern, PatternError, PatternSet, load_patterns
from pdlkit.matcher.substitute import substitute

__all__ = ["Pattern", "PatternError", "PatternSet", "load_patterns", "substitute"]
