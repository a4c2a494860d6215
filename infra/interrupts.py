"""Ctrl-C, told apart from the failures it causes: SIGINT also reaches the workers and the embedded Prefect server
(one process group), so the exception that ends a flow may be a lost worker or a refused API call, not the
KeyboardInterrupt itself. Entry points install `note_interrupt`; flows ask `interrupted_by(exc)`."""

from __future__ import annotations

INTERRUPTED: list[int] = []


def note_interrupt(signum, frame) -> None:
    """SIGINT handler: remember it, then behave as Python's default (KeyboardInterrupt)."""
    INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def interrupted_by(exc: BaseException) -> bool:
    """Whether `exc` ends the run because of Ctrl-C: a KeyboardInterrupt in its chain, or any exception after
    this process received SIGINT."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return bool(INTERRUPTED)
