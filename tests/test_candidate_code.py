"""The whole-graph check's losing candidates: the code Inductor loaded for them is unloaded
(with its constants), the winner's stays and runs."""

from __future__ import annotations

import sys

import torch
import torch.fx as fx
from pdlkit.matcher.candidate_code import Loaded
from torch._inductor.codecache import PyCodeCache
from torch._inductor.compile_fx import compile_fx


def _compile(scale: float):
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * scale) + 1.0

    gm = fx.symbolic_trace(f)
    return lambda: compile_fx(gm, [torch.randn(4, 8)])


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
