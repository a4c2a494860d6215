"""torchstore weight store (RDMA-capable, Monarch-based). Optional: imported only when selected.

PyPI's torchstore pins torch 2.9 and a CUDA Monarch build, so it is never a requirement of forgeflow.
"""

from __future__ import annotations

import asyncio

import torch


class TorchStoreWeightStore:
    """Same interface as FSWeightStore on top of `torchstore.put/get` (keys `policy/v{version}/{name}`)."""

    def __init__(self, keep: int = 2):
        try:
            import torchstore  # noqa: F401
        except ImportError as exc:
            raise ValueError("weightsync.backend=torchstore needs the torchstore package (GPU clusters only); "
                             "install it or set weightsync.backend: fs") from exc
        self.keep = keep
        self._versions: list[int] = []

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]):
        import torchstore as ts

        asyncio.run(ts.put_state_dict(state_dict, f"policy/v{version}"))
        self._versions.append(version)
        return f"policy/v{version}"

    def fetch(self, version: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
        import torchstore as ts

        version = self._versions[-1] if version is None else version
        return version, asyncio.run(ts.get_state_dict(f"policy/v{version}"))

    def latest(self) -> int | None:
        return self._versions[-1] if self._versions else None

    def close(self) -> None:
        pass
