import pytest
import torch

from infra.weightsync import FSWeightStore, open_weight_store
from infra.weightsync.fs import split_aliases


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(10, 4, generator=g)
    return {"embed.weight": emb, "lm_head.weight": emb, "layer.bias": torch.randn(4, generator=g)}


def test_publish_fetch_round_trip_keeps_tied_weights(tmp_path):
    store = FSWeightStore(tmp_path)
    sd = state(0)
    store.publish(3, sd)
    version, got = store.fetch(3)
    assert version == 3 and set(got) == set(sd)
    for k in sd:
        assert torch.equal(got[k], sd[k])
    assert got["lm_head.weight"].data_ptr() == got["embed.weight"].data_ptr()  # still tied after loading


def test_latest_and_garbage_collection(tmp_path):
    store = FSWeightStore(tmp_path, keep=2)
    for v in range(5):
        store.publish(v, state(v))
    assert store.versions() == [3, 4]
    assert store.latest() == 4
    version, got = store.fetch()
    assert version == 4 and torch.equal(got["layer.bias"], state(4)["layer.bias"])
    with pytest.raises(KeyError, match="garbage-collected"):
        store.fetch(1)


def test_no_partial_files_left_behind(tmp_path):
    store = FSWeightStore(tmp_path)
    store.publish(0, state(0))
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_empty_store_and_bad_arguments(tmp_path):
    with pytest.raises(KeyError, match="empty"):
        FSWeightStore(tmp_path).fetch()
    with pytest.raises(ValueError, match="keep"):
        FSWeightStore(tmp_path, keep=0)
    with pytest.raises(ValueError, match="fs, shared, torchstore, broadcast"):
        open_weight_store("nccl", tmp_path)
    with pytest.raises(ValueError, match="start the workers through WorkerPool"):
        open_weight_store("broadcast", tmp_path)


def test_split_aliases_only_merges_true_views():
    a = torch.zeros(4)
    tensors, aliases = split_aliases({"a": a, "b": a, "c": torch.zeros(4), "d": a[:2]})
    assert aliases == {"b": "a"}
    assert set(tensors) == {"a", "c", "d"}


def test_publishing_after_a_rollback_drops_the_abandoned_versions(tmp_path):
    store = FSWeightStore(tmp_path, keep=2)
    for v in (4, 5, 6):
        store.publish(v, state(v))
    store.publish(1, state(1))  # resumed from an earlier checkpoint
    assert store.versions() == [1] and store.latest() == 1
    assert torch.equal(store.fetch()[1]["layer.bias"], state(1)["layer.bias"])


def test_streamed_file_is_plain_safetensors_for_every_dtype(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    from infra.weightsync.fs import SAFETENSORS_DTYPES

    state = {str(dtype): (torch.arange(12) % 5).to(dtype).reshape(3, 4) for dtype in SAFETENSORS_DTYPES}
    state["scalar"] = torch.tensor(3.5)
    state["strided"] = torch.arange(20.0).reshape(4, 5).t()  # not contiguous: written in logical order
    store = FSWeightStore(tmp_path)
    path = store.publish(4, state)
    plain = load_file(str(path))  # what vLLM's workers read
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata()["policy_version"] == "4"
    _, fetched = store.fetch(4)
    for name, t in state.items():
        assert plain[name].dtype == t.dtype and torch.equal(plain[name], t) and torch.equal(fetched[name], t)
    with pytest.raises(ValueError, match="weight 'c' has dtype torch.complex64"):
        store.publish(5, {"c": torch.zeros(2, dtype=torch.complex64)})
    assert store.versions() == [4]
