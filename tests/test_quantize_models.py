"""quantize() on models nobody here wrote (issue 25, items 5-8): tiny random GPT-2, Llama,
BERT and ViT from transformers and a ResNet-style CNN, end to end: every GEMM int8, every
int8 GEMM inside a substitution, numerics, other input shapes, and errors said plainly."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch
from conftest import VNNI, tiny_bert
from torch import nn

import pdlkit

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None,
    reason="torchao is not installed (pip install -e '.[quant]'); the int8 schemes need it",
)


def _transformers():
    return pytest.importorskip("transformers", reason="the model families come from transformers")


class Output(nn.Module):
    """A user's wrapper returning one field (BertModel's pooler and the like stay unused)."""

    def __init__(self, model: nn.Module, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(x), self.field)


def gpt2():
    t = _transformers()
    c = t.GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=2,
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return Output(t.GPT2LMHeadModel(c), "logits"), torch.randint(0, 64, (2, 8))


def llama():
    t = _transformers()
    c = t.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=64, max_position_embeddings=32)  # fmt: skip
    return Output(t.LlamaForCausalLM(c), "logits"), torch.randint(0, 64, (2, 8))


def bert():
    _transformers()
    model = tiny_bert(hidden_size=32, intermediate_size=64, vocab_size=64)
    return Output(model, "last_hidden_state"), torch.randint(0, 64, (2, 8))


def vit():
    t = _transformers()
    c = t.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    image_size=16, patch_size=8)  # fmt: skip
    return Output(t.ViTModel(c), "last_hidden_state"), torch.randn(2, 3, 16, 16)


class Block(nn.Module):
    """torchvision's BasicBlock: one ReLU module called twice, an in-place residual add."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        self.down = (
            None
            if stride == 1
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


def cnn():
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        Block(16, 16, 1), Block(16, 32, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    )  # fmt: skip
    return model, torch.randn(2, 3, 16, 16)


FAMILIES = {"gpt2": gpt2, "llama": llama, "bert": bert, "vit": vit, "cnn": cnn}
# GEMMs with weights in each tiny model: linears (conv: the ViT patch embedding / the CNN)
GEMMS = {"gpt2": 9, "llama": 15, "bert": 12, "vit": 13, "cnn": 7}


@pytest.fixture(scope="module", params=list(FAMILIES))
def quantized(request):
    from pdlkit.quantization import quantize

    torch.manual_seed(0)
    model, x = FAMILIES[request.param]()
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a GEMM left in float would warn
        q = quantize(model, (x,), reduce_range=False)  # 8 bits, without VNNI too: no warning
    return request.param, model, q, x


def test_every_gemm_gets_int8_weights(quantized):
    name, _, q, _ = quantized
    summary = q.pdlkit_quantization
    assert (len(summary.quantized), summary.left) == (GEMMS[name], [])


@pytest.mark.skipif(not VNNI, reason="the x86 int8 kernels need AVX512_VNNI")
def test_every_int8_gemm_is_inside_a_substitution(quantized):
    _, _, q, x = quantized
    report = pdlkit.explain(q, x, autotune="off")
    replaced = [n for s in report.substitutions for n in s.replaced]
    gemms = [n for n in replaced if n.startswith(("linear", "conv2d"))]
    assert len(gemms) == len(q.pdlkit_quantization.quantized)


@pytest.mark.skipif(not VNNI, reason="the x86 int8 kernels need AVX512_VNNI")
def test_kernels_agree_with_the_quantized_model_and_it_with_fp32(quantized):
    from pdlkit.quantization import cosine_similarity

    _, model, q, x = quantized
    with torch.no_grad():
        fast = pdlkit.optimize(q, autotune="off", default_codegen="eager")(x)
        assert cosine_similarity(fast, q(x)) > 0.9999
        assert cosine_similarity(q(x), model(x)) > 0.99


def test_a_quantized_transformer_takes_another_batch_and_length():
    from pdlkit.quantization import cosine_similarity, quantize

    torch.manual_seed(0)
    model, ids = bert()
    q = quantize(model.eval(), (ids,))
    assert q.pdlkit_quantization.dynamic == "input 0 dims 0, 1"
    other = torch.randint(0, 64, (3, 12))
    with torch.no_grad():
        fast = pdlkit.optimize(q, autotune="off", default_codegen="eager")
        assert cosine_similarity(fast(other), q(other)) > 0.9999


def test_a_batch_of_one_in_the_example_does_not_fix_the_batch():
    from pdlkit.quantization import quantize

    torch.manual_seed(0)
    model, ids = gpt2()
    q = quantize(model.eval(), (ids[:1],))
    with torch.no_grad():
        assert q(torch.randint(0, 64, (3, 5))).shape == (3, 5, 64)


class Branchy(nn.Module):
    def forward(self, x):
        return x + 1 if x.sum() > 0 else x - 1  # data-dependent: torch.export refuses it


def test_a_model_export_cannot_capture_is_one_clear_error():
    from pdlkit.quantization import QuantizationError, quantize

    with warnings.catch_warnings(), pytest.raises(QuantizationError) as e:
        warnings.simplefilter("ignore")
        quantize(Branchy(), (torch.randn(2, 4),))
    message = str(e.value)
    assert message.startswith("quantize: torch.export could not capture the model (")
    assert "scheme='bf16'" in message and "\n" not in message
