"""TorchStoreWeightStore against a CPU stand-in of torchstore (tests/unit/torchstore_stand_in.py)."""

import sys

import pytest
import torch

from infra.weightsync import open_weight_store
from tests.unit.torchstore_stand_in import make_stand_in


def test_torchstore_store_shares_versions_and_latest_between_clients(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchstore", make_stand_in())
    trainer, generator = open_weight_store("torchstore"), open_weight_store("torchstore")
    assert generator.latest() is None
    with pytest.raises(KeyError, match="nothing was published"):
        generator.fetch()
    weights = {"w": torch.arange(4.0)}
    trainer.publish(1, weights)
    trainer.publish(2, {"w": weights["w"] + 1})
    assert generator.latest() == 2  # another client sees the trainer's latest version
    version, state = generator.fetch()
    assert version == 2 and torch.equal(state["w"], weights["w"] + 1)
    assert torch.equal(generator.fetch(1)[1]["w"], weights["w"])
    with pytest.raises(KeyError, match="weight version 7 is not in torchstore"):
        generator.fetch(7)


def test_torchstore_missing_package_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchstore", None)  # import raises ImportError
    with pytest.raises(ValueError, match="weightsync.backend: fs"):
        open_weight_store("torchstore")
