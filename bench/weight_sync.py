"""Weight sync: fs weight-store publish + fetch of a 200 MB state dict, until the weights are usable, vs copying the
same tensors straight into the receiver's (the colocated ideal).

`FSWeightStore.fetch` returns memory-mapped tensors: timing it alone times the write only. Here the fetch side copies
every tensor into the receiver's own preallocated tensors (what the generator's `load_state_dict` does, on
`--device`), so every byte is read. Both measured in this run (best of `--repeats`). Prints publish, fetch + load and
the copy, and ends with `RESULT ratio=… store_gb_s=… copy_gb_s=…` where ratio = store bandwidth / copy bandwidth.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from infra.weightsync import FSWeightStore, default_store_root  # noqa: E402


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
    root = args.root or str(default_store_root(f"bench-{os.getpid()}"))
    store = FSWeightStore(root, keep=1)
    version = iter(range(10**6))

    device = torch.device(args.device)
    receiver = {k: torch.empty_like(t, device=device) for k, t in state.items()}  # the generator's weights
    split = {"publish": [], "fetch": []}

    def load_into_receiver(got: dict[str, torch.Tensor]) -> None:
        for name, t in got.items():
            receiver[name].copy_(t)  # reads every byte of the mapped file
        if device.type == "cuda":
            torch.cuda.synchronize()

    def sync():
        v = next(version)
        t0 = time.perf_counter()
        store.publish(v, state)
        t1 = time.perf_counter()
        _, got = store.fetch(v)
        load_into_receiver(got)
        split["publish"].append(t1 - t0)
        split["fetch"].append(time.perf_counter() - t1)

    copy_s = best_of(lambda: load_into_receiver(state), args.repeats)  # the colocated ideal: one copy of each byte
    store_s = best_of(sync, args.repeats)
    assert all(torch.equal(receiver[k].cpu(), state[k]) for k in state), "the receiver holds the published weights"
    for p in store.root.iterdir():
        p.unlink()
    store.root.rmdir()
    print(f"state dict: {gb * 1000:.0f} MB in {len(state)} tensors; store at {root}; receiver on {device}")
    print(f"{'method':<28} {'seconds':>8} {'GB/s':>8}")
    print(f"{'direct copy into receiver':<28} {copy_s:>8.3f} {gb / copy_s:>8.2f}")
    print(f"{'fs store publish + fetch':<28} {store_s:>8.3f} {gb / store_s:>8.2f}")
    for part, times in split.items():
        print(f"{'  of which ' + part:<28} {min(times):>8.3f} {gb / min(times):>8.2f}")
    print(f"RESULT ratio={copy_s / store_s:.2f} store_gb_s={gb / store_s:.2f} copy_gb_s={gb / copy_s:.2f}")


if __name__ == "__main__":
    main()
