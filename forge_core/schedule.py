"""Schedule: every "what happens at step s" question of a GRPO run, answered in one place.

Versions are 1-based: training step s (0-based) turns policy version s into s + 1. The iteration spine, the trainer
(when to publish), the rollout tasks (which version to sample with) and recovery (what the generators held) all ask
this object instead of recomputing cadences from config keys.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """The cadences of one run: steps, weight syncs, evaluations, checkpoints and how far rollouts run ahead."""

    steps: int
    sync_every: int = 1  # the generators load every N-th version (plus every eval, checkpoint and the last one)
    eval_every: int = 0  # 0: no evaluation during training
    checkpoint_every: int = 0  # 0: no checkpoints during training
    max_policy_age: int = 0  # 0: strictly on-policy; N >= 1: a batch may be sampled by a version up to N old

    @property
    def lookahead(self) -> int:
        """How many rollouts run ahead of the trainer: step s starts the rollout of s + lookahead, sampled with the
        newest weights the generators hold (at most sync_every - 1 versions behind s), so a batch is at most
        lookahead + sync_every - 1 = max_policy_age versions old when it trains. 0: on-policy."""
        if self.max_policy_age < 1:
            return 0
        return max(1, self.max_policy_age - self.sync_every + 1)

    @property
    def pipelined(self) -> bool:
        """Whether rollouts of later steps run while a step trains."""
        return self.lookahead >= 1

    def samples_ahead(self, step: int) -> bool:
        """Whether step `step` starts the rollout of step + lookahead before it trains."""
        return self.pipelined and step + self.lookahead < self.steps

    def ahead_at(self, step: int) -> int:
        """How many batches are in flight when step `step` begins (those of step, step + 1, …)."""
        return max(0, min(self.lookahead, self.steps - step))

    def oldest_allowed(self, step: int) -> int:
        """The oldest behaviour version step `step` trains on; older batches are dropped and sampled again."""
        return step - self.max_policy_age

    def evaluates_at(self, version: int) -> bool:
        """Whether the generators are evaluated once they hold `version`."""
        return bool(self.eval_every) and version > 0 and version % self.eval_every == 0

    def checkpoints_at(self, version: int) -> bool:
        """Whether the trainer saves a checkpoint after producing `version`."""
        return bool(self.checkpoint_every) and version > 0 and version % self.checkpoint_every == 0

    def syncs_at(self, version: int) -> bool:
        """Whether the trainer publishes `version` and the generators load it: every sync_every versions, each eval
        step (evaluation uses the generators), each checkpoint step (so a resume restores what the generators held)
        and the last step."""
        if version < 1:
            return False
        every = (self.sync_every, self.eval_every, self.checkpoint_every)
        return version == self.steps or any(n and version % n == 0 for n in every)

    def last_sync_at(self, version: int) -> int:
        """The newest version the generators hold once the trainer reached `version` (0: the initial weights)."""
        while version > 0 and not self.syncs_at(version):
            version -= 1
        return max(version, 0)

    def behaviour_version(self, step: int) -> int:
        """The version step `step`'s rollout samples with in the uninterrupted run: the newest one synced by
        `step - lookahead` (sampled while that step trains; on-policy: by `step`). Pinning it makes a recovered
        run sample exactly as an uninterrupted one."""
        return self.last_sync_at(max(step - self.lookahead, 0))
