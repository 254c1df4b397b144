"""One call from an FP32 model to an int8 (PT2E) or BF16 model that pdlkit can compile.

For users without a quantization pipeline of their own. Before::

    model = MyModel().eval()
    y = torch.compile(model, backend="pdlkit")(x)            # FP32 GEMMs

After::

    from pdlkit.quantization import quantize

    qmodel = quantize(model, (x,), calibration=[(x1,), (x2,)])  # scheme="int8-static"
    y = torch.compile(qmodel, backend="pdlkit")(x)            # int8 GEMMs where a pattern matches
    print(pdlkit.explain(qmodel, x))                          # which ones did

The int8 schemes are torchao's PT2E flow (``torch.export`` -> ``prepare_pt2e`` with
``X86InductorQuantizer`` -> calibration -> ``convert_pt2e``): the result is a
``torch.fx.GraphModule`` whose GEMMs read ``dequantize_per_tensor`` (activations, uint8)
and ``dequantize_per_channel`` (weights, int8), which is what the x86 int8 patterns match.
Pipelines that run PT2E themselves (another quantizer, QAT) need none of this: pdlkit
compiles their converted model directly.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Iterable
from typing import Any

import torch

SCHEMES = ("int8-static", "int8-dynamic", "int8-dynamic-per-token", "bf16")

_NEEDS_TORCHAO = "pdlkit.quantization needs torchao (pip install -e '.[quant]')"


def quantize(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    *,
    calibration: Iterable[tuple[Any, ...]] | None = None,
    scheme: str = "int8-static",
    dynamic_shapes: Any = None,
) -> torch.nn.Module:
    """Quantize ``model`` for inference with ``scheme``; the input model is left unchanged.

    Schemes:

    * ``"int8-static"``: int8 GEMMs with activation scales fixed by calibration. The model
      runs once per item of ``calibration`` (an iterable of input tuples, like
      ``example_inputs``; default: ``example_inputs`` once). Calibrate on real data: the
      scales are only as good as the ranges seen here.
    * ``"int8-dynamic"``: int8 GEMMs whose activation scales are computed at run time from
      each input (``choose_qparams``; one scale per tensor, which is what
      X86InductorQuantizer's dynamic config gives, not per token); no calibration (``calibration`` is ignored; the model runs
      once on ``example_inputs`` so that the weight observers see the weights).
    * ``"int8-dynamic-per-token"``: a copy of the model whose ``nn.Linear`` layers are
      :class:`~pdlkit.quantization.int8_dynamic.Int8DynamicLinear` (int8 weights per output
      channel, int8 activations per token, ``torch._int_mm``), in plain torch ops: no
      torchao, any device; ``patterns/cuda/`` routes it to fused GPU kernels.
    * ``"bf16"``: a copy of the model with ``model.to(torch.bfloat16)`` semantics (every
      floating-point parameter and buffer in bfloat16). The inputs are the caller's
      business: pass bfloat16 tensors for float inputs (integer ones such as token ids stay
      as they are). ``example_inputs`` and ``calibration`` are not used.

    The int8 model is captured with ``torch.export`` on ``example_inputs`` in eval mode
    (dropout off; the input model's training flag is restored afterwards). Export
    specialises on their shapes: a model that must accept other shapes (another batch size
    or sequence length, in calibration too) needs ``dynamic_shapes``, passed on to
    ``torch.export.export`` as is, e.g. ``({0: torch.export.Dim("batch")},)``.

    Returns, for int8, torchao's converted ``torch.fx.GraphModule``: weights int8 per output
    channel (symmetric), activations uint8 per tensor (asymmetric). Its ``eval()`` is a
    no-op and ``train()`` raises: it is for inference. Raises ValueError for an unknown
    scheme and ImportError when torchao is missing.
    """
    if scheme not in SCHEMES:
        raise ValueError(
            f"unknown quantization scheme {scheme!r}; known schemes: {', '.join(SCHEMES)}"
        )
    if scheme == "int8-dynamic-per-token":
        from pdlkit.quantization.int8_dynamic import quantize_int8_dynamic

        return quantize_int8_dynamic(copy.deepcopy(model)).eval()
    if scheme == "bf16":
        # deepcopy first: Module.to() converts in place and the caller keeps the FP32 model.
        return copy.deepcopy(model).to(torch.bfloat16)

    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    except ImportError as e:
        raise ImportError(f"{_NEEDS_TORCHAO}; importing it failed: {e}") from e

    example_inputs = _as_tuple(example_inputs)
    dynamic = scheme == "int8-dynamic"
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            exported = torch.export.export(
                model, example_inputs, dynamic_shapes=dynamic_shapes
            ).module()
            quantizer = X86InductorQuantizer().set_global(
                get_default_x86_inductor_quantization_config(is_dynamic=dynamic)
            )
            prepared = prepare_pt2e(exported, quantizer)
            # Dynamic: one run still matters, the weight observers record their ranges then.
            if dynamic or calibration is None:
                calibration = [example_inputs]
            for inputs in calibration:
                prepared(*_as_tuple(inputs))
            converted = convert_pt2e(prepared)
    finally:
        model.train(was_training)
    return _inference_only(converted)


def _inference_only(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Make ``eval()`` a no-op returning the module and ``train()`` a clear error.

    torchao makes both raise on converted models; ``model.eval()`` is too common a habit for
    that, and the model was captured in eval mode already.
    """

    def _train(self: torch.fx.GraphModule, mode: bool = True) -> torch.fx.GraphModule:
        if mode:
            raise NotImplementedError(
                "a model from pdlkit.quantization.quantize() is for inference; "
                "quantization-aware training needs torchao's QAT flow"
            )
        return self

    def _eval(self: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return self

    gm.train = types.MethodType(_train, gm)  # type: ignore[method-assign]
    gm.eval = types.MethodType(_eval, gm)  # type: ignore[method-assign]
    return gm


def _as_tuple(inputs: Any) -> tuple[Any, ...]:
    # A lone tensor is the common one-input case; torch.export wants a tuple.
    if isinstance(inputs, tuple):
        return inputs
    if isinstance(inputs, list):
        return tuple(inputs)
    return (inputs,)
