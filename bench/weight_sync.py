"""Weight sync: publish + fetch of a 200 MB state dict through the fs and the shared-memory weight stores, until the
weights are usable, vs copying the same tensors straight into the receiver's (the colocated ideal).

`FSWeightStore.fetch` returns memory-mapped tensors: timing it alone times the write only. Here the fetch side copies
every tensor into the receiver's own preallocated tensors, as the generator loads a version
(`infra.weightsync.load_into_model`: the fs store's fetch then `load_state_dict`; the shared store's `fetch_into`,
straight from the slot), on `--device`, so every byte is read. Both measured in this run (best of `--repeats`). Prints publish, fetch + load and
the copy, for the fs store and the shared-memory store (`weightsync.backend: shared`), and ends with
`RESULT ratio=… shared_ratio=… store_gb_s=… shared_gb_s=… copy_gb_s=…` (ratio: store bandwidth / copy bandwidth).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from infra.weightsync import default_store_root, open_weight_store  # noqa: E402


def make_state(total_mb: int, tensor_mb: int = 4) -> dict[str, torch.Tensor]:
    n = total_mb // tensor_mb
    numel = tensor_mb * 1024 * 1024 // 4
    return {f"layers.{i}.weight": torch.randn(numel) for i in range(n)}


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--root", default=None, help="store directory (default: /dev/shm when available)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="where the receiver's weights live (cuda: host-to-device)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    state = make_state(args.mb)
    gb = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
    device = torch.device(args.device)
    receiver = {k: torch.empty_like(t, device=device) for k, t in state.items()}  # the generator's weights

    def load_into_receiver(got: dict[str, torch.Tensor]) -> None:
        for name, t in got.items():
            receiver[name].copy_(t)  # reads every byte (the fs store's tensors are memory-mapped)
        if device.type == "cuda":
            torch.cuda.synchronize()

    copy_s = best_of(lambda: load_into_receiver(state), args.repeats)  # the colocated ideal: one copy of each byte
    results = {}
    for backend in ("fs", "shared"):
        root = Path(args.root or default_store_root(f"bench-{os.getpid()}")) / backend
        store = open_weight_store(backend, root, keep=2)
        version = iter(range(10**6))
        split = {"publish": [], "fetch": []}

        def sync(store=store, version=version, split=split):
            v = next(version)
            t0 = time.perf_counter()
            store.publish(v, state)
            t1 = time.perf_counter()
            if hasattr(store, "fetch_into"):  # as the generator loads it (infra.weightsync.load_into_model)
                store.fetch_into(v, receiver)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            else:
                load_into_receiver(store.fetch(v)[1])
            split["publish"].append(t1 - t0)
            split["fetch"].append(time.perf_counter() - t1)

        results[backend] = best_of(sync, args.repeats), {k: min(v) for k, v in split.items()}
        assert all(torch.equal(receiver[k].cpu(), state[k]) for k in state), "the receiver holds the weights"
        store.close()
        shutil.rmtree(root)
    print(f"state dict: {gb * 1000:.0f} MB in {len(state)} tensors; receiver on {device}")
    print(f"{'method':<28} {'seconds':>8} {'GB/s':>8}")
    print(f"{'direct copy into receiver':<28} {copy_s:>8.3f} {gb / copy_s:>8.2f}")
    for backend, (seconds, split) in results.items():
        print(f"{backend + ' store publish + fetch':<28} {seconds:>8.3f} {gb / seconds:>8.2f}")
        for part, best in split.items():
            print(f"{'  of which ' + part:<28} {best:>8.3f} {gb / best:>8.2f}")
    fs_s, shared_s = results["fs"][0], results["shared"][0]
    print(f"RESULT ratio={copy_s / fs_s:.2f} shared_ratio={copy_s / shared_s:.2f} store_gb_s={gb / fs_s:.2f} "
          f"shared_gb_s={gb / shared_s:.2f} copy_gb_s={gb / copy_s:.2f}")

if __name__ == "__main__":
    main()
