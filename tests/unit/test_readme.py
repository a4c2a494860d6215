"""The README's custom-loss recipe must keep working exactly as printed."""

import re
import sys
import types
from pathlib import Path

import torch

from forge_core.losses import get_loss

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_custom_loss_recipe_runs(monkeypatch):
    text = README.read_text()
    block = re.search(r"```python\n# mypkg/losses.py\n(.*?)```", text, re.DOTALL).group(1)
    module = types.ModuleType("mypkg_readme_losses")
    exec(compile(block, "README.md", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "mypkg_readme_losses", module)
    loss = get_loss("mypkg_readme_losses:ClippedTokenReinforce", cap=3.0)
    lp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -7.0, -7.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    adv = torch.tensor([1.0, -2.0])
    out = loss(lp, None, adv, mask)
    assert out.item() == torch.tensor((1.0 + 2.0 - 1.0) / 3).item()
    assert loss.metrics["ratio_mean"] == 1.0
    out.backward()
    assert lp.grad[0, 2] == 0 and lp.grad[1, 1] == 0
