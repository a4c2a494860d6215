"""The authenticated worker channel, with a tiny in-thread worker (no model, no submitit)."""

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import Client

import pytest

from infra.launcher.executors import slurm_minutes
from workers.client import WorkerClient
from workers.protocol import SecretKey, WorkerCallError, WorkerLost, new_authkey, read_rendezvous
from workers.server import WorkerServer, watch_controller


class EchoWorker:
    role = "echo"

    def health(self):
        return {"pid": os.getpid(), "role": self.role, "policy_version": 7, "step": 3}

    def generate(self, x, sleep=0.0):
        time.sleep(sleep)
        return x * 2

    def score(self, _):
        raise ValueError("bad reward input: fix the target column")

    def shutdown(self):
        return True


def serve_in_thread(tmp_path, key):
    server = WorkerServer(EchoWorker(), "echo", tmp_path / "echo.json", key)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for _ in range(100):
        rv = read_rendezvous(tmp_path / "echo.json")
        if rv:
            return server, rv
        time.sleep(0.02)
    raise AssertionError("rendezvous never written")


def test_calls_errors_and_wrong_key(tmp_path, caplog):
    key = SecretKey(new_authkey())
    server, rv = serve_in_thread(tmp_path, key)
    client = WorkerClient("echo-0", rv, key)
    assert client.call("generate", 21) == 42
    with pytest.raises(WorkerCallError, match="ValueError: bad reward input"):
        client.call("score", None)
    with pytest.raises(WorkerCallError, match="no call 'train'"):
        client.call("train")
    with caplog.at_level(logging.WARNING):
        with pytest.raises(Exception):  # noqa: B017 - the stdlib raises AuthenticationError or a reset
            Client(rv.address, authkey=b"wrong key")
        time.sleep(0.2)
    assert server.rejected == 1
    assert "rejected a connection" in caplog.text
    assert client.call("generate", 1) == 2  # still serving the right key
    assert client.call("health")["policy_version"] == 7
    assert client.call("shutdown") is True


def test_secret_never_printed():
    key = SecretKey(b"supersecret")
    assert "supersecret" not in repr(key) and "supersecret" not in str(key) and "supersecret" not in f"{key!r}"


def test_timeout_raises_worker_lost_with_last_state(tmp_path):
    key = SecretKey(new_authkey())
    _, rv = serve_in_thread(tmp_path, key)
    client = WorkerClient("echo-0", rv, key)
    client.call("health")
    with pytest.raises(WorkerLost, match="no reply to generate within 0s") as info:
        client.call("generate", 1, sleep=2.0, timeout=0.3)
    assert info.value.last_health["step"] == 3 and "policy_version" in str(info.value)


def _serve_forever_in_child(path, key):
    WorkerServer(EchoWorker(), "echo", path, key).serve_forever()


def test_killed_worker_process_is_lost_quickly(tmp_path):
    key = SecretKey(new_authkey())
    proc = mp.get_context("spawn").Process(target=_serve_forever_in_child, args=(tmp_path / "echo.json", key))
    proc.start()
    try:
        for _ in range(300):
            rv = read_rendezvous(tmp_path / "echo.json")
            if rv:
                break
            time.sleep(0.05)
        client = WorkerClient("echo-0", rv, key)
        assert client.call("generate", 2) == 4
        threading.Timer(0.5, os.kill, (proc.pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(WorkerLost) as info:
            client.call("generate", 1, sleep=30.0, timeout=60)
        assert time.monotonic() - t0 < 30  # detected long before the call would have ended
        assert info.value.role == "echo-0"
    finally:
        proc.kill()
        proc.join()


def test_controller_watch_sees_a_dead_pid_and_a_stale_heartbeat(tmp_path):
    child = mp.get_context("spawn").Process(target=time.sleep, args=(60,))
    child.start()
    lost = []
    watch_controller(child.pid, None, None, on_lost=lost.append, interval_s=0.05)
    child.kill()
    child.join()
    beat = tmp_path / "hb"
    beat.touch()
    os.utime(beat, (time.time() - 100, time.time() - 100))
    watch_controller(None, None, beat, stale_after_s=10, on_lost=lost.append, interval_s=0.05)
    for _ in range(100):
        if len(lost) == 2:
            break
        time.sleep(0.05)
    assert any("exited" in why for why in lost) and any("heartbeat" in why for why in lost)


def test_slurm_time_strings():
    assert slurm_minutes("04:00:00") == 240
    assert slurm_minutes("1-00:30:00") == 1470
    assert slurm_minutes("90") == 90
    assert slurm_minutes("10:30") == 11
    with pytest.raises(ValueError, match="slurm.time"):
        slurm_minutes("1:2:3:4")


def test_connect_to_a_wedged_worker_raises_worker_lost(tmp_path):
    """A listener that never answers the handshake (a wedged worker) makes connect raise WorkerLost after the
    handshake time-out instead of hanging."""
    import socket

    from workers.protocol import Rendezvous

    wedged = socket.create_server(("127.0.0.1", 0))  # the kernel completes connections; nobody ever answers
    try:
        rv = Rendezvous("echo", "127.0.0.1", wedged.getsockname()[1], os.getpid())
        client = WorkerClient("echo-0", rv, SecretKey(new_authkey()))
        client.handshake_timeout_s = 0.5
        with pytest.raises(WorkerLost, match="cannot connect to 127.0.0.1"):
            client.call("generate", 1)
    finally:
        wedged.close()


def test_two_threads_share_one_client(tmp_path):
    key = SecretKey(new_authkey())
    _, rv = serve_in_thread(tmp_path, key)
    client = WorkerClient("echo-0", rv, key)
    wrong: list = []

    def caller(base: int):
        for i in range(50):
            if client.call("generate", base + i, sleep=0.001) != 2 * (base + i):
                wrong.append(base + i)

    threads = [threading.Thread(target=caller, args=(b,)) for b in (0, 1000, 2000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
