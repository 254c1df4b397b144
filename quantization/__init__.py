"""pdlkit.quantization: int8 / BF16 flows (PT2E graphs, scales, weight pre-pack).

The quantized-GEMM work lands here (see the x86, Yitian and CUDA issues); the core
pipeline does not depend on it.
"""
