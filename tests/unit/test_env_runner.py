"""LocalEnvs: every environment is closed on every path, a batch's calls run at once under one deadline on a bounded
pool, and hung calls neither add up nor starve later turns."""

from __future__ import annotations

import gc
import threading

import pytest

from forge_core.data.problems import Problem
from forge_core.envs import EnvConfig, StepResult
from forge_core.envs.runner import LocalEnvs

TASK = Problem("q", "", "")


class Sessions:
    """Open sessions across the fake environments of a test (what an OpenEnv server would hold)."""

    def __init__(self):
        self.lock, self.open, self.opened = threading.Lock(), 0, 0

    def change(self, delta: int) -> None:
        with self.lock:
            self.open += delta
            self.opened += max(delta, 0)


class SessionEnv:
    """Holds a session from reset to close, like OpenEnvEnvironment; its step answers at once."""

    def __init__(self, sessions: Sessions):
        self.sessions, self.session = sessions, False
        self.closed = threading.Event()

    def reset(self, task, seed):
        self.end_session()
        self.sessions.change(+1)
        self.session = True
        return [{"role": "user", "content": "go"}], []

    def step(self, message):
        return StepResult(done=True, reward=1.0, info={"status": "completed"})

    def final_reward(self):
        return 0.5

    def end_session(self):
        if self.session:
            self.session = False
            self.sessions.change(-1)

    def close(self):
        self.end_session()
        self.closed.set()


class BrokenFinalEnv(SessionEnv):
    def final_reward(self):
        raise RuntimeError("final_reward broke")


class HungEnv(SessionEnv):
    """Its step blocks until the test releases it; `entered` counts the step calls that started."""

    entered: list[int] = []

    def __init__(self, sessions, key, release):
        super().__init__(sessions)
        self.key, self.release = key, release

    def step(self, message):
        HungEnv.entered.append(self.key)
        self.release.wait(120)
        return super().step(message)


def config(timeout_s: float = 5.0) -> EnvConfig:
    return EnvConfig(name="fake", step_timeout_s=timeout_s)


def test_a_retried_rollout_closes_the_sessions_of_its_first_attempt():
    sessions = Sessions()
    envs = LocalEnvs(config(), make=lambda key: SessionEnv(sessions))
    items = [(key, TASK, 7) for key in range(4)]
    envs.reset(items)
    envs.step([(key, {"role": "assistant", "content": "x"}) for key in range(2)])
    envs.reset(items)  # the rollout failed elsewhere and is played again from the start
    assert (sessions.opened, sessions.open) == (8, 4)
    assert envs.finish(list(range(4))) == [0.5] * 4 and sessions.open == 0


def test_closing_the_runner_closes_what_is_still_open():
    sessions = Sessions()
    with LocalEnvs(config(), make=lambda key: SessionEnv(sessions)) as envs:
        envs.reset([(key, TASK, 7) for key in range(3)])
        assert sessions.open == 3
    assert sessions.open == 0 and envs.pool.closed


def test_a_final_reward_that_raises_scores_zero_and_its_environment_is_still_closed():
    sessions = Sessions()
    made = {0: SessionEnv(sessions), 1: BrokenFinalEnv(sessions), 2: SessionEnv(sessions)}
    envs = LocalEnvs(config(), make=made.__getitem__)
    envs.reset([(key, TASK, 7) for key in made])
    assert envs.finish([0, 1, 2]) == [0.5, 0.0, 0.5]
    assert sessions.open == 0 and all(env.closed.is_set() for env in made.values())


class Rendezvous(SessionEnv):
    """Its step answers only once all `parties` steps have started: steps run one after another never meet."""

    def __init__(self, sessions, meeting: threading.Barrier):
        super().__init__(sessions)
        self.meeting = meeting

    def step(self, message):
        self.meeting.wait(120)
        return super().step(message)


def test_the_steps_of_a_turn_run_at_the_same_time():
    sessions, meeting = Sessions(), threading.Barrier(4)
    envs = LocalEnvs(config(timeout_s=30), make=lambda key: Rendezvous(sessions, meeting))
    envs.reset([(key, TASK, 7) for key in range(4)])
    results = envs.step([(key, {"role": "assistant", "content": "x"}) for key in range(4)])
    assert [r.info["status"] for r in results] == ["completed"] * 4
    envs.close()


def test_hung_steps_are_abandoned_at_their_deadlines_and_do_not_starve_the_next_turn():
    """4 hung environments on a pool of 2 threads: 2 steps start and hang; at their deadline they are abandoned and
    their threads replaced, so the 2 queued ones start and hang in turn: 4 hung calls cost 2 deadlines, not 4. The
    next turn's steps answer, and a hung environment is closed only when its step returns."""
    sessions, release = Sessions(), threading.Event()
    HungEnv.entered = []
    hung = {key: HungEnv(sessions, key, release) for key in range(4)}
    healthy = {key: SessionEnv(sessions) for key in range(4, 6)}
    envs = LocalEnvs(config(timeout_s=2), make={**hung, **healthy}.__getitem__, threads=2)
    envs.reset([(key, TASK, 7) for key in range(6)])
    results = envs.step([(key, {"role": "assistant", "content": "x"}) for key in hung])
    assert [r.info["status"] for r in results] == ["timeout"] * 4
    assert sorted(HungEnv.entered) == [0, 1, 2, 3] and envs.pool.spawned == 2 + 4  # one replacement per hung call
    later = envs.step([(key, {"role": "assistant", "content": "x"}) for key in healthy])
    assert [r.info["status"] for r in later] == ["completed"] * 2
    assert envs.finish(list(range(6))) == [0.0] * 4 + [0.5] * 2
    assert not any(env.closed.is_set() for env in hung.values()) and sessions.open == 4
    release.set()
    assert all(env.closed.wait(120) for env in hung.values()) and sessions.open == 0
    envs.close()


class SlowEnv(SessionEnv):
    """A step that takes 0.2 s: slow, never hung."""

    def step(self, message):
        threading.Event().wait(0.2)
        return super().step(message)


def test_calls_queued_behind_others_are_not_timed_out_for_waiting():
    """30 steps of 0.2 s on 2 threads under a 2 s timeout: the batch takes about 3 s, longer than the timeout, but
    each step takes a tenth of it from when it starts, so every one completes."""
    sessions = Sessions()
    envs = LocalEnvs(config(timeout_s=2), make=lambda key: SlowEnv(sessions), threads=2)
    envs.reset([(key, TASK, 7) for key in range(30)])
    results = envs.step([(key, {"role": "assistant", "content": "x"}) for key in range(30)])
    assert [r.info["status"] for r in results] == ["completed"] * 30
    envs.close()


def test_a_runner_dropped_without_close_stops_its_threads():
    envs = LocalEnvs(config(), make=lambda key: SessionEnv(Sessions()))
    pool = envs.pool
    del envs
    gc.collect()
    assert pool.closed


def test_a_reset_that_hangs_raises_and_its_environment_is_closed_when_it_returns():
    sessions, release = Sessions(), threading.Event()

    class HungReset(SessionEnv):
        def reset(self, task, seed):
            out = super().reset(task, seed)
            release.wait(120)
            return out

    env = HungReset(sessions)
    envs = LocalEnvs(config(timeout_s=5), make=lambda key: env)
    with pytest.raises(TimeoutError, match="env.reset took longer"):
        envs.reset([(0, TASK, 7)])
    envs.close()
    assert not env.closed.is_set()
    release.set()
    assert env.closed.wait(120) and sessions.open == 0


def test_an_env_worker_that_shuts_down_closes_its_open_environments():
    from infra.config_checks import load_config
    from workers.env import EnvWorker

    sessions = Sessions()
    worker = EnvWorker(load_config("configs/grpo_calculator_tool.yaml"), threads=1)
    worker.envs.make = lambda key: SessionEnv(sessions)
    worker.reset_envs([(key, TASK, 7) for key in range(3)])  # a rollout the controller abandoned mid-episode
    assert sessions.open == 3
    assert worker.shutdown() is True
    assert sessions.open == 0 and worker.envs.pool.closed
