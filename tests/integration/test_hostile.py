"""A live worker process (submitit LocalExecutor) under hostile connections: after each attack a fresh, authenticated
client still gets an answer and the worker's rejected-connection counter has moved. Waits are generous polls, never
wall-clock assertions."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from multiprocessing.connection import Client
from pathlib import Path

import pytest
import yaml

from forge_core.types import Completion, Episode, Group
from tests.integration.pool_helpers import tiny_config
from workers.client import WorkerClient
from workers.entry import read_authkey
from workers.pool import WorkerPool
from workers.protocol import receive_message, send_message

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def reward_pool(tmp_path_factory):
    cfg = tiny_config("local")
    with WorkerPool(cfg, tmp_path_factory.mktemp("hostile") / "run", roles=("reward",)) as pool:
        yield pool


def fresh_client(pool: WorkerPool) -> WorkerClient:
    """A new connection with the run's key (what the controller makes after a reconnect)."""
    member = pool.members["reward"][0]
    return WorkerClient("reward-probe", member.client.rendezvous, pool._authkey, member.job, call_timeout_s=120)


def groups_of(n: int, answer: str) -> list[Group]:
    """n one-episode groups whose target is 7; `answer` decides the reward."""
    completion = Completion(text=f"The answer is {answer}", token_ids=[1], logprobs=[0.0])
    return [Group("q", "7", [Episode("q", "7", [1], completion)]) for _ in range(n)]


def rejected(pool: WorkerPool) -> int:
    return int(fresh_client(pool).call("health")["rejected_connections"])


def assert_serves_and_counted(pool: WorkerPool, before: int, at_least: int = 1) -> None:
    """A fresh authenticated call succeeds and the counter moved by `at_least` (polled: silent peers are counted
    only when their handshake times out)."""
    client = fresh_client(pool)
    right, _ = client.call("score", groups_of(2, "7"))
    wrong, _ = client.call("score", groups_of(1, "3"))
    assert len(right) == 2 and right[0][0][0] > wrong[0][0][0]
    for _ in range(600):
        if client.call("health")["rejected_connections"] >= before + at_least:
            break
        time.sleep(0.1)
    assert client.call("health")["rejected_connections"] >= before + at_least
    client.close()


def address(pool: WorkerPool) -> tuple[str, int]:
    return pool.members["reward"][0].client.rendezvous.address


def test_connect_and_close(reward_pool):
    before = rejected(reward_pool)
    for _ in range(5):
        socket.create_connection(address(reward_pool)).close()
    assert_serves_and_counted(reward_pool, before, 5)


def test_connect_and_stay_silent_does_not_block_others(reward_pool):
    before = rejected(reward_pool)
    silent = [socket.create_connection(address(reward_pool)) for _ in range(3)]
    try:  # while they hang in their handshakes, a real client is served
        rewards, _ = fresh_client(reward_pool).call("score", groups_of(1, "3"))
        assert len(rewards) == 1
        assert_serves_and_counted(reward_pool, before, 3)  # each one dropped after the handshake time-out
    finally:
        for s in silent:
            s.close()


def test_random_bytes(reward_pool):
    before = rejected(reward_pool)
    for seed in range(3):
        with socket.create_connection(address(reward_pool)) as s:
            s.sendall(os.urandom(4096 + seed))
            s.settimeout(30)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
    assert_serves_and_counted(reward_pool, before, 3)


@pytest.mark.parametrize("prefix", [struct.pack("!i", 2**31 - 1), struct.pack("!i", -1) + struct.pack("!Q", 2**62)])
def test_huge_length_prefix(reward_pool, prefix):
    before = rejected(reward_pool)
    with socket.create_connection(address(reward_pool)) as s:
        s.sendall(prefix + b"x" * 64)
        s.settimeout(30)
        try:
            while s.recv(4096):  # the worker answers its challenge, then drops us
                pass
        except OSError:
            pass
    assert_serves_and_counted(reward_pool, before)


def test_wrong_key_and_empty_key(reward_pool):
    before = rejected(reward_pool)
    for key in (b"wrong key", b""):
        with pytest.raises(Exception):  # noqa: B017 - AuthenticationError or a reset, as the worker closes
            Client(address(reward_pool), authkey=key)
    assert_serves_and_counted(reward_pool, before, 2)


def test_empty_key_is_refused_on_both_ends(tmp_path, reward_pool):
    empty = tmp_path / "authkey"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="authkey is empty.*disable authentication"):
        read_authkey(empty)
    with pytest.raises(ValueError, match="authkey is empty"):
        WorkerClient("x", reward_pool.members["reward"][0].client.rendezvous, b"")


def test_replay_of_a_recorded_session(reward_pool):
    """Record what a real client sends through a relay, then send the same bytes again: the worker's fresh
    challenge makes the recorded answer worthless."""
    upstream = address(reward_pool)
    relay = socket.create_server(("127.0.0.1", 0))
    recorded = bytearray()

    def pump(src, dst, record):
        try:
            while data := src.recv(65536):
                if record:
                    recorded.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    def serve_relay():
        down, _ = relay.accept()
        up = socket.create_connection(upstream)
        threading.Thread(target=pump, args=(up, down, False), daemon=True).start()
        pump(down, up, True)

    threading.Thread(target=serve_relay, daemon=True).start()
    conn = Client(relay.getsockname(), authkey=reward_pool._authkey)
    send_message(conn, ("score", (groups_of(1, "7"),), {}))
    assert receive_message(conn)[0] == "ok"
    conn.close()
    time.sleep(0.5)
    assert len(recorded) > 100

    before = rejected(reward_pool)
    with socket.create_connection(upstream) as s:
        s.settimeout(30)
        s.sendall(bytes(recorded))
        reply = b""
        try:
            while data := s.recv(65536):
                reply += data
        except OSError:
            pass
    assert b"#FAILURE#" in reply and b"'ok'" not in reply
    assert_serves_and_counted(reward_pool, before)


def test_burst_of_200_connections(reward_pool):
    before = rejected(reward_pool)
    burst = []
    for _ in range(200):
        try:
            burst.append(socket.create_connection(address(reward_pool), timeout=30))
        except OSError:  # the backlog may refuse a few: the point is that the worker outlives the burst
            pass
    for s in burst:
        s.close()
    assert_serves_and_counted(reward_pool, before, len(burst))


def test_two_threads_calling_one_client(reward_pool):
    """Each thread must get its own reply: different batch sizes and rewards per thread."""
    client = fresh_client(reward_pool)
    errors: list[str] = []

    reward = {answer: client.call("score", groups_of(1, answer))[0][0][0][0] for answer in ("7", "5")}
    assert reward["7"] != reward["5"]

    def caller(n: int, answer: str):
        for _ in range(40):
            rewards, _ = client.call("score", groups_of(n, answer))
            if [r for (r, *_), in rewards] != [reward[answer]] * n:
                errors.append(f"thread n={n} got {rewards}")

    threads = [threading.Thread(target=caller, args=args) for args in ((1, "7"), (3, "5"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert client.call("health")["role"] == "reward"


def test_secrets_never_reach_the_worker_job_folder(tmp_path):
    """submitit pickles the worker's launch description into its job folder: no password may be in any file there
    (the authkey lives only in its own 0600 file)."""
    recipe = yaml.safe_load(Path("configs/grpo_math_tiny.yaml").read_text())
    trusting = tmp_path / "trusting.yaml"  # overrides may name only hosts the file trusts (infra/hosts.py)
    trusting.write_text(yaml.safe_dump({**recipe, "trusted_hosts": ["db.example:5432", "mlflow.example:5000"]}))
    cfg = tiny_config("local", str(trusting),
                      **{"tracking.registry_url": "postgresql://forgeflow:hunter2@db.example:5432/registry",
                         "tracking.mlflow_uri": "http://ops:s3cr3tpw@mlflow.example:5000"})
    with WorkerPool(cfg, tmp_path / "run", roles=("reward",)) as pool:
        assert fresh_client(pool).call("health")["role"] == "reward"
        files = [p for p in (tmp_path / "run").rglob("*") if p.is_file() and p != pool.key_path]
        assert any(p.suffix == ".pkl" for p in files)
        for path in files:
            data = path.read_bytes()
            assert b"hunter2" not in data and b"s3cr3tpw" not in data, path
            assert pool._authkey not in data, path
        assert oct(pool.key_path.stat().st_mode & 0o777) == "0o600"
