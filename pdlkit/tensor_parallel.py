"""Tensor parallelism with plain local modules (vLLM's form), for models to quantize per rank.

    before: model.mlp.up = nn.Linear(64, 256); model.mlp.down = nn.Linear(256, 64)
    after:  tensor_parallel(model, {"mlp.up": "colwise", "mlp.down": "rowwise"})
            rank r holds up.weight[128 r : 128 (r + 1)] and down.weight[:, 128 r : 128 (r + 1)];
            down's partial products are summed by a functional all_reduce, then its bias added

DTensor's ``parallelize_module`` shards the same way and compiles under pdlkit too (see
:mod:`pdlkit.distributed`); this form exists because quantization replaces modules and
traces them (``pdlkit.quantization.quantize``: PT2E's ``torch.export``, the per-token
``Int8DynamicLinear``), which needs plain tensors, not DTensor parameters with hooks. Each
rank's local ``nn.Linear`` is an ordinary linear, so it quantizes and is substituted like any
other; the ``all_reduce`` is a ``_c10d_functional`` collective, which stays with Inductor.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch import Tensor, nn

STYLES = ("colwise", "rowwise")


def _group_name(group: object | None) -> str:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "pdlkit.tensor_parallel: torch.distributed's default process group is not "
            "initialized: call torch.distributed.init_process_group(...) on every rank first"
        )
    pg = group if group is not None else dist.group.WORLD
    return str(pg.group_name)  # type: ignore[attr-defined]


class ColumnParallelLinear(nn.Module):
    """This rank's rows of a linear's weight (its output features): no communication; the
    output is this rank's slice of the last dim, as ``ColwiseParallel`` gives it."""

    def __init__(self, linear: nn.Linear, rank: int, world: int) -> None:
        super().__init__()
        n = linear.out_features // world
        w = linear.weight.detach()[rank * n : (rank + 1) * n]
        self.linear = nn.Linear(linear.in_features, n, linear.bias is not None)
        self.linear.to(device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(w)
            if linear.bias is not None:
                self.linear.bias.copy_(linear.bias.detach()[rank * n : (rank + 1) * n])

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)


class RowParallelLinear(nn.Module):
    """This rank's columns of a linear's weight (its input features, the slice a column-
    parallel layer before it produced): partial products summed over the group by
    ``all_reduce``, then the bias, once."""

    def __init__(self, linear: nn.Linear, rank: int, world: int, group_name: str) -> None:
        super().__init__()
        k = linear.in_features // world
        w = linear.weight.detach()[:, rank * k : (rank + 1) * k]
        self.linear = nn.Linear(k, linear.out_features, bias=False)
        self.linear.to(device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(w)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        self.group_name = group_name

    def forward(self, x: Tensor) -> Tensor:
        from torch.distributed import _functional_collectives as funcol

        group = cast(Any, self.group_name)  # a group name: no process group object in the graph
        y = funcol.wait_tensor(funcol.all_reduce(self.linear(x), "sum", group))
        return y if self.bias is None else y + self.bias


def tensor_parallel(
    model: nn.Module, plan: Mapping[str, str], group: object | None = None
) -> nn.Module:
    """Shard ``model``'s linears in place for this rank, by ``plan``: module name (or an
    ``fnmatch`` pattern, ``"layers.*.mlp.up_proj"``) -> ``"colwise"`` / ``"rowwise"``.

    Every rank calls it with the same model (same weights) and plan. A plan entry that names
    no ``nn.Linear``, an unknown style, or a dimension the group size does not divide is a
    ``ValueError`` naming the entry. Returns ``model``."""
    import torch.distributed as dist

    name = _group_name(group)
    rank = dist.get_rank(group)  # type: ignore[arg-type]
    world = dist.get_world_size(group)  # type: ignore[arg-type]
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    for key, style in plan.items():
        if style not in STYLES:
            raise ValueError(
                f"tensor_parallel plan {key!r}: style {style!r} is not one of {STYLES}"
            )
        names = [n for n in linears if fnmatch.fnmatchcase(n, key)]
        if not names:
            raise ValueError(f"tensor_parallel plan {key!r} names no nn.Linear of the model")
        for n in names:
            lin = linears.pop(n)
            dim = lin.out_features if style == "colwise" else lin.in_features
            if dim % world:
                raise ValueError(
                    f"tensor_parallel plan {key!r}: {n} has {dim} "
                    f"{'output' if style == 'colwise' else 'input'} features, not divisible "
                    f"by the group size {world}"
                )
            new: nn.Module = (
                ColumnParallelLinear(lin, rank, world)
                if style == "colwise"
                else RowParallelLinear(lin, rank, world, name)
            )
            parent_name, _, child = n.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    return model
