"""pdlkit.quantization: int8 / BF16 flows (PT2E graphs, scales, weight pre-pack).

``quantize(model, example_inputs, calibration=..., scheme=...)`` turns an FP32 model into a
PT2E int8 (torchao, X86InductorQuantizer) or a BF16 model for ``torch.compile(...,
backend="pdlkit")``; ``cosine_similarity`` / ``max_abs_error`` compare its outputs with the
FP32 model's. torchao is needed only by the int8 schemes (``pip install -e '.[quant]'``).
The core pipeline does not depend on this package.
"""

from pdlkit.quantization.metrics import cosine_similarity, max_abs_error
from pdlkit.quantization.pt2e import SCHEMES, QuantizationError, quantize
from pdlkit.quantization.summary import QuantizationSummary

__all__ = [
    "SCHEMES",
    "QuantizationError",
    "QuantizationSummary",
    "cosine_similarity",
    "max_abs_error",
    "quantize",
]
