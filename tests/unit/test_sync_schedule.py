"""When the generators get new weights (weightsync.sync_every) and which version each rollout samples with."""

from infra import components as C
from infra.config_checks import load_config


def config(**overrides):
    base = {"steps": 12, "eval.every": 6, "checkpoint.every": 5, "max_policy_age": 4}
    return C.run_schedule(load_config("configs/grpo_math_tiny.yaml", {**base, **overrides}))


def test_syncs_every_n_steps_and_at_each_eval_checkpoint_and_the_last_step():
    cfg = config(**{"weightsync.sync_every": 4})
    assert [v for v in range(1, 13) if cfg.syncs_at(v)] == [4, 5, 6, 8, 10, 12]
    assert not cfg.syncs_at(0)  # version 0 is the initial weights every worker starts from


def test_sync_every_one_syncs_every_version():
    cfg = config()
    assert all(cfg.syncs_at(v) for v in range(1, 13))
    assert [cfg.last_sync_at(v) for v in range(6)] == list(range(6))


def test_last_sync_is_the_newest_sync_point_at_or_before_a_version():
    cfg = config(**{"weightsync.sync_every": 4})
    assert [cfg.last_sync_at(v) for v in range(13)] == [0, 0, 0, 0, 4, 5, 6, 6, 8, 8, 10, 10, 12]


def test_rollouts_are_pinned_to_the_version_the_uninterrupted_schedule_samples_with():
    # sync_every > 1 needs max_policy_age >= 1, so it pipelines: step s samples while s - 1 trains
    spaced = config(**{"weightsync.sync_every": 4})
    assert [spaced.behaviour_version(s) for s in range(9)] == [0, 0, 0, 0, 0, 4, 5, 6, 6]
    assert [config().behaviour_version(s) for s in range(6)] == [0, 0, 0, 0, 0, 1]  # 4 rollouts ahead
    assert [config(max_policy_age=1).behaviour_version(s) for s in range(4)] == [0, 0, 1, 2]
    assert [config(max_policy_age=0).behaviour_version(s) for s in range(4)] == [0, 1, 2, 3]
