"""Two tasks that lose the same node at once (a pipelined rollout and the train task) recover it once, one after
the other. The pool here is a stand-in that records restarts (the real pool: tests/integration/test_faults.py,
test_two_roles_killed_at_once_recover_exactly[trainer+generator-pipelined])."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from tasks.context import RunContext
from tasks.recovery import recover_role


class RecordingPool:
    """Jobs per role; restart replaces a role's job after a pause in which a second restart would overlap."""

    def __init__(self):
        self.jobs = {"trainer": "t1", "generator": "g1"}
        self.dead = {"trainer", "generator"}
        self.active, self.overlaps, self.restarts = 0, 0, []

    def job_ids(self, role):
        return {self.jobs[role]}

    def dead_roles(self):
        return set(self.dead)

    def restart(self, role):
        self.active += 1
        self.overlaps += self.active > 1
        time.sleep(0.2)
        self.jobs[role] = self.jobs[role][0] + str(int(self.jobs[role][1:]) + 1)
        self.dead.discard(role)
        self.restarts.append(role)
        self.active -= 1

    def call(self, role, method, *args):
        return {"step": 4} if method == "health" else 4

    def call_all(self, role, method, *args):
        return [4]

    def describe_losses(self, role):
        return None  # no Slurm verdicts here (tests/integration/test_slurm_nodes.py)


def test_two_tasks_losing_one_node_recover_it_once_and_never_at_the_same_time(monkeypatch):
    pool = RecordingPool()
    ctx = SimpleNamespace(pool=pool, recoveries=[], records=None, cfg=None, recovery_lock=threading.Lock(),
                          latest_checkpoint=lambda: None)
    assert "recovery_lock" in RunContext.__dataclass_fields__  # the real context carries the same lock
    monkeypatch.setattr("tasks.recovery.restore_state", lambda ctx, restarted: 4)
    results = {}
    threads = [threading.Thread(target=lambda r=role, j=job: results.setdefault(r, recover_role(ctx, r, "node lost",
                                                                                              job_id=j)))
               for role, job in (("trainer", "t1"), ("generator", "g1"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.overlaps == 0
    assert sorted(pool.restarts) == ["generator", "trainer"]  # each once: the second task found its job replaced
    assert results == {"trainer": 4, "generator": 4}
    assert sorted(r["role"] for r in ctx.recoveries) == ["generator", "trainer"]
