"""The models of x86_models.py: their sizes (``MODELS``), the dtypes and the
pdlkit.quantization scheme of each (``SCHEMES``), and building and quantizing them.

Imported by benchmarks/x86_models.py and the scripts that reuse its models (x86_profile.py,
x86_second_compile.py, x86_subgraph_proxy.py, x86_whole_graph.py, x86_amx.py), through
``x86_models`` (run by path: this folder is on ``sys.path``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Spec:
    family: str  # a key of FAMILIES
    config: dict[str, Any]
    batch: int
    size: int  # tokens per sequence, or the image side in pixels

    def shape(self) -> str:
        if self.family in IMAGES:
            return f"{self.batch}x3x{self.size}x{self.size}"
        return f"{self.batch}x{self.size}"


_MINI = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
_LLAMA = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=2, num_attention_heads=8)
MODELS: dict[str, Spec] = {
    "bert-mini": Spec("bert", _MINI, 8, 64),
    "bert-base": Spec("bert", {}, 1, 128),  # BertConfig() defaults: 12 layers, hidden 768
    "gpt2": Spec("gpt2", dict(n_layer=2, n_embd=256, n_head=4, n_positions=256), 8, 64),
    # GQA: 8 query heads over 4 key/value heads
    "llama": Spec(
        "llama", {**_LLAMA, "num_key_value_heads": 4, "max_position_embeddings": 256}, 8, 64
    ),
    "vit": Spec("vit", {**_MINI, "image_size": 224, "patch_size": 16}, 2, 224),
    # more families, each a graph of its own kind (not in DEFAULT_MODELS): Qwen2's biased
    # Q, K, V projections and GQA; Phi-3's fused QKV and gate/up linears, split after the
    # GEMM; T5's RMS norm without bias, relative position bias and ReLU FFN; DistilBERT's
    # attention module; CLIP's pre-norm encoder with quick GELU
    "qwen2": Spec(
        "qwen2", {**_LLAMA, "num_key_value_heads": 2, "max_position_embeddings": 256}, 8, 64
    ),
    "phi3": Spec(
        "phi3",
        {**_LLAMA, "num_key_value_heads": 8, "max_position_embeddings": 256, "pad_token_id": 0},
        8,
        64,
    ),
    "t5-encoder": Spec(
        "t5", dict(d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_heads=4), 8, 64
    ),
    "distilbert": Spec("distilbert", dict(dim=256, hidden_dim=1024, n_layers=4, n_heads=4), 8, 64),
    "clip-vision": Spec("clip", {**_MINI, "image_size": 224, "patch_size": 16}, 2, 224),
}
DEFAULT_MODELS = ("bert-mini", "bert-base", "gpt2", "llama", "vit")
IMAGES = ("vit", "clip")  # families whose input is an image batch
# dtype -> pdlkit.quantization scheme (None: the FP32 model as is)
SCHEMES = {
    "fp32": None,
    "bf16": "bf16",
    "int8-static": "int8-static",
    "int8-dynamic": "int8-dynamic",
    "int8-per-token": "int8-dynamic-per-token",
    "int8-dynamic-arm": "arm-dynamic",  # torchao's ArmInductorQuantizer, dynamic (_arm_dynamic)
    # torchao's quantize_ on the FP32 model (_torchao): what its users compile with Inductor
    "torchao-int8-dynamic": "torchao:Int8DynamicActivationInt8WeightConfig",
    "torchao-int8-weight-only": "torchao:Int8WeightOnlyConfig",
    # the same on the BF16 model (its input stays token ids; images in bf16)
    "torchao-int8-dynamic-bf16": "torchao-bf16:Int8DynamicActivationInt8WeightConfig",
    "torchao-intx-weight-only-bf16": "torchao-bf16:IntxWeightOnlyConfig",
}
DEFAULT_DTYPES = ("fp32", "bf16", "int8-static", "int8-dynamic")
# peer: PyTorch's int8 path (Inductor with freezing)
PT2E = ("int8-static", "int8-dynamic", "int8-dynamic-arm")


# -- models ----------------------------------------------------------------------------------------


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """(FP32 model with random weights in eval mode, one input batch)."""
    try:
        import transformers as tf
    except ImportError as e:
        raise ImportError("the models need transformers (or carry its wheel in)") from e
    spec = MODELS[name]
    torch.manual_seed(0)
    kinds = {
        "bert": (tf.BertConfig, tf.BertModel),
        "gpt2": (tf.GPT2Config, tf.GPT2Model),
        "llama": (tf.LlamaConfig, tf.LlamaModel),
        "vit": (tf.ViTConfig, tf.ViTModel),
        "qwen2": (tf.Qwen2Config, tf.Qwen2Model),
        "phi3": (tf.Phi3Config, tf.Phi3Model),
        "t5": (tf.T5Config, tf.T5EncoderModel),
        "distilbert": (tf.DistilBertConfig, tf.DistilBertModel),
        "clip": (tf.CLIPVisionConfig, tf.CLIPVisionModel),
    }
    cfg_cls, model_cls = kinds[spec.family]
    cfg = cfg_cls(**spec.config)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False  # no KV cache object in the outputs: export and compile see tensors
    model = model_cls(cfg).eval()  # random weights, nothing downloaded
    if spec.family in IMAGES:
        x = torch.randn(spec.batch, 3, spec.size, spec.size)
    else:
        x = torch.randint(0, cfg.vocab_size, (spec.batch, spec.size), dtype=torch.int64)
    return model, x


def prepare(model: torch.nn.Module, x: torch.Tensor, dtype: str) -> tuple[Any, torch.Tensor]:
    """The model and input of ``dtype`` (through pdlkit.quantization, whose int8 schemes need
    torchao: imported only then)."""
    scheme = SCHEMES[dtype]
    if scheme is None:
        return model, x
    if scheme == "arm-dynamic":
        return _arm_dynamic(model, x), x
    if scheme.startswith("torchao"):
        kind, config = scheme.split(":")
        bf16 = kind == "torchao-bf16"
        if bf16 and x.is_floating_point():
            x = x.to(torch.bfloat16)
        return _torchao(model, config, torch.bfloat16 if bf16 else None), x
    from pdlkit.quantization import quantize

    with torch.no_grad():
        qm = quantize(model, (x,), scheme=scheme)
    if scheme == "bf16" and x.is_floating_point():
        x = x.to(torch.bfloat16)
    return qm, x


def _arm_dynamic(model: torch.nn.Module, x: torch.Tensor) -> Any:
    """torchao's ArmInductorQuantizer with its dynamic config (int8 activations quantized per
    call, per-tensor weights: an Arm-style model run on x86), through torch.export and PT2E."""
    import torchao.quantization.pt2e.quantizer.arm_inductor_quantizer as aiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with torch.no_grad():
        exported = torch.export.export(model.eval(), (x,), strict=False).module()
        config = aiq.get_default_arm_inductor_quantization_config(is_dynamic=True)
        prepared = prepare_pt2e(exported, aiq.ArmInductorQuantizer().set_global(config))
        prepared(x)
        return convert_pt2e(prepared)


def _torchao(model: torch.nn.Module, config: str, dtype: torch.dtype | None) -> torch.nn.Module:
    """A copy of ``model`` (in ``dtype``, if given) with torchao's ``quantize_(model,
    <config>())`` applied (its tensor subclasses as the linears' weights; pdlkit desugars them
    when it compiles)."""
    import copy

    import torchao.quantization as tq

    qm = copy.deepcopy(model)
    if dtype is not None:
        qm = qm.to(dtype)
    tq.quantize_(qm, getattr(tq, config)())
    return qm


def int8_gemms(model: Any) -> tuple[int, int]:
    """(GEMMs with int8 weights, all GEMMs) of a PT2E model. X86InductorQuantizer annotates
    linear layers only: GPT-2's Conv1D, an addmm, stays FP32; and on torch < 2.12 it finds
    none in a non-strict ``torch.export`` graph (no ``source_fn_stack``; checked on 2.11)."""
    calls = [n for n in model.graph.nodes if n.op == "call_function"]
    gemms = [n for n in calls if "addmm" in str(n.target) or "aten.linear" in str(n.target)]

    def dequantized(w: Any) -> bool:  # per channel, or per tensor (ArmInductorQuantizer)
        return isinstance(w, torch.fx.Node) and "dequantize_per" in str(w.target)

    return sum(len(n.args) > 1 and dequantized(n.args[1]) for n in gemms), len(gemms)
