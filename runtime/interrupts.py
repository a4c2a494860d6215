"""Ctrl-C, told apart from the failures it causes: SIGINT also reaches the workers and the embedded Prefect server
(one process group), so the exception that ends a flow may be a lost worker or a refused API call, not the
KeyboardInterrupt itself. Entry points install `note_interrupt`; flows ask `interrupted_by(exc)`. A bug that
surfaces after Ctrl-C is still a bug: only connection-type failures count as the interrupt's fallout."""

from __future__ import annotations

INTERRUPTED: list[int] = []


def note_interrupt(signum, frame) -> None:
    """SIGINT handler: remember it, then behave as Python's default (KeyboardInterrupt)."""
    INTERRUPTED.append(signum)
    raise KeyboardInterrupt


# what Ctrl-C makes of the calls in flight: lost workers, a Prefect API that stopped with the process group
FALLOUT_TYPES = (ConnectionError, EOFError, TimeoutError, BrokenPipeError)
FALLOUT_NAMES = {"WorkerLost", "HTTPError", "TransportError", "ConnectError", "ReadError", "WriteError",
                 "RemoteProtocolError", "PrefectHTTPStatusError", "CancelledError", "TerminationSignal"}
FALLOUT_MESSAGES = ("Failed to reach API", "Cannot connect", "Connection refused")


def is_fallout(exc: BaseException) -> bool:
    """Whether `exc` is a failure Ctrl-C causes in the calls it cuts short (a connection, not a bug)."""
    names = {t.__name__ for t in type(exc).__mro__}
    return (isinstance(exc, FALLOUT_TYPES) or bool(names & FALLOUT_NAMES)
            or any(m in str(exc) for m in FALLOUT_MESSAGES))


def exception_chain(exc: BaseException | None) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or during (__cause__, else __context__), outermost first."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def interrupted_by(exc: BaseException) -> bool:
    """Whether `exc` ends the run because of Ctrl-C: a KeyboardInterrupt in its chain, or, after this process
    received SIGINT, a failure in the chain that Ctrl-C causes (`is_fallout`). Any other exception is a real failure
    even after Ctrl-C, and is reported as one."""
    chain = exception_chain(exc)
    if any(isinstance(e, KeyboardInterrupt) for e in chain):
        return True
    return bool(INTERRUPTED) and any(is_fallout(e) for e in chain)
