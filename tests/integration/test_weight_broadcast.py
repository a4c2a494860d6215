"""Collective weight sync: a trainer process broadcasts each version to two generator processes (gloo, real
processes); generators fetch by version, keep the newest two, and a dead generator makes publish fail clearly."""

import multiprocessing as mp
import os
import threading

import pytest
import torch

from infra.weightsync.broadcast import BroadcastWeightSync

pytestmark = pytest.mark.integration


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"embed": torch.randn(50, 16, generator=g), "norm": torch.ones(16) * version,
            "head": torch.randn(50, 16, generator=g).to(torch.bfloat16)}


def generator_process(address, rank, results, die_after):
    torch.set_num_threads(1)
    sync = BroadcastWeightSync(address, rank, 3, keep=2, timeout_s=60)
    if die_after:
        sync.fetch(1)
        os._exit(0)  # a generator that goes away without a word
    got = {}
    for version in (2, 3):
        v, state = sync.fetch(version)
        got[v] = all(torch.equal(state[k], weights(v)[k]) and state[k].dtype == weights(v)[k].dtype
                     for k in weights(v))
    sync.close()  # returns when the trainer says stop
    with pytest.raises(KeyError, match="not kept"):
        sync.fetch(1)  # keep=2: version 1 was dropped when 3 arrived
    results.put((rank, got, sync.latest()))


def start_generators(address, die_after=False):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=generator_process, args=(address, r, results, die_after)) for r in (1, 2)]
    for p in procs:
        p.start()
    return procs, results


def test_broadcast_reaches_every_generator_in_version_order():
    trainer = BroadcastWeightSync("127.0.0.1:0", 0, 3, timeout_s=60)  # hosts the rendezvous on a free port
    procs, results = start_generators(trainer.address)
    for version in (1, 2, 3):
        trainer.publish(version, weights(version))
    trainer.close()
    got = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert got == [(1, {2: True, 3: True}, 3), (2, {2: True, 3: True}, 3)]
    assert [p.exitcode for p in procs] == [0, 0]


def test_publish_names_the_fix_when_a_generator_is_gone():
    trainer = BroadcastWeightSync("127.0.0.1:0", 0, 3, timeout_s=10)
    procs, _ = start_generators(trainer.address, die_after=True)
    trainer.publish(1, weights(1))
    for p in procs:
        p.join(30)
    with pytest.raises(RuntimeError, match="re-forms the group"):
        trainer.publish(2, weights(2))


def test_a_group_that_never_forms_is_reported():
    trainer = BroadcastWeightSync("127.0.0.1:0", 0, 2, timeout_s=2)  # the generator never joins
    assert trainer.wait_formed(timeout_s=0.2) is False  # still forming: a poll says so instead of raising
    with pytest.raises((TimeoutError, RuntimeError), match="form"):
        trainer.publish(1, weights(1))


def odd_weights(version: int) -> dict[str, torch.Tensor]:
    """Sizes that are no multiple of one another's element size, in several dtypes."""
    g = torch.Generator().manual_seed(version)
    return {"a": torch.randn(7, 3, generator=g).to(torch.bfloat16), "b": torch.randn(5, generator=g),
            "c": torch.arange(9, dtype=torch.int64) * version, "d": torch.randn(300, generator=g),
            "e": torch.ones(3, dtype=torch.float16)}


class AllocationLog:
    """Stands in for the broadcast module's `torch`: logs each tensor allocation it is asked for, in order with the
    test's own events (the receiver's lock attempts, the lock's release), and forwards everything to torch."""

    ALLOCATORS = ("empty", "zeros", "ones", "full", "tensor", "empty_like", "zeros_like", "frombuffer")

    def __init__(self):
        self.events: list[tuple[str, object]] = []
        self.changed = threading.Condition()

    def record(self, what: str) -> None:
        with self.changed:
            self.events.append((what, threading.current_thread()))
            self.changed.notify_all()

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name not in self.ALLOCATORS:
            return attr

        def allocate(*args, **kwargs):
            self.record("allocates")
            return attr(*args, **kwargs)
        return allocate


class AttemptLoggingLock:
    """The capture lock as the receiver sees it: logs each attempt to take it, then takes the real one."""

    def __init__(self, lock, log: AllocationLog):
        self.lock, self.log = lock, log

    def __enter__(self):
        self.log.record("waits for the capture lock")
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def test_buckets_carry_every_tensor_exactly_and_nothing_is_allocated_while_a_graph_is_captured(monkeypatch):
    """Small buckets split the state over several collectives. While the process captures a CUDA graph
    (GRAPH_CAPTURE held), the receiver allocates nothing, not even the header's buffers: the log of allocations
    and lock events shows its first allocation after the capture ended; then the version arrives whole."""
    from forge_core.generation.decoder import GRAPH_CAPTURE
    from infra.weightsync import broadcast
    from infra.weightsync.broadcast import plan_buckets

    assert broadcast.GRAPH_CAPTURE is GRAPH_CAPTURE  # the receiver waits for the decoder's own lock
    log = AllocationLog()
    monkeypatch.setattr(broadcast, "torch", log)
    monkeypatch.setattr(broadcast, "GRAPH_CAPTURE", AttemptLoggingLock(GRAPH_CAPTURE, log))
    spec = [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in odd_weights(1).items()]
    assert len(plan_buckets(spec, 256)) >= 3
    with GRAPH_CAPTURE:  # a capture is under way from before the receiver exists until it first needs memory
        trainer = BroadcastWeightSync("127.0.0.1:0", 0, 2, timeout_s=60, bucket_bytes=256)
        receiver = BroadcastWeightSync(trainer.address, 1, 2, timeout_s=60, bucket_bytes=1 << 30)  # sender's plan rules
        sender = threading.Thread(target=trainer.publish, args=(1, odd_weights(1)))
        sender.start()
        mine = lambda: [what for what, thread in log.events if thread is receiver._thread]  # noqa: E731
        with log.changed:  # until the receiver needs the lock, or shows it never will (arrived or failed)
            while not ("waits for the capture lock" in mine() or receiver.latest() is not None or receiver._error):
                log.changed.wait(1.0)  # re-checks arrival and failure, which do not notify this log
            log.events.append(("capture ends", None))
    version, state = receiver.fetch(1)
    sender.join()
    events = [what for what, thread in log.events if thread in (receiver._thread, None)]
    end = events.index("capture ends")
    assert events[:end] == ["waits for the capture lock"], events  # it waited for the capture, allocating nothing
    assert events[end + 1:].count("allocates") >= 2 + 3  # the header's length and bytes, then every bucket
    assert version == 1 and set(state) == set(odd_weights(1))
    for k, v in odd_weights(1).items():
        assert state[k].dtype == v.dtype and torch.equal(state[k], v), k
    trainer.close()
    receiver.close()
