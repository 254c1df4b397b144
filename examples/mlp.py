"""An example for ``pdlkit explain examples/mlp.py:example``: returns (model, example inputs)."""

import torch


class MLP(torch.nn.Module):
    def __init__(self, d: int = 64, h: int = 256):
        super().__init__()
        self.up = torch.nn.Linear(d, h)
        self.down = torch.nn.Linear(h, d)
        self.head = torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(torch.nn.functional.gelu(self.up(x)))
        return torch.relu(self.head(y + x))


def example():
    torch.manual_seed(0)
    return MLP().eval(), (torch.randn(8, 64),)
