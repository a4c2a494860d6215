"""Ctrl-C is recognised behind the failures it causes (a lost worker, a refused API call)."""

import pytest

from infra import interrupts


def test_a_keyboard_interrupt_in_the_chain_is_an_interrupt(monkeypatch):
    monkeypatch.setattr(interrupts, "INTERRUPTED", [])
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise ConnectionError("API gone") from None  # `from None` keeps __context__
    except ConnectionError as exc:
        assert interrupts.interrupted_by(exc)
    assert not interrupts.interrupted_by(RuntimeError("a real failure"))


def test_connection_failures_after_sigint_are_the_interrupt_but_bugs_are_not(monkeypatch):
    from workers.protocol import WorkerLost

    monkeypatch.setattr(interrupts, "INTERRUPTED", [])
    assert not interrupts.interrupted_by(WorkerLost("trainer-0", "1", "connection dropped"))
    with pytest.raises(KeyboardInterrupt):
        interrupts.note_interrupt(2, None)
    assert interrupts.interrupted_by(WorkerLost("trainer-0", "1", "connection dropped"))
    assert interrupts.interrupted_by(ConnectionRefusedError("API gone"))
    assert interrupts.interrupted_by(RuntimeError("Cannot create flow run. Failed to reach API at http://x/api"))
    try:
        try:
            raise ConnectionResetError("peer gone")
        except ConnectionResetError as inner:
            raise RuntimeError("train_step failed") from inner
    except RuntimeError as exc:
        assert interrupts.interrupted_by(exc)  # the fallout anywhere in the chain
    assert not interrupts.interrupted_by(ValueError("loss.clip_low must be > 0"))
    assert not interrupts.interrupted_by(ZeroDivisionError("a bug"))
