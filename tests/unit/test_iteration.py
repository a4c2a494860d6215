"""The iteration spine with recording roles: the order of the calls, the schedule's cadences, pipelining and the
rollback path — what the in-process loop and the Prefect flow both rely on."""

from __future__ import annotations

import pytest

from forge_core.protocols import (
    GeneratorRole,
    PolicyTrainer,
    ReadyBatch,
    ReferenceScorer,
    RewardScorer,
    RolledBack,
    StepRecorder,
)
from forge_core.recipes.iteration import Roles, run_grpo_steps, run_iteration
from forge_core.schedule import Schedule
from forge_core.types import Completion, Episode, Group


class Log(list):
    def names(self, prefix: str = "") -> list[str]:
        return [e for e in self if e.startswith(prefix)]


def fake_batch(step: int, version: int) -> tuple[list[Group], dict]:
    """One group for `step`, sampled by policy `version`."""
    episode = Episode("p", "t", [1], Completion("x", [2], [-0.5], policy_version=version))
    return [Group(f"groups {step}", "t", [episode])], {"rollout/step": float(step)}


class FakeGenerator:
    def __init__(self, log: Log):
        self.log, self.version = log, 0  # the version it holds (what it samples with)

    def rollout(self, step):
        self.log.append(f"rollout {step}")
        return fake_batch(step, self.version)

    def rollout_ahead(self, step):
        self.log.append(f"ahead {step}")
        return ReadyBatch(fake_batch(step, self.version))

    def resume_ahead(self, step, count):
        self.log.append(f"resume_ahead {step} x{count}")
        return [ReadyBatch(fake_batch(step + i, self.version)) for i in range(count)]

    def sync(self, version):
        self.log.append(f"sync {version}")
        self.version = version
        return {}

    def evaluate(self, version):
        self.log.append(f"evaluate {version}")
        return {"eval/accuracy": 0.5}


class FakeScorer:
    def __init__(self, log: Log, what: str):
        self.log, self.what = log, what

    def score(self, step, groups):
        self.log.append(f"{self.what} {step}")
        return groups, {f"{self.what}/x": 1.0}


class FakeTrainer:
    def __init__(self, log: Log, lose_at: dict | None = None):
        self.log, self.lose_at = log, dict(lose_at or {})  # {("train"|"checkpoint", step): restored step}
        self.versions: list[int] = []  # the behaviour version of each trained batch

    def train(self, step, groups):
        assert [g.prompt for g in groups] == [f"groups {step}"]  # the batch of this very step
        self.versions.append(groups[0].episodes[0].completion.policy_version)
        if ("train", step) in self.lose_at:
            raise RolledBack(self.lose_at.pop(("train", step)))
        self.log.append(f"train {step}")
        return {"loss/loss": 0.0}

    def checkpoint(self, version, ahead):
        if ("checkpoint", version) in self.lose_at:
            raise RolledBack(self.lose_at.pop(("checkpoint", version)))
        self.log.append(f"checkpoint {version}" + "".join(f" +{b.result()[0][0].prompt[7:]}" for b in ahead))
        return f"step-{version}"


class FakeRecorder:
    def __init__(self, log: Log):
        self.log, self.steps = log, []

    def step(self, version, metrics):
        self.log.append(f"record {version}")
        self.steps.append(version)

    def samples(self, version, groups):
        self.log.append(f"samples {version}")

    def checkpoint(self, version, path):
        self.log.append(f"registered {path}")

    def rollback(self, step):
        self.log.append(f"rollback {step}")
        self.steps = [s for s in self.steps if s <= step]


def roles(log: Log, reference: bool = False, **trainer) -> Roles:
    return Roles(FakeGenerator(log), FakeScorer(log, "reward"), FakeTrainer(log, **trainer),
                 FakeScorer(log, "reference") if reference else None)


def test_the_fakes_are_the_roles():
    log = Log()
    r = roles(log, reference=True)
    assert isinstance(r.generator, GeneratorRole) and isinstance(r.reward, RewardScorer)
    assert isinstance(r.reference, ReferenceScorer) and isinstance(r.trainer, PolicyTrainer)
    assert isinstance(FakeRecorder(log), StepRecorder)


def test_one_on_policy_iteration_in_order():
    log = Log()
    ahead = run_iteration(roles(log, reference=True), Schedule(steps=4, eval_every=2, checkpoint_every=2), 1, [],
                          FakeRecorder(log))
    assert ahead == []
    assert log == ["rollout 1", "reward 1", "reference 1", "train 1", "sync 2", "evaluate 2", "record 2",
                   "samples 2", "checkpoint 2", "registered step-2"]  # samples: at each eval and the last step


def test_the_schedule_spaces_syncs_evals_and_checkpoints():
    log = Log()
    schedule = Schedule(steps=6, sync_every=3, eval_every=2, checkpoint_every=3, max_policy_age=3)
    recorder = FakeRecorder(log)
    run_grpo_steps(roles(log), schedule, 0, recorder)
    assert log.names("sync") == ["sync 2", "sync 3", "sync 4", "sync 6"]
    assert log.names("evaluate") == ["evaluate 2", "evaluate 4", "evaluate 6"]
    assert log.names("checkpoint") == ["checkpoint 3 +3", "checkpoint 6"]  # step 3's batch sampled ahead
    assert recorder.steps == [1, 2, 3, 4, 5, 6]


def test_pipelined_rollouts_start_before_the_step_trains():
    log = Log()
    run_grpo_steps(roles(log), Schedule(steps=3, max_policy_age=1), 0, FakeRecorder(log))
    assert log.names("rollout") == []  # every batch was started ahead
    assert [e for e in log if e.split()[0] in ("resume_ahead", "ahead", "train")] == [
        "resume_ahead 0 x1", "ahead 1", "train 0", "ahead 2", "train 1", "train 2"]


@pytest.mark.parametrize("where,step,restored", [("train", 3, 2), ("checkpoint", 4, 2)])
@pytest.mark.parametrize("pipelined", [False, True])
def test_a_rolled_back_trainer_supersedes_the_later_steps_and_redoes_them(where, step, restored, pipelined):
    log = Log()
    schedule = Schedule(steps=6, checkpoint_every=2, max_policy_age=int(pipelined))
    recorder = FakeRecorder(log)
    run_grpo_steps(roles(log, lose_at={(where, step): restored}), schedule, 0, recorder)
    assert f"rollback {restored}" in log
    assert recorder.steps == [1, 2, 3, 4, 5, 6]  # each step once, after the rollback
    assert log.names("train").count(f"train {restored}") == 2  # redone from the restored checkpoint
    if pipelined:
        assert log[log.index(f"rollback {restored}") + 1] == f"resume_ahead {restored} x1"


def test_a_run_resumed_at_its_last_step_does_nothing():
    log = Log()
    run_grpo_steps(roles(log), Schedule(steps=3, max_policy_age=1), 3, FakeRecorder(log))
    assert log == []


def test_max_policy_age_two_keeps_two_rollouts_in_flight_and_saves_both_with_checkpoints():
    log = Log()
    r = roles(log)
    schedule = Schedule(steps=6, checkpoint_every=2, max_policy_age=2)
    run_grpo_steps(r, schedule, 0, FakeRecorder(log))
    assert schedule.lookahead == 2
    assert log.names("resume_ahead") == ["resume_ahead 0 x2"]
    assert log.names("ahead") == ["ahead 2", "ahead 3", "ahead 4", "ahead 5"]  # step s starts s + 2
    assert log.names("checkpoint") == ["checkpoint 2 +2 +3", "checkpoint 4 +4 +5", "checkpoint 6"]
    assert r.trainer.versions == [0, 0, 0, 1, 2, 3]  # each batch sampled two versions before it trains
    assert all(s - v <= 2 for s, v in enumerate(r.trainer.versions))


def test_a_batch_older_than_max_policy_age_is_dropped_and_sampled_again():
    log = Log()
    r = roles(log)
    stale = [ReadyBatch(fake_batch(3, 0))]  # step 3 sampled by version 0: three versions old
    ahead = run_iteration(r, Schedule(steps=6, max_policy_age=2), 3, stale, FakeRecorder(log))
    assert "rollout 3" in log and r.trainer.versions == [0]  # sampled again, with what the generator holds now
    assert [b.result()[0][0].prompt for b in ahead] == ["groups 5"]


def test_lookahead_leaves_room_for_spaced_syncs():
    # a batch is at most max_policy_age old: sync_every - 1 versions between syncs plus the lookahead
    for age, every in [(1, 1), (2, 1), (3, 2), (4, 4), (3, 3)]:
        schedule = Schedule(steps=40, sync_every=every, max_policy_age=age)
        assert all(step - schedule.behaviour_version(step) <= age for step in range(40))
        assert schedule.lookahead == age - every + 1


def test_a_rollback_crosses_the_task_boundary_as_the_same_rolledback():
    import pickle

    from tasks.phases import answer_rollback, raise_rollback

    def lost():
        raise RolledBack(4)

    answer = pickle.loads(pickle.dumps(answer_rollback(lost)))  # what a task run hands back, even serialised
    assert isinstance(answer, RolledBack) and answer.step == 4
    with pytest.raises(RolledBack) as raised:
        raise_rollback(answer)
    assert raised.value.step == 4
    assert raise_rollback(answer_rollback(lambda: {"loss/pg": 0.5})) == {"loss/pg": 0.5}
