"""The controller's side of a worker: `call(method, *args, timeout=…)` with dead-worker detection.

A call waits for the reply in short polls; between polls it checks that the worker is still alive (its pid on this
host, its submitit job anywhere). A dropped connection, a dead job or no reply within the timeout raises WorkerLost.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from multiprocessing.connection import AuthenticationError, Connection

from workers.protocol import (
    HANDSHAKE_TIMEOUT_S,
    Rendezvous,
    WorkerCallError,
    WorkerLost,
    connect_authenticated,
    pid_alive,
    receive_message,
    require_authkey,
    send_message,
)

log = logging.getLogger(__name__)

# a worker's end of the connection closed (EOF, reset) or no longer listening: its process has exited (a cut-off one
# says nothing at all)
CLOSED_BY_PEER = (EOFError, ConnectionResetError, ConnectionRefusedError)


def _accepts_force(job) -> bool:
    import inspect

    return "force_check" in inspect.signature(job.done).parameters


class WorkerClient:
    """A connection to one worker. Safe for concurrent callers: calls from several threads take turns on the one
    connection (the worker runs one call at a time anyway), so no thread can read another's reply."""

    def __init__(self, name: str, rendezvous: Rendezvous, authkey: bytes, job=None, call_timeout_s: float = 900.0,
                 poll_s: float = 0.2):
        self.name, self.rendezvous, self.job = name, rendezvous, job
        self._authkey = require_authkey(authkey, f"client of {name}")
        self.handshake_timeout_s = HANDSHAKE_TIMEOUT_S
        self._lock = threading.RLock()
        self.call_timeout_s, self.poll_s = call_timeout_s, poll_s
        self.conn: Connection | None = None
        self.last_health: dict = {}
        self.job_check_s = 5.0
        self._job_done_takes_force = job is not None and hasattr(job, "done") and _accepts_force(job)
        self._last_forced_check = time.monotonic()
        self.last_contact: float | None = None  # when a ping was last answered (start_pinging)
        self.peer_closed = False  # the worker's side closed or refused the connection: its process is gone
        self.silent_after_s: float | None = None
        self._stop_pinging = threading.Event()

    @property
    def role(self) -> str:
        return self.rendezvous.role

    @property
    def job_id(self) -> str:
        return str(getattr(self.job, "job_id", "inline"))

    def connect(self) -> None:
        """Connect and authenticate within `handshake_timeout_s`; WorkerLost when the worker does not answer."""
        with self._lock:
            try:
                self.conn = connect_authenticated(self.rendezvous.address, self._authkey, self.handshake_timeout_s)
            except (OSError, EOFError, AuthenticationError) as exc:
                self.peer_closed |= isinstance(exc, CLOSED_BY_PEER)
                raise self._lost(f"cannot connect to {self.rendezvous.host}:{self.rendezvous.port} "
                                 f"({type(exc).__name__}: {exc})") from exc

    def call(self, method: str, *args, timeout: float | None = None, **kwargs):
        """Run `method` on the worker and return its result; raises WorkerLost or WorkerCallError. A caller on
        another thread waits for the call in progress to finish first."""
        with self._lock:
            return self._call(method, args, kwargs, self.call_timeout_s if timeout is None else timeout)

    def _call(self, method: str, args: tuple, kwargs: dict, timeout: float):
        if self.conn is None:
            self.connect()
        try:
            send_message(self.conn, (method, args, kwargs))
            deadline = time.monotonic() + timeout
            while not self.conn.poll(self.poll_s):
                reason = self.death_reason()
                if reason:
                    raise self._lost(reason)
                if time.monotonic() > deadline:
                    raise self._lost(f"no reply to {method} within {timeout:.0f}s")
            reply = receive_message(self.conn)
        except (EOFError, ConnectionError, OSError) as exc:
            self.peer_closed |= isinstance(exc, CLOSED_BY_PEER)
            raise self._lost(f"connection dropped during {method} ({type(exc).__name__}: "
                             f"{self.death_reason() or exc})") from exc
        if reply[0] == "ok":
            if method == "health":
                self.last_health = reply[1]
            return reply[1]
        _, type_name, message, tb = reply
        raise WorkerCallError(self.name, method, type_name, message, tb)

    def start_pinging(self, silent_after_s: float, interval_s: float = 2.0) -> None:
        """Ping the worker every `interval_s` on a connection of its own (answered without waiting for a call in
        progress); a worker silent for `silent_after_s` is dead (a partitioned node). The worker exits by itself
        after its own, shorter, silence (workers.heartbeat_stale_s), so it is gone before it is replaced."""
        self.silent_after_s, self.last_contact = silent_after_s, time.monotonic()
        threading.Thread(target=self._ping_loop, args=(interval_s,), daemon=True, name=f"ping-{self.name}").start()

    def _ping_loop(self, interval_s: float) -> None:
        conn = None
        while not self._stop_pinging.wait(interval_s):
            try:
                conn = conn or connect_authenticated(self.rendezvous.address, self._authkey, interval_s)
                send_message(conn, ("ping", (), {}))
                if not conn.poll(interval_s):
                    raise TimeoutError(f"no answer within {interval_s:.0f}s")
                receive_message(conn)
                self.last_contact = time.monotonic()
            except (OSError, EOFError, AuthenticationError) as exc:  # silence is the signal; death_reason says it
                log.debug("ping of %s failed: %s", self.name, exc)
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def death_reason(self) -> str | None:
        """Why the worker is dead, or None while it looks alive. A finished job is dead whatever its state
        string says: submitit reports a SIGKILLed local job as FINISHED."""
        rv = self.rendezvous
        if rv.host in ("127.0.0.1", "localhost", socket.gethostname()) and not pid_alive(rv.pid):
            return f"process {rv.pid} is gone"
        if self.last_contact is not None and time.monotonic() - self.last_contact > self.silent_after_s:
            return (f"no answer to pings for {time.monotonic() - self.last_contact:.0f}s from "
                    f"{rv.host}:{rv.port} (node down or cut off)")
        job = self.job
        if job is None or not hasattr(job, "done"):
            return None
        # submitit's cluster watcher backs off to minutes between polls: force a fresh look every few seconds
        force = time.monotonic() - self._last_forced_check > self.job_check_s
        if force:
            self._last_forced_check = time.monotonic()
        if job.done(force_check=force) if self._job_done_takes_force else job.done():
            return f"job {self.job_id} ended (state {getattr(job, 'state', '?')})"
        return None

    def stop_pinging(self) -> None:
        self._stop_pinging.set()

    def await_lease_end(self) -> None:
        """Once pinging stopped: wait until the worker has gone unheard for `silent_after_s`. A worker exits by
        itself after a shorter silence, so by then it is gone even if it is only cut off (a partition)."""
        if self.last_contact is None or self.peer_closed:  # closed by its kernel: the process is gone already
            return
        left = self.last_contact + self.silent_after_s - time.monotonic()
        if left > 0:
            log.warning("%s: waiting %.0fs until it has certainly exited (no answer since %.0fs)", self.name, left,
                        time.monotonic() - self.last_contact)
            time.sleep(left)

    def close(self) -> None:
        with self._lock:
            if self.conn is not None:
                try:
                    self.conn.close()
                finally:
                    self.conn = None

    def _lost(self, reason: str) -> WorkerLost:
        self.close()  # a half-read reply would desynchronise the channel: start fresh next time
        log.error("%s lost: %s", self.name, reason)
        return WorkerLost(self.name, self.job_id, reason, self.last_health)

