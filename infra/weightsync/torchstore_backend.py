"""torchstore weight store (RDMA-capable, Monarch-based). Optional: imported only when selected.

PyPI's torchstore pins torch 2.9 and a CUDA Monarch build, so it is never a requirement of forgeflow.
"""

from __future__ import annotations

import asyncio

import torch

LATEST = "policy/latest"


class TorchStoreWeightStore:
    """Same interface as FSWeightStore on top of torchstore (keys `policy/v{version}`, `policy/latest`).

    The latest version lives in the store itself, so a generator in another process sees what the trainer published.
    RDMA is torchstore's own choice: export TORCHSTORE_USE_RDMA=1 on nodes with RDMA NICs. forgeflow does not
    delete old versions from torchstore yet: `keep` is unused here."""

    def __init__(self, keep: int = 2):
        try:
            import torchstore  # noqa: F401
        except ImportError as exc:
            raise ValueError("weightsync.backend=torchstore needs the torchstore package (GPU clusters only); "
                             "install it or set weightsync.backend: fs") from exc
        self.keep = keep

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]):
        import torchstore as ts

        asyncio.run(ts.put_state_dict(state_dict, f"policy/v{version}"))
        asyncio.run(ts.put(LATEST, torch.tensor([version])))  # after the weights: never points at a partial version
        return f"policy/v{version}"

    def fetch(self, version: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
        import torchstore as ts

        version = self.latest() if version is None else version
        if version is None:
            raise KeyError("torchstore weight store is empty: nothing was published yet")
        try:
            return version, asyncio.run(ts.get_state_dict(f"policy/v{version}"))
        except KeyError as exc:
            raise KeyError(f"weight version {version} is not in torchstore ({exc})") from exc

    def latest(self) -> int | None:
        import torchstore as ts

        try:
            return int(asyncio.run(ts.get(LATEST))[0])
        except KeyError:
            return None

    def close(self) -> None:
        pass
