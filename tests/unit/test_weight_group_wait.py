"""The pool waits for a forming weight-broadcast group by polling every member: one member that could not form is
reported at once, not after another member has waited out the whole rendezvous timeout for it (CI hung 10 min)."""

import pytest

from workers.pool import await_members
from workers.protocol import WorkerCallError


class MemberStandIn:
    """A generator's client as await_members sees it: `await_weight_group(timeout_s)` answers False while forming,
    True once formed, or raises what the worker raised. A stand-in for the RPC: the real call is tested in
    tests/integration/test_broadcast_pool.py."""

    def __init__(self, answers: list):
        self.answers, self.calls = list(answers), []

    def call(self, method: str, *args):
        assert method == "await_weight_group"
        self.calls.append(args)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def failed() -> WorkerCallError:
    return WorkerCallError("generator-1", "await_weight_group", "RuntimeError", "could not form", "")


def test_a_member_that_failed_is_reported_while_another_still_waits():
    waiting, broken = MemberStandIn([False]), MemberStandIn([False, failed()])  # the first would wait forever
    with pytest.raises(WorkerCallError, match="could not form"):
        await_members([waiting, broken], patience_s=600, poll_s=0.0)
    assert all(args == (0.0,) for args in waiting.calls + broken.calls)  # polls only, never a blocking wait
    assert len(broken.calls) == 2


def test_members_are_polled_until_all_have_formed():
    slow, fast = MemberStandIn([False, False, True]), MemberStandIn([True])
    await_members([slow, fast], patience_s=600, poll_s=0.0)
    assert len(slow.calls) == 3 and len(fast.calls) == 1  # a formed member is not asked again


def test_after_the_patience_the_rest_are_waited_for_in_full():
    forming = MemberStandIn([False])
    await_members([forming], patience_s=0.0, poll_s=0.0)
    assert forming.calls == [()]  # the blocking call, which raises the member's own timeout
