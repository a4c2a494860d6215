"""The environments of a batch of episodes, behind one batched interface: `reset`, `step` and `finish` take the
episodes' keys. LocalEnvs runs them in this process; workers/env.py serves the same calls from env worker
processes (workers/episodes.py: RemoteEnvs), so the token layer plays episodes the same way wherever they run.

The calls of one batch run at once on a bounded pool of threads (env.step_threads); each call has env.step_timeout_s
from the moment a thread starts it (time spent queued behind other calls does not count, so a batch larger than the
pool never times out calls that are merely waiting). A hung call is abandoned at its deadline and its thread
replaced: N hung environments cost ceil(N / step_threads) timeouts, not N. A failing or hanging step, or final_reward, never
raises here: it ends that episode with status `error` or `timeout` (final reward 0). Every environment is closed:
when its episode finishes, when a retried rollout resets its key again, when the runner closes, and one whose call
hung when that call returns.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from forge_core.envs.base import EnvConfig, Environment, Message, StepResult

log = logging.getLogger(__name__)

class StepPool:
    """`size` daemon threads running environment calls. A call abandoned at its deadline keeps its thread (a hung
    environment cannot be interrupted from Python, only abandoned) and a new thread takes its place, so hangs never
    starve later calls. Daemon threads, because concurrent.futures.ThreadPoolExecutor joins its threads at
    interpreter exit: one hung env.step would keep the process from exiting."""

    def __init__(self, size: int, name: str = "env"):
        if size < 1:
            raise ValueError(f"env.step_threads must be >= 1, got {size}")
        self.size, self.name = size, name
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.abandoned: set[Future] = set()  # running calls given up on: their threads exit when they return
        self.spawned = 0  # threads started, replacements included
        self.closed = False
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        self.spawned += 1
        threading.Thread(target=self._serve, daemon=True, name=f"{self.name}-{self.spawned}").start()

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            future, fn, args = job
            future.started_at = time.monotonic()  # the call's deadline counts from here (call_all)
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while queued (its runner closed)
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which ends the episode with it
                future.set_exception(exc)
            with self.lock:
                if future in self.abandoned:  # a replacement took this thread's place while the call hung
                    self.abandoned.discard(future)
                    return

    def submit(self, fn: Callable, *args: Any) -> Future:
        if self.closed:
            raise RuntimeError("the environments' thread pool is closed")
        future: Future = Future()
        self.jobs.put((future, fn, args))
        return future

    def abandon(self, future: Future) -> None:
        """Give up on a call past its deadline: cancelled if it has not started, else its thread is replaced."""
        if future.cancel():
            return
        with self.lock:
            if future.done():
                return
            self.abandoned.add(future)
            if not self.closed:
                self._spawn()

    def close(self) -> None:
        """Stop the idle threads (hung ones stop when their call returns)."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for _ in range(self.size):
            self.jobs.put(None)


@dataclass
class Outcome:
    """One call run under a deadline: its value, or the exception it raised, or the call still running (timed out;
    `running` completes when it returns, or never)."""

    value: Any = None
    error: BaseException | None = None
    running: Future | None = None

    @property
    def timed_out(self) -> bool:
        return self.running is not None


def call_all(pool: StepPool, calls: list[tuple[Callable, tuple]], timeout_s: float) -> list[Outcome]:
    """Every (fn, args) submitted at once; a call still running timeout_s after a thread started it is abandoned
    (queued time does not count)."""
    futures = [pool.submit(fn, *args) for fn, args in calls]
    pending, late = set(futures), set()
    while pending:
        wait(pending, timeout=seconds_to_next_deadline(pending, timeout_s), return_when=FIRST_COMPLETED)
        now = time.monotonic()
        expired = {f for f in pending if not f.done() and now - getattr(f, "started_at", now) >= timeout_s}
        for future in expired:
            pool.abandon(future)
        late |= expired
        pending = {f for f in pending if not f.done()} - expired
    return [outcome_of(future, future in late) for future in futures]


QUEUED_POLL_S = 0.05  # while calls are queued, look this often: one may start (and its deadline with it) meanwhile


def seconds_to_next_deadline(pending: set[Future], timeout_s: float) -> float:
    """How long to wait for `pending`: until the earliest started call's deadline, at most QUEUED_POLL_S while
    some call is still queued."""
    starts = [f.started_at for f in pending if hasattr(f, "started_at")]
    wait_s = max(0.0, min(starts) + timeout_s - time.monotonic()) if starts else timeout_s
    return min(wait_s, QUEUED_POLL_S) if len(starts) < len(pending) else wait_s


def outcome_of(future: Future, timed_out: bool) -> Outcome:
    """The Outcome of a finished call, or of one abandoned at its deadline."""
    if timed_out:
        return Outcome(running=future)
    if future.exception() is not None:
        return Outcome(error=future.exception())
    return Outcome(value=future.result())


def close_quietly(env: Environment) -> None:
    """env.close(), a failure logged (closing a broken environment must not end the run)."""
    try:
        env.close()
    except Exception as exc:  # noqa: BLE001 - user environment code
        log.warning("environment close failed: %s: %s", type(exc).__name__, exc)


def final_reward_of(env: Environment) -> float:
    return float(env.final_reward())


class LocalEnvs:
    """One environment per episode key, built from the env section (or by `make(key)`), in this process; `close()`
    (or a `with` block) closes what is still open and stops the threads."""

    def __init__(self, config: EnvConfig, make: Callable[[int], Environment] | None = None,
                 threads: int | None = None):
        self.config, self.make = config, make
        self.envs: dict[int, Environment] = {}
        self.failed: set[int] = set()  # episodes whose environment errored or hung: no final reward, no more calls
        self.hung: dict[int, Future] = {}  # episodes with a call still running past its deadline
        self.pool = StepPool(threads if threads is not None else config.step_threads)
        weakref.finalize(self, self.pool.close)  # a runner dropped without close() still stops its idle threads

    def __enter__(self) -> LocalEnvs:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def call_all(self, calls: list[tuple[Callable, tuple]]) -> list[Outcome]:
        return call_all(self.pool, calls, self.config.step_timeout_s)

    def reset(self, items: list[tuple[int, Any, int]]) -> list[tuple[list[Message], list[dict]]]:
        """(messages, tools) of each (key, task, seed); an environment that cannot start raises (a broken
        environment or its server: nothing can be played). A key that is still open (a retried rollout plays its
        episodes again from the start) has its old environment closed first."""
        from forge_core.envs import make_environment  # the registry imports the environments

        self.retire([key for key, _, _ in items])
        for key, _, _ in items:
            self.envs[key] = self.make(key) if self.make else make_environment(self.config)
        outcomes = self.call_all([(self.envs[key].reset, (task, seed)) for key, task, seed in items])
        for (key, _, _), outcome in zip(items, outcomes, strict=True):
            if outcome.timed_out:
                self.hung[key] = outcome.running
        for outcome in outcomes:
            if outcome.timed_out:
                raise TimeoutError(f"env.reset took longer than env.step_timeout_s = {self.config.step_timeout_s} s")
            if outcome.error is not None:
                raise outcome.error
        return [(list(messages), list(tools or [])) for messages, tools in (o.value for o in outcomes)]

    def step(self, items: list[tuple[int, Message]]) -> list[StepResult]:
        """Each episode's environment answers its assistant message, all at once under one deadline; a crash or a
        hang ends that episode."""
        outcomes = self.call_all([(self.envs[key].step, (message,)) for key, message in items])
        return [self.step_result(key, outcome) for (key, _), outcome in zip(items, outcomes, strict=True)]

    def step_result(self, key: int, outcome: Outcome) -> StepResult:
        if outcome.timed_out:
            self.failed.add(key)
            self.hung[key] = outcome.running
            return StepResult(done=True, info={"status": "timeout", "error": f"env.step took longer than "
                                                f"env.step_timeout_s = {self.config.step_timeout_s} s"})
        if outcome.error is None:
            return outcome.value
        if not isinstance(outcome.error, Exception):  # KeyboardInterrupt, SystemExit: not the episode's to end
            raise outcome.error
        exc = outcome.error
        log.warning("environment step failed (episode ends as error): %s: %s", type(exc).__name__, exc)
        self.failed.add(key)
        return StepResult(done=True, info={"status": "error", "error": f"{type(exc).__name__}: {exc}"})

    def finish(self, keys: list[int]) -> list[float]:
        """Each episode's final reward (0 for one whose environment failed, or whose final_reward raised or hung);
        its environment is closed."""
        live = [key for key in keys if key not in self.failed]
        outcomes = dict(zip(live, self.call_all([(final_reward_of, (self.envs[key],)) for key in live]),
                            strict=True))
        rewards = [self.reward_of(key, outcomes[key]) if key in outcomes else 0.0 for key in keys]
        self.retire(keys)
        return rewards

    def reward_of(self, key: int, outcome: Outcome) -> float:
        if outcome.timed_out:
            self.hung[key] = outcome.running
            log.warning("env final_reward took longer than env.step_timeout_s = %s s (reward 0)",
                        self.config.step_timeout_s)
            return 0.0
        if outcome.error is not None:
            if not isinstance(outcome.error, Exception):
                raise outcome.error
            log.warning("env final_reward failed (reward 0): %s: %s", type(outcome.error).__name__, outcome.error)
            return 0.0
        return outcome.value

    def retire(self, keys: list[int]) -> None:
        """Close the environments of `keys`: now, or, for one whose call hung, when that call returns."""
        closing = []
        for key in keys:
            self.failed.discard(key)
            env = self.envs.pop(key, None)
            running = self.hung.pop(key, None)
            if env is None:
                continue
            if running is not None:
                running.add_done_callback(lambda _, env=env: close_quietly(env))
            else:
                closing.append(env)
        for outcome in self.call_all([(close_quietly, (env,)) for env in closing]):
            if outcome.timed_out:
                log.warning("env close took longer than env.step_timeout_s = %s s (abandoned)",
                            self.config.step_timeout_s)

    def close(self) -> None:
        """Close every environment still open, then stop the threads."""
        try:
            self.retire(list(self.envs))
        finally:
            self.pool.close()
