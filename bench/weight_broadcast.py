"""Weight-sync cost: the fs store (publish to /dev/shm + fetch) vs a collective broadcast to one receiver process
(gloo on CPU here; NCCL on GPUs). Prints seconds per version and the ratio, both measured in this run."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import tempfile
import time

import torch

from infra.weightsync import FSWeightStore
from infra.weightsync.broadcast import BroadcastWeightSync


def state_of(mb: int) -> dict[str, torch.Tensor]:
    n = mb * 2**20 // 4 // 64
    return {f"layer{i}.weight": torch.randn(n // 64, 64) for i in range(64)}


def receive(address: str, versions: int) -> None:
    torch.set_num_threads(1)
    sync = BroadcastWeightSync(address, 1, 2, keep=versions + 1)
    for v in range(1, versions + 1):
        sync.fetch(v)
    sync.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=256, help="size of the published state in MiB")
    parser.add_argument("--versions", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    state = state_of(args.mb)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        store = FSWeightStore(root)
        start = time.perf_counter()
        for v in range(1, args.versions + 1):
            store.publish(v, state)
            store.fetch(v)
        fs = (time.perf_counter() - start) / args.versions
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    receiver = mp.get_context("spawn").Process(target=receive, args=(address, args.versions))
    receiver.start()
    sender = BroadcastWeightSync(address, 0, 2)
    sender.publish(0, {"warmup": torch.zeros(1)})
    start = time.perf_counter()
    for v in range(1, args.versions + 1):
        sender.publish(v, state)
    sender.close()
    receiver.join()
    bc = (time.perf_counter() - start) / args.versions
    print(f"{'method':<28}{'s/version':>10}{'GB/s':>8}")
    for name, t in (("fs (/dev/shm) publish+fetch", fs), ("broadcast (gloo, 1 receiver)", bc)):
        print(f"{name:<28}{t:>10.3f}{args.mb / 1024 / t:>8.2f}")
    print(f"ratio fs/broadcast = {fs / bc:.2f} (>1: broadcast faster)")


if __name__ == "__main__":
    main()
