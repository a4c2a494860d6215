"""What travels between a controller and a worker, and the errors a caller sees.

A request is `(method, args, kwargs)`; a reply is `("ok", value)` or `("error", type_name, message, traceback)`.
Both travel as plain pickles (`send_message` / `receive_message`) over a `multiprocessing.connection` that exists
only after both sides passed the HMAC challenge with the run's authkey (`authenticate`), each within a time bound.
"""

from __future__ import annotations

import json
import os
import pickle
import secrets
import socket
import struct
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path

CALLS = ("generate", "train", "logprobs", "score", "load_weights", "publish_weights", "save_checkpoint",
         "load_checkpoint", "evaluate", "rollout", "health", "shutdown", "open_weight_group", "join_weight_group",
         "await_weight_group", "sft_step", "save_pretrained", "end_ids", "reset_envs", "step_envs", "finish_envs",
         "ping")


def send_message(conn, obj) -> None:
    """Pickle `obj` with the plain pickler: Connection.send's pickler hands tensors over as shared-memory file
    descriptors (torch's multiprocessing reductions), which only a process of the same family can open."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def receive_message(conn):
    """The object `send_message` sent."""
    return pickle.loads(conn.recv_bytes())


class WorkerLost(RuntimeError):
    """The worker's connection dropped, its job died, or it did not answer within the call's timeout."""

    def __init__(self, role: str, job_id: str, reason: str, last_health: dict | None = None):
        self.role, self.job_id, self.reason, self.last_health = role, job_id, reason, last_health or {}
        state = {k: self.last_health.get(k) for k in ("pid", "host", "policy_version", "step") if k in self.last_health}
        super().__init__(f"{role} worker (job {job_id}) lost: {reason}; last known state {state or 'none'}")


class WorkerCallError(RuntimeError):
    """The worker is alive but the call raised; carries the remote exception type and traceback."""

    def __init__(self, role: str, method: str, type_name: str, message: str, remote_traceback: str):
        self.type_name, self.remote_traceback = type_name, remote_traceback
        super().__init__(f"{role}.{method} raised {type_name}: {message}\n--- worker traceback ---\n{remote_traceback}")


@dataclass(frozen=True)
class Rendezvous:
    """Where a worker listens; written by the worker, read by the controller. Never holds the authkey."""

    role: str
    host: str
    port: int
    pid: int

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


def write_rendezvous(path: Path, rv: Rendezvous) -> None:
    """Write atomically (tmp + rename) so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(rv)))
    os.replace(tmp, path)


def read_rendezvous(path: Path) -> Rendezvous | None:
    """The rendezvous at `path`, or None when the worker has not written it yet."""
    try:
        return Rendezvous(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None


def new_authkey() -> bytes:
    """A fresh per-run secret (32 random bytes)."""
    return secrets.token_bytes(32)


class SecretKey(bytes):
    """Bytes whose repr never shows the value, so the key cannot leak through logs or error messages."""

    def __repr__(self) -> str:
        return "SecretKey(<redacted>)"

    __str__ = __repr__


def pid_alive(pid: int) -> bool:
    """Whether process `pid` on this host exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False  # exited between the two checks
    except (IndexError, OSError):
        return True


HANDSHAKE_TIMEOUT_S = 10.0  # a peer that has not proven the key by then is dropped (it may be a port scan)


def require_authkey(key: bytes, where: str) -> bytes:
    """`key` if it is a usable secret; an empty key would turn multiprocessing's authentication off."""
    if not key:
        raise ValueError(f"{where}: the worker authkey is empty, which would disable authentication; delete the "
                         "file and start the run again (the worker pool writes a fresh 32-byte key per run)")
    return key


def authenticate(sock: socket.socket, authkey: bytes, server: bool,
                 timeout_s: float = HANDSHAKE_TIMEOUT_S) -> Connection:
    """Wrap a connected socket in a Connection once both sides proved the key (HMAC challenge each way).

    Every read and write of the handshake is bounded by `timeout_s`, so a silent or slow peer costs one thread for
    that long; pre-authentication messages are capped at 256 bytes by multiprocessing, so a huge length prefix is
    refused, not allocated. Raises AuthenticationError, OSError or EOFError, with the connection already closed."""
    require_authkey(authkey, "worker channel")
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        # messages over 16 KiB are written as header + payload: Nagle's algorithm with delayed ACKs holds ~40 ms
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)  # blocking fd: the kernel's SO_RCVTIMEO bounds each read instead
    set_io_timeout(sock, timeout_s)
    conn = Connection(sock.detach())
    try:
        if server:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        else:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
        with socket.socket(fileno=os.dup(conn.fileno())) as same:
            set_io_timeout(same, 0.0)  # authenticated: calls may take as long as they take
    except BaseException:
        conn.close()
        raise
    return conn


def connect_authenticated(address: tuple[str, int], authkey: bytes,
                          timeout_s: float = HANDSHAKE_TIMEOUT_S) -> Connection:
    """Connect to a worker and authenticate within `timeout_s` (a wedged worker cannot hang the caller)."""
    require_authkey(authkey, f"connection to {address[0]}:{address[1]}")
    sock = socket.create_connection(address, timeout=timeout_s)
    try:
        return authenticate(sock, authkey, server=False, timeout_s=timeout_s)
    except BaseException:
        sock.close()
        raise


def set_io_timeout(sock: socket.socket, timeout_s: float) -> None:
    """Bound every blocking read and write on the socket's fd (0 = no bound): SO_RCVTIMEO / SO_SNDTIMEO."""
    seconds = int(timeout_s)
    value = struct.pack("ll", seconds, int((timeout_s - seconds) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
