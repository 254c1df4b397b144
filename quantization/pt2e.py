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

import contextlib
import copy
import types
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from pdlkit.errors import PdlkitError

SCHEMES = ("int8-static", "int8-dynamic", "int8-dynamic-per-token", "bf16")

_NEEDS_TORCHAO = "pdlkit.quantization needs torchao (pip install -e '.[quant]')"


class QuantizationError(PdlkitError, RuntimeError):
    """torch.export or torchao failed on the model; the message says where and what to try."""


def quantize(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    *,
    calibration: Iterable[tuple[Any, ...]] | None = None,
    scheme: str = "int8-static",
    dynamic_shapes: Any = "auto",
    reduce_range: bool | None = None,
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
    (dropout off; the input model's training flag is restored afterwards).
    ``dynamic_shapes="auto"`` (the default) lets every input dim the model allows vary
    (batch, sequence length, image size; see :mod:`pdlkit.quantization.shapes`), so the
    quantized model takes other shapes than the example's; None captures the example's
    shapes only; anything else is passed to ``torch.export.export`` as is, e.g.
    ``({0: torch.export.Dim("batch")},)``.

    ``reduce_range=True`` (int8-static / int8-dynamic): 7-bit activations (torchao's advice
    for x86 CPUs without VNNI, where oneDNN's u8 x s8 GEMM, PyTorch's int8 path's and pdlkit's,
    adds pairs of products in int16 and saturates for 8 bits: int8 GPT-2 0.31 off its eager run
    on an AVX2-only EPYC, 0.04 on an AVX-512 one), one bit less precise on every host. None
    keeps 8 bits and warns on such a CPU (:func:`int16_pairs`); False keeps them silently.

    Before the quantizer annotates the graph, dead outputs are removed, in-place ops made
    functional, each call of a module called twice (ResNet's ``relu``) given a partition of
    its own, and GEMMs written as ``matmul`` / ``addmm`` with a weight (GPT-2's ``Conv1D``)
    made ``linear`` (:mod:`pdlkit.quantization.prepare`): torchao fails on the first three
    and leaves the last in float. The result's ``pdlkit_quantization`` attribute says how many GEMMs got
    int8 weights and which stayed in float (a warning names the latter).

    Returns, for int8, torchao's converted ``torch.fx.GraphModule``: weights int8 per output
    channel (symmetric), activations uint8 per tensor (asymmetric). Its ``eval()`` is a
    no-op and ``train()`` raises: it is for inference. Raises ValueError for an unknown
    scheme, ImportError when torchao is missing and :class:`QuantizationError` when
    torch.export or torchao fails on the model.
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
    example_inputs = _as_tuple(example_inputs)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            bits7 = _reduce_range(reduce_range)
            return _pt2e(model, example_inputs, calibration, scheme, dynamic_shapes, bits7)
    finally:
        model.train(was_training)


def _torchao() -> tuple[Any, Any, Any, Any]:
    """torchao's PT2E entry points, imported without its load-time chatter (extension
    libraries for other hardware that do not load here; deprecation notices)."""
    import logging

    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    except ImportError as e:
        raise ImportError(f"{_NEEDS_TORCHAO}; importing it failed: {e}") from e
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
    return (
        prepare_pt2e,
        convert_pt2e,
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )


def _pt2e(
    model: torch.nn.Module,
    example_inputs: tuple[Any, ...],
    calibration: Iterable[tuple[Any, ...]] | None,
    scheme: str,
    dynamic_shapes: Any,
    reduce_range: bool,
) -> torch.fx.GraphModule:
    from pdlkit.quantization.prepare import prepare_for_quantizer
    from pdlkit.quantization.shapes import capture, describe_dynamic
    from pdlkit.quantization.summary import summarize

    prepare_pt2e, convert_pt2e, quantizer_cls, default_config = _torchao()
    dynamic = scheme == "int8-dynamic"
    try:
        exported = capture(model, example_inputs, dynamic_shapes)
    except Exception as e:
        raise QuantizationError(
            f"quantize: torch.export could not capture the model ({type(e).__name__}: "
            f"{_first_line(e)}); int8 quantization through PT2E needs an exportable model. "
            "Try dynamic_shapes=None (the example's shapes only), or scheme='bf16' / "
            "'int8-dynamic-per-token', which do not export"
        ) from e
    dynamic_dims = describe_dynamic(exported)  # before torchao's passes rewrite the inputs' meta
    prepared_counts = prepare_for_quantizer(exported)
    quantizer = quantizer_cls().set_global(
        default_config(is_dynamic=dynamic, reduce_range=reduce_range)
    )
    with _torchao_step("prepare_pt2e (the quantizer annotating the graph)"):
        prepared = prepare_pt2e(exported, quantizer)
    # Dynamic: one run still matters, the weight observers record their ranges then.
    with _torchao_step("calibration"):
        for inputs in [example_inputs] if dynamic or calibration is None else calibration:
            prepared(*_as_tuple(inputs))
    with _torchao_step("convert_pt2e"):
        converted = convert_pt2e(prepared)
    summary = summarize(converted, scheme, prepared_counts, dynamic_dims)
    if summary.left or not summary.quantized:
        warnings.warn(f"pdlkit.quantization.quantize: {summary}", stacklevel=3)
    converted.pdlkit_quantization = summary
    return _inference_only(converted)


def _reduce_range(asked: bool | None) -> bool:
    """``quantize``'s ``reduce_range``: as asked; None is False, with a warning on an x86 CPU
    whose int8 GEMM adds pairs of products in int16 (:func:`int16_pairs`)."""
    if asked is not None:
        return bool(asked)
    if int16_pairs():
        warnings.warn(
            "pdlkit.quantization.quantize: this x86 CPU has no VNNI (avx512_vnni, avx_vnni or "
            "AMX): oneDNN's int8 GEMM, PyTorch's and pdlkit's, adds pairs of 8-bit products in "
            "int16 here and saturates, so int8 results can be far off the model's; pass "
            "reduce_range=True for 7-bit activations (exact here, one bit less precise on "
            "every host), or reduce_range=False to keep 8 bits without this warning",
            stacklevel=4,
        )
    return False


def int16_pairs() -> bool:
    """Whether oneDNN's u8 x s8 GEMM on this CPU adds pairs of products in int16 (x86
    without VNNI: ``vpmaddubsw``), which saturates for 8-bit activations:
    2 x 255 x 127 > 32767."""
    from pdlkit.runtime_abi.capability import cpu_flags, host_arch

    if host_arch() != "x86_64":
        return False
    flags = cpu_flags("x86_64")  # empty where /proc/cpuinfo is not readable: not known
    return bool(flags) and not ({"avx512_vnni", "avx_vnni", "amx_int8"} & flags)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


@contextlib.contextmanager
def _torchao_step(step: str) -> Iterator[None]:
    """An error inside torchao, said as what failed and what the user can do."""
    try:
        yield
    except Exception as e:
        raise QuantizationError(
            f"quantize: torchao's PT2E flow failed in {step} with {type(e).__name__}: "
            f"{_first_line(e)}. PyTorch's own int8 path (torchao PT2E + Inductor) fails on this "
            "model the same way. What you can do: quantize only the parts that fail less "
            "(quantize submodules), use scheme='int8-dynamic-per-token' (plain torch ops, "
            "no torchao) or 'bf16', or report the model to torchao with this message"
        ) from e


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
