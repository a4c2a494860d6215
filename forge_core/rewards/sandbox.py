"""Reward functions with a time limit: scored in a child process that is replaced when an episode takes too long.

A user's reward (a verifier, a regex on model output) can hang; a thread cannot be stopped, a process can. The child
builds its own reward functions from the config entries (they need not be picklable) and scores one episode per
message; an episode that exceeds `timeout_s` scores the fallback and is counted, and the child is restarted.
"""

from __future__ import annotations

import logging
import multiprocessing as mp

from forge_core.rewards import CombinedReward, RewardScore

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0  # a cold child imports the reward modules on a possibly busy machine


def serve_rewards(conn, entries: list[dict], fallback: float) -> None:
    """Child process: build the rewards, then answer (prompt, response, target) with a RewardScore until None."""
    reward = CombinedReward.from_config(entries, fallback)
    conn.send("ready")
    while True:
        try:
            batch = conn.recv()
        except EOFError:  # the worker went away
            return
        if batch is None:
            return
        for episode in batch:  # one answer per episode as soon as it is scored: the parent times each one
            conn.send(reward.score(*episode))


class TimeLimitedReward:
    """Like CombinedReward.score, but each episode is scored in a child process within `timeout_s` seconds."""

    def __init__(self, entries: list[dict], timeout_s: float, fallback: float = 0.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"reward.timeout_s must be > 0 to time-limit rewards; got {timeout_s}")
        names = [name for name, _, _ in CombinedReward.from_config(entries, fallback).functions]  # validates here
        self.entries, self.timeout_s, self.fallback, self.names = entries, timeout_s, fallback, names
        self.weights = [float(e.get("weight", 1.0)) for e in entries]
        self.timeouts = 0
        self.proc = self.conn = None

    def _start(self) -> None:
        # not a plain fork: the worker has server threads whose locks a forked child could inherit held. The
        # forkserver is a clean single-threaded process started once; restarting a scorer from it takes ms.
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["forge_core.rewards.sandbox"])
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve_rewards, args=(child, self.entries, self.fallback), daemon=True,
                                name="reward-scorer")
        self.proc.start()
        child.close()
        # imports and building the rewards are not part of any episode's time limit
        if not self.conn.poll(STARTUP_TIMEOUT_S) or self.conn.recv() != "ready":
            self.close(kill=True)
            raise RuntimeError(f"the reward scorer process did not start within {STARTUP_TIMEOUT_S:.0f}s")

    def score(self, prompt: str, response: str, target: str) -> RewardScore:
        """Score one episode; a timeout scores `fallback` for every function, each with a timeout error."""
        return self.score_batch([(prompt, response, target)])[0]

    def score_batch(self, episodes: list[tuple[str, str, str]]) -> list[RewardScore]:
        """Score (prompt, response, target) triples: sent at once, each answer awaited within `timeout_s`; after a
        timeout the scorer is replaced and the episodes after the slow one are sent again."""
        scores: list[RewardScore] = []
        while len(scores) < len(episodes):
            if self.proc is None or not self.proc.is_alive():
                self._start()
            pending = episodes[len(scores):]
            self.conn.send(pending)
            for _, response, _ in pending:
                if not self.conn.poll(self.timeout_s):
                    scores.append(self._timed_out(response))
                    break
                scores.append(self.conn.recv())
        return scores

    def _timed_out(self, response: str) -> RewardScore:
        self.timeouts += 1
        log.warning("reward scoring took longer than reward.timeout_s=%.1fs: scoring %s and restarting the scorer "
                    "(response starts %r)", self.timeout_s, self.fallback, response[:80])
        self.close(kill=True)
        breakdown = dict.fromkeys(self.names, self.fallback)
        error = f"timed out after reward.timeout_s={self.timeout_s:g}s"
        return RewardScore(sum(w * self.fallback for w in self.weights), breakdown, dict.fromkeys(self.names, error))

    def close(self, kill: bool = False) -> None:
        """Stop the child process (politely unless `kill`)."""
        if self.proc is None:
            return
        if not kill and self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
        self.proc = self.conn = None
