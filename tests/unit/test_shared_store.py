"""weightsync.backend shared: versions through shared-memory slots, across processes, never a torn copy."""

import multiprocessing as mp

import pytest
import torch

from infra.config_checks import load_config
from infra.weightsync import SharedWeightStore, open_weight_store


def state(seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(10, 4, generator=g).to(dtype)
    return {"embed.weight": emb, "lm_head.weight": emb, "layer.bias": torch.randn(4, generator=g).to(dtype),
            "steps": torch.tensor(seed)}


def test_round_trip_ring_of_slots_and_tied_weights(tmp_path):
    store = open_weight_store("shared", tmp_path, keep=2)
    for v in range(4):
        store.publish(v, state(v, torch.bfloat16))
    assert store.latest() == 3 and store.versions() == [2, 3]
    version, got = store.fetch()
    want = state(3, torch.bfloat16)
    assert version == 3 and all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
    assert got["lm_head.weight"].data_ptr() == got["embed.weight"].data_ptr()  # still tied
    got["layer.bias"].add_(1.0)  # a copy: the slot is untouched
    assert torch.equal(store.fetch(3)[1]["layer.bias"], want["layer.bias"])
    with pytest.raises(KeyError, match="weight version 1 is not in the store: slot 1 .* holds version 3"):
        store.fetch(1)
    store.clear()
    with pytest.raises(KeyError, match="is empty"):
        store.fetch()


def test_a_model_of_another_size_gets_a_new_slot_file(tmp_path):
    store = SharedWeightStore(tmp_path, keep=1)
    store.publish(0, {"w": torch.zeros(10)})
    store.publish(1, {"w": torch.ones(1000)})
    assert torch.equal(store.fetch(1)[1]["w"], torch.ones(1000))
    with pytest.raises(ValueError, match="weight 'c' has dtype torch.complex64"):
        store.publish(2, {"c": torch.zeros(2, dtype=torch.complex64)})


def publish_in_child(root: str, versions: int) -> None:
    torch.set_num_threads(1)
    store = SharedWeightStore(root, keep=2)
    for v in range(versions):
        store.publish(v, {"w": torch.full((256, 1024), float(v))})


def test_readers_in_another_process_see_whole_versions_or_a_key_error(tmp_path):
    """A writer in another process overwrites the two slots as fast as it can while this process reads: every
    fetch returns one version's tensor whole (all values equal to the version) or raises KeyError."""
    ctx = mp.get_context("spawn")
    writer = ctx.Process(target=publish_in_child, args=(str(tmp_path), 300))
    writer.start()
    reader = SharedWeightStore(tmp_path, keep=2)
    seen, missed = set(), 0
    while writer.is_alive() or not seen:
        latest = reader.latest()
        if latest is None:
            continue
        try:
            version, got = reader.fetch(latest)
        except KeyError:
            missed += 1
            continue
        assert torch.all(got["w"] == float(version)), f"torn copy of version {version}"
        seen.add(version)
    writer.join()
    assert writer.exitcode == 0 and len(seen) > 1
    assert reader.fetch(299)[1]["w"][0, 0] == 299.0


def test_shared_store_is_one_node_only():
    with pytest.raises(ValueError, match="weightsync.backend shared is one node's shared memory"):
        load_config("configs/grpo_math_tiny.yaml", {"weightsync.backend": "shared", "launcher": "slurm",
                                                      "slurm.nodes": 2})


def test_fetch_into_copies_straight_into_a_model_and_never_leaves_it_torn(tmp_path):
    from infra.weightsync import load_into_model
    from infra.weightsync.shared import OverwrittenWhileRead

    store = SharedWeightStore(tmp_path, keep=2)
    for v in (0, 1):
        store.publish(v, state(v))
    model = {k: torch.zeros_like(t).to(torch.bfloat16) for k, t in state(0).items() if k != "lm_head.weight"}
    model["lm_head.weight"] = model["embed.weight"]  # tied in the model too
    assert store.fetch_into(1, model) == 1
    want = state(1)
    assert all(torch.equal(model[k], want[k].to(torch.bfloat16)) for k in want)  # converted into the model's dtype

    class PublishDuringCopy(dict):
        """The trainer overwrites slot 0 (version 2) while version 0 is being copied out of it."""

        def __getitem__(self, name):
            if name == "layer.bias" and store.latest() == 1:
                store.publish(2, state(2))
            return super().__getitem__(name)

    torn = PublishDuringCopy(model)
    with pytest.raises(OverwrittenWhileRead, match="version 0 was overwritten while it was read.*refilled with "
                                                   "version 2") as caught:
        store.fetch_into(0, torn)
    assert caught.value.held == 2
    assert all(torch.equal(torn[k], state(2)[k].to(torch.bfloat16)) for k in want)  # whole, the version it names

    class Plain(torch.nn.Module):  # stores without fetch_into: fetch, then load_state_dict
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(3))

    fs = open_weight_store("fs", tmp_path / "fs")
    fs.publish(4, {"w": torch.ones(3)})
    plain = Plain()
    assert load_into_model(fs, 4, plain) == 4 and torch.equal(plain.w.detach(), torch.ones(3))
