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


def test_any_failure_after_sigint_is_an_interrupt(monkeypatch):
    monkeypatch.setattr(interrupts, "INTERRUPTED", [])
    with pytest.raises(KeyboardInterrupt):
        interrupts.note_interrupt(2, None)
    assert interrupts.interrupted_by(RuntimeError("worker lost after Ctrl-C reached it"))
