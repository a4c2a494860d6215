"""Serve a worker object's named calls over an authenticated `multiprocessing.connection` listener.

One thread only accepts; each connection gets a thread that first runs the authentication handshake under a time
bound (a peer that closes, stays silent, sends garbage or the wrong key is counted, logged and dropped while serving
continues) and then serves its calls; calls into the worker are serialised with a lock because the model is not
re-entrant. A watchdog thread exits the process when the controller disappears, so a killed controller never leaves
orphan workers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

from infra.dist_store import advertised_host
from workers.protocol import (
    CALLS,
    HANDSHAKE_TIMEOUT_S,
    Rendezvous,
    authenticate,
    pid_alive,
    receive_message,
    require_authkey,
    send_message,
    write_rendezvous,
)

log = logging.getLogger(__name__)

MAX_PENDING_HANDSHAKES = 64  # unauthenticated connections handled at once; more are closed at accept


class WorkerServer:
    """Listens on `bind_host`, writes the rendezvous file, dispatches calls to `worker` until `shutdown`."""

    def __init__(self, worker, role: str, rendezvous_path: Path, authkey: bytes, bind_host: str = "127.0.0.1",
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S, max_pending: int = MAX_PENDING_HANDSHAKES,
                 contact: ContactClock | None = None):
        self.worker, self.role, self.rendezvous_path = worker, role, Path(rendezvous_path)
        self.authkey = require_authkey(authkey, f"{role} worker")
        self.listener = socket.create_server((bind_host, 0), backlog=512)
        self.listener.settimeout(1.0)  # the accept loop looks at the stop event this often
        self.handshake_timeout_s = handshake_timeout_s
        self.pending = threading.BoundedSemaphore(max_pending)
        self.stop = threading.Event()
        self.call_lock = threading.Lock()
        self.rejected = 0  # connections that never proved the key: closed, timed out, garbage, wrong key, flood
        self.last_calls: dict[str, tuple[float, float]] = {}  # method -> wall-clock (start, end) of its last call
        self.contact = contact or ContactClock()  # when the controller was last heard (calls and pings)
        self._counter_lock = threading.Lock()
        self._last_warning = float("-inf")

    @property
    def address(self) -> tuple[str, int]:
        return self.listener.getsockname()[:2]

    def serve_forever(self) -> None:
        """Write the rendezvous and serve until a `shutdown` call or stop event."""
        rv = Rendezvous(self.role, advertised_host(self.address[0]), self.address[1], os.getpid())
        write_rendezvous(self.rendezvous_path, rv)
        log.info("%s worker pid %d serving on %s:%d", self.role, rv.pid, rv.host, rv.port)
        threading.Thread(target=self._accept_loop, daemon=True, name="accept").start()
        self.stop.wait()
        self.listener.close()
        log.info("%s worker pid %d stopped", self.role, os.getpid())

    def _accept_loop(self) -> None:
        """Accept only: the handshake runs in the connection's own thread, so no peer can block the next accept."""
        while not self.stop.is_set():
            try:
                sock, peer = self.listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:  # EMFILE, ECONNABORTED, ...: this connection is lost, serving is not
                if self.stop.is_set():
                    return
                self._reject(None, f"accept failed ({exc})")
                time.sleep(0.05)
                continue
            if not self.pending.acquire(blocking=False):
                sock.close()  # a flood of unauthenticated peers: drop the newest rather than queue threads
                self._reject(peer, "too many connections still authenticating")
                continue
            threading.Thread(target=self._authenticate_and_serve, args=(sock, peer), daemon=True).start()

    def _authenticate_and_serve(self, sock: socket.socket, peer) -> None:
        try:
            conn = authenticate(sock, self.authkey, server=True, timeout_s=self.handshake_timeout_s)
        except Exception as exc:  # any failure of an unauthenticated peer is a rejection, never the server's end
            sock.close()
            self._reject(peer, f"{type(exc).__name__}: {exc}")
            return
        finally:
            self.pending.release()
        self._serve_connection(conn)

    def _reject(self, peer, why: str) -> None:
        """Count a connection that never proved the run's key; warn at most every 30 s (a scan can make many)."""
        with self._counter_lock:
            self.rejected += 1
            now = time.monotonic()
            warn = now - self._last_warning > 30
            if warn:
                self._last_warning = now
        if warn:
            log.warning("%s worker rejected a connection from %s without the run's key (%s); %d rejected so far, "
                        "still serving", self.role, peer[0] if peer else "?", why, self.rejected)

    def _serve_connection(self, conn: Connection) -> None:
        with conn:
            while not self.stop.is_set():
                try:
                    method, args, kwargs = receive_message(conn)
                except (EOFError, OSError):
                    return
                self.contact.touch()
                reply = self._dispatch(method, args, kwargs)
                try:
                    send_message(conn, reply)
                except OSError:  # the caller went away (timeout, exit): nothing to answer
                    return
                if method == "shutdown":
                    self.stop.set()
                    return

    def _dispatch(self, method: str, args: tuple, kwargs: dict) -> tuple:
        if method == "ping":  # the controller's liveness probe: no lock, no work
            return ("ok", True)
        if method not in CALLS or not hasattr(self.worker, method):
            return ("error", "ValueError", f"{self.role} worker has no call {method!r}", "")
        try:
            if method == "health":  # answered without the lock: health must work during a long call
                return ("ok", {**self.worker.health(), "rejected_connections": self.rejected,
                               "last_calls": dict(self.last_calls)})
            with self.call_lock:
                start = time.time()
                try:
                    return ("ok", getattr(self.worker, method)(*args, **kwargs))
                finally:  # health shows when each call last ran: overlapping spans prove replicas worked at once
                    self.last_calls[method] = (start, time.time())
        except Exception as exc:  # sent back to the caller, who re-raises it as WorkerCallError
            log.exception("%s.%s failed", self.role, method)
            return ("error", type(exc).__name__, str(exc), traceback.format_exc())


class ContactClock:
    """When an authenticated peer (the controller) last sent this worker anything."""

    def __init__(self):
        self.last: float | None = None

    def touch(self) -> None:
        self.last = time.monotonic()

    def age(self) -> float | None:
        """Seconds since the last contact; None before the first."""
        return None if self.last is None else time.monotonic() - self.last


def watch_controller(controller_pid: int | None, controller_host: str | None, heartbeat_path: Path | None,
                     stale_after_s: float = 60.0, on_lost=None, interval_s: float = 1.0,
                     contact: ContactClock | None = None) -> threading.Thread:
    """Exit the process (or call on_lost) when the controller pid is gone, its heartbeat file goes stale, or (with
    `contact`) it has not been heard over the network for `stale_after_s`.

    The pid check works on the controller's host; the heartbeat file covers workers on other nodes; the network
    check covers a partition, which a shared filesystem may not see (the controller pings every 2 s)."""
    on_lost = on_lost or (lambda why: (log.error("controller lost (%s): worker exiting", why), os._exit(3)))
    same_host = controller_host in (None, socket.gethostname())
    same_host_pid = controller_pid if controller_pid and same_host else None

    def loop():
        while True:
            time.sleep(interval_s)
            if same_host_pid is not None and not pid_alive(same_host_pid):
                on_lost(f"controller pid {same_host_pid} exited")
                return
            if heartbeat_path is not None:
                try:
                    age = time.time() - heartbeat_path.stat().st_mtime
                except FileNotFoundError:
                    age = float("inf")
                if age > stale_after_s:
                    on_lost(f"heartbeat {heartbeat_path} is {age:.0f}s old")
                    return
            silent = contact.age() if contact is not None else None
            if silent is not None and silent > stale_after_s:
                on_lost(f"no word from the controller over the network for {silent:.0f}s (a partition?)")
                return

    thread = threading.Thread(target=loop, daemon=True, name="controller-watch")
    thread.start()
    return thread

