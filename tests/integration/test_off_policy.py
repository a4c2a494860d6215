"""Off-policy runs for real: bounded-staleness rollouts in flight while a (slowed) trainer trains on worker processes,
PPO mini-batches with TIS, and DAPO's refill rounds inside the Prefect flow."""

from __future__ import annotations

import time

import pytest

from flows.grpo import grpo_flow
from tests.integration.fault_helpers import TINY, recorded_metrics

pytestmark = pytest.mark.integration


def test_a_slowed_trainer_never_trains_on_a_batch_older_than_max_policy_age(monkeypatch):
    from tasks import phases

    real = phases.train

    def slow_train(run_id, step, groups):
        time.sleep(1.0)  # the rollouts ahead finish long before the trainer wants them
        return real(run_id, step, groups)

    monkeypatch.setattr(phases, "train", slow_train)
    overrides = {**TINY, "steps": 6, "max_policy_age": 2, "trainer.mini_batches": 4, "rollout_correction.mode": "tis",
                 "checkpoint.every": 3}
    summary = grpo_flow(overrides=overrides, run_name="slow-trainer-age-2")
    rows = recorded_metrics(summary["run_id"])
    assert [r["step"] for r in rows] == list(range(1, 7))
    ages = [r["rollout/policy_staleness"] for r in rows]
    assert max(ages) <= 2 and ages[2:] == [2.0] * 4  # two batches in flight from step 2 on
    for r in rows:
        hist = {k: v for k, v in r.items() if k.startswith("rollout/staleness_")}
        assert sum(hist.values()) == pytest.approx(1.0) and all(int(k.rsplit("_", 1)[1]) <= 2 for k in hist)
        assert r["rollout/stale_dropped"] == 0.0
        assert r["loss/optimizer_steps"] == 4.0
        assert r["rollout/is_weight_mean"] > 0 and "rollout/behaviour_kl_k3" in r
    assert any(r["loss/clip_frac_low_max"] + r["loss/clip_frac_high_max"] > 0 for r in rows)


def test_dynamic_sampling_refills_dropped_groups_in_the_flow():
    # tiny random weights: most groups score all-zero, so the refill rounds have work to do
    overrides = {**TINY, "steps": 2, "filter_groups": True, "fill_rounds": 3, "checkpoint.every": 0,
                 "eval.every": 0}
    summary = grpo_flow(overrides=overrides, run_name="flow-refills")
    rows = recorded_metrics(summary["run_id"])
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 1.0 <= r["rollout/fill_rounds"] <= 3.0
        assert r["rollout/sampled_groups"] >= TINY["prompts_per_step"]
        kept = r["rollout/sampled_groups"] - r["rollout/refill_dropped"]
        assert kept >= TINY["prompts_per_step"] or r["rollout/fill_rounds"] == 3.0  # full, or out of rounds
        assert "reward/mean" in r and "timing/reward" in r  # scored inside the rollout task, by the reward worker
