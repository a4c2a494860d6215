"""check_loss refuses exactly what building the loss refuses, without building it (the controller's check)."""

import pytest
from torch import nn

from forge_core import losses
from forge_core.losses import LOSSES, check_loss, get_loss

BAD = [("grpo", {"clip_low": -1.0}), ("dapo", {"clip_high": -0.1}), ("grpo", {"clip_ratio_c": 1.0}),
       ("sapo", {"tau_pos": 0.0}), ("reinforce", {"clip_ratio": 0.0}), ("grpo", {"kl_estimator": "k9"}),
       ("dapo", {"aggregation": "mean"}), ("dr_grpo", {"max_len": 0}), ("cispo", {"aggregation": "sum"}),
       ("dapo", {"clip_hgh": 0.3}), ("gspo_token", {"aggregation": "token-mean"}), ("simple_grpo", {"clip_low": 0.2})]


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_registered_loss_passes_with_its_defaults(name):
    params = {"max_len": 8} if name == "dr_grpo" else {}
    check_loss(name, **params)
    get_loss(name, **params)


@pytest.mark.parametrize("name,params", BAD)
def test_a_bad_hyperparameter_is_refused_by_the_check_as_by_the_build(name, params):
    with pytest.raises(ValueError) as built:
        get_loss(name, **params)
    with pytest.raises(ValueError) as checked:
        check_loss(name, **params)
    key = next(iter(params))
    assert key in str(checked.value) or str(params[key]) in str(checked.value), (str(checked.value), str(built.value))


def test_the_check_builds_nothing(monkeypatch):
    built = []

    class Recording(nn.Module):
        def __init__(self, clip: float = 0.1):
            built.append(clip)
            super().__init__()

    monkeypatch.setitem(losses.LOSSES, "recording", Recording)
    check_loss("recording", clip=0.3)
    assert built == []
    with pytest.raises(ValueError, match=r"rejected hyperparameters \['clp'\]"):
        check_loss("recording", clp=0.3)
    get_loss("recording", clip=0.3)
    assert built == [0.3]


def test_a_custom_loss_taking_any_keyword_is_checked_by_its_constructor_only():
    check_loss("torch.nn:Identity", anything=1)  # nn.Identity(*args, **kwargs): no names to refuse
    with pytest.raises(ValueError, match="unknown loss.name"):
        check_loss("dapoo")


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_every_constructor_runs_its_loss_check(name):
    """The constructors that once kept a bad value (the run failed at its first KL step) refuse it as the check does."""
    for refuse in (get_loss, check_loss):
        with pytest.raises(ValueError, match="unknown loss.kl_estimator 'k9'"):
            refuse(name, kl_estimator="k9")
