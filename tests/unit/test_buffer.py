import random

import pytest

from forge_core.buffer import ReplayBuffer, evict_stale, is_fresh, sample_freshest, sample_uniform
from forge_core.types import Completion, Episode, Group


def group(version, tag=""):
    return Group(tag, "t", [Episode(tag, "t", [1], Completion("x", [1], [0.0], policy_version=version))])


def test_freshness_rule():
    assert is_fresh(5, 5, 0) and not is_fresh(4, 5, 0) and is_fresh(4, 5, 1) and not is_fresh(3, 5, 1)


def test_evict_and_sample_fifo():
    buf = ReplayBuffer(max_policy_age=1)
    buf.add([group(0, "a"), group(1, "b"), group(2, "c"), group(2, "d")])
    batch = buf.sample(2, current_version=2)
    assert [g.prompt for g in batch] == ["b", "c"] and buf.evicted == 1 and len(buf) == 1


def test_on_policy_buffer_drops_everything_older():
    kept, dropped = evict_stale([group(0), group(1), group(3)], 3, 0)
    assert dropped == 2 and len(kept) == 1


def test_uniform_and_freshest_samplers():
    items = [group(v, str(v)) for v in range(6)]
    batch, rest = sample_uniform(items, 3, random.Random(1))
    assert len(batch) == 3 and len(rest) == 3 and {g.prompt for g in batch + rest} == {str(v) for v in range(6)}
    batch, _ = sample_freshest(items, 2)
    assert [g.prompt for g in batch] == ["5", "4"]


def test_capacity_and_state_round_trip():
    buf = ReplayBuffer(max_policy_age=10, sampler="uniform", capacity=3, seed=4)
    buf.add([group(v, str(v)) for v in range(5)])
    assert len(buf) == 3 and buf.evicted == 2
    state = buf.state_dict()
    first = [g.prompt for g in buf.sample(2, 4)]
    other = ReplayBuffer(max_policy_age=10, sampler="uniform", capacity=3)
    other.load_state_dict(state)
    assert [g.prompt for g in other.sample(2, 4)] == first


def test_bad_settings():
    with pytest.raises(ValueError, match="sampler 'lifo'"):
        ReplayBuffer(sampler="lifo")
    with pytest.raises(ValueError, match="max_policy_age"):
        ReplayBuffer(max_policy_age=-1)
