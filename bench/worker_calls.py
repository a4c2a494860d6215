"""Worker start-up time and call round-trip latency (local submitit processes; add --slurm for the Slurm path).

Baseline measured in the same run: a round trip over a plain `multiprocessing.Pipe` to a child process, the floor
for any process-to-process call. Ends with `RESULT startup_s=… rtt_ms=… pipe_rtt_ms=… ratio=…` (ratio = rtt/pipe).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from infra.config_checks import load_config  # noqa: E402
from workers.pool import WorkerPool  # noqa: E402


def _echo(conn) -> None:
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(msg)


def pipe_rtt_ms(n: int) -> float:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_echo, args=(child,))
    proc.start()
    parent.send("warm")
    parent.recv()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        parent.send(("health", (), {}))
        parent.recv()
        times.append(time.perf_counter() - t0)
    parent.send(None)
    proc.join()
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--launcher", default="local", choices=["local", "slurm"])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    cfg = load_config("configs/grpo_math_tiny.yaml", {"launcher": args.launcher, "slurm.cpus_per_task": 1})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(cfg, f"{tmp}/bench-workers") as pool:
        wall = time.perf_counter() - t0
        client = pool.clients("generator")[0]
        client.call("health")
        times = []
        for _ in range(args.calls):
            t1 = time.perf_counter()
            client.call("health")
            times.append(time.perf_counter() - t1)
        rtt = statistics.median(times) * 1000
        per_worker = pool.startup_s
    base = pipe_rtt_ms(args.calls)
    print(f"launcher {args.launcher}: {len(per_worker)} workers ready in {wall:.1f}s (all started in parallel)")
    for name, s in per_worker.items():
        print(f"  {name:<14} ready after {s:6.1f}s")
    print(f"call round trip (health, median of {args.calls}): {rtt:.3f} ms; plain Pipe round trip: {base:.3f} ms")
    print(f"RESULT startup_s={wall:.1f} rtt_ms={rtt:.3f} pipe_rtt_ms={base:.3f} ratio={rtt / base:.2f}")


if __name__ == "__main__":
    main()
