"""bert-mini for ``pdlkit explain --target yitian``: the plan for an Alibaba Yitian (AArch64) host.

    pdlkit explain examples/yitian_bert.py:example --target yitian        # PT2E int8
    pdlkit explain examples/yitian_bert.py:example_bf16 --target yitian   # BF16
    pdlkit explain examples/yitian_bert.py:example --target aarch64       # no i8mm: SDOT kernels

bert-mini (4 layers, hidden 256, 4 heads, FFN 1024; random weights, nothing downloaded),
batch 8 x 64, as benchmarks/x86_bert.py and benchmarks/aarch64_bert.py build it; int8 through
pdlkit.quantization.quantize (torchao PT2E, static, per-channel weights). Needs transformers
and torchao (pip install -e '.[quant]').
"""

from __future__ import annotations

import torch

MINI = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)


def bert_mini(batch: int = 8, seq: int = 64) -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(**MINI)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), dtype=torch.int64)
    return model, ids


def example():
    from pdlkit.quantization import quantize

    model, ids = bert_mini()
    return quantize(model, (ids,), scheme="int8-static"), (ids,)


def example_bf16():
    from pdlkit.quantization import quantize

    model, ids = bert_mini()
    return quantize(model, (ids,), scheme="bf16"), (ids,)
