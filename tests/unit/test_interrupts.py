"""Ctrl-C is recognised behind the failures it causes (a lost worker, a refused API call)."""

import pytest

from runtime import interrupts


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


@pytest.mark.parametrize("api_url,retries_after", [(None, 0), ("http://127.0.0.1:4200/api", 5)])
def test_ctrl_c_stops_api_retries_only_against_the_embedded_server(api_url, retries_after, monkeypatch):
    """The embedded server stops with the same Ctrl-C: retrying it only kept the CLI alive ~75 s after the run had
    stopped. A server of the user's keeps its retries."""
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from cli.main import on_ctrl_c

    monkeypatch.setattr(interrupts, "INTERRUPTED", [])
    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 5, PREFECT_API_URL: api_url}):
        with pytest.raises(KeyboardInterrupt):
            on_ctrl_c(2, None)
        assert PREFECT_CLIENT_MAX_RETRIES.value() == retries_after
