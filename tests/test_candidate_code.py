"""The whole-graph check's losing candidates: the code Inductor loaded for them is unloaded
(with its constants), the winner's stays and runs."""

from __future__ import annotations

import sys

import torch
import torch.fx as fx
from pdlkit.matcher import graph_guard
from pdlkit.matcher.candidate_code import Loaded
from torch._inductor.codecache import PyCodeCache
from torch._inductor.compile_fx import compile_fx


def _compile(scale: float, x: torch.Tensor | None = None, matmuls: int = 0):
    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x * scale) + 1.0
        for _ in range(matmuls):
            y = torch.tanh(y @ y)
        return y

    gm = fx.symbolic_trace(f)
    return lambda: compile_fx(gm, [torch.randn(4, 8) if x is None else x])


def test_the_losers_modules_leave_inductors_registries_and_the_winner_still_runs() -> None:
    torch._dynamo.reset()
    loaded = Loaded()
    win = loaded.tracked("winner", _compile(2.0))()
    loaded.tracked("loser", _compile(3.0))()
    winners, losers = loaded.by_name["winner"], loaded.by_name["loser"]
    assert winners and losers, "each compile loaded an output module"

    assert loaded.unload("winner") == len(losers)

    present = {id(m) for m in PyCodeCache.modules}
    assert not set(losers) & present
    assert all(sys.modules.get(m.__name__) is not m for m in losers.values())
    assert set(winners) <= present
    x = torch.randn(4, 8)
    out = win(x)
    out = out[0] if isinstance(out, (list, tuple)) else out
    torch.testing.assert_close(out, torch.relu(x * 2.0) + 1.0)


def test_a_module_the_winner_also_loaded_is_kept() -> None:
    torch._dynamo.reset()
    loaded = Loaded()
    loaded.tracked("winner", _compile(5.0))()
    loaded.tracked("loser", _compile(6.0))()
    mine = loaded.by_name["winner"]
    loaded.by_name["loser"].update(mine)  # a module both compiles loaded (Inductor's cache)

    assert loaded.unload("winner") == len(loaded.by_name["loser"]) - len(mine)
    assert set(mine) <= {id(m) for m in PyCodeCache.modules}


def test_the_whole_graph_check_unloads_the_code_of_the_graph_that_lost(steady_host) -> None:
    torch._dynamo.reset()
    x = torch.randn(96, 96)
    made: dict[str, set[int]] = {}

    def noted(name: str, make):
        def run():
            before = {id(m) for m in PyCodeCache.modules}
            try:
                return make()
            finally:
                made[name] = {id(m) for m in PyCodeCache.modules} - before

        return run

    verdict, fn, _ = graph_guard.choose(
        "test: a slow Inductor graph",
        noted("substituted", _compile(2.0, x)),
        noted("inductor", _compile(2.0, x, matmuls=40)),  # 40 matmuls more: it loses
        [x],
        "full",
    )

    assert verdict == graph_guard.SUBSTITUTED
    assert made["inductor"] and made["substituted"]
    present = {id(m) for m in PyCodeCache.modules}
    assert not made["inductor"] & present
    assert made["substituted"] <= present
    out = fn(x)
    out = out[0] if isinstance(out, (list, tuple)) else out
    torch.testing.assert_close(out, torch.relu(x * 2.0) + 1.0)
