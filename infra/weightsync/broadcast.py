"""Collective weight broadcast: the trainer sends each published version to every generator over one process group
of their own (NCCL between GPUs, gloo on CPU) — no disk and no store in between.

Trade-offs against the `fs` store: one broadcast reaches all generators at link speed (NVLink/InfiniBand with NCCL),
but every member must stay alive: a dead generator makes the next publish fail (after `timeout_s`) and the group
cannot take in a replacement, so runs that must survive a lost worker use `fs`. The group is standalone (its own
TCPStore rendezvous), so it does not disturb the trainer's FSDP process group.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

STOP = -1  # header version that ends the receivers' loop


class BroadcastWeightSync:
    """rank 0 (the trainer): `publish(version, state_dict)`; ranks 1..N (generators): `fetch(version)` / `latest()`
    of the versions received in the background, newest `keep` kept in memory."""

    def __init__(self, address: str, rank: int, world_size: int, keep: int = 2, timeout_s: float = 600.0,
                 device: str = "cpu"):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"weight broadcast address {address!r} must be HOST:PORT")
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)
        prefixed = dist.PrefixStore("forgeflow-weights", store)
        if device == "cpu":
            self.group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        else:
            self.group = dist.ProcessGroupNCCL(prefixed, rank, world_size)
        self.rank, self.keep, self.device, self.timeout_s = rank, keep, torch.device(device), timeout_s
        self._store = store  # the TCPStore server lives in rank 0; keep it referenced
        self._versions: dict[int, dict[str, torch.Tensor]] = {}
        self._arrived = threading.Condition()
        self._error: BaseException | None = None
        self._receiver = None
        if rank > 0:
            self._receiver = threading.Thread(target=self._receive_loop, name="weight-broadcast", daemon=True)
            self._receiver.start()

    # ---- sender (rank 0) ----

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> int:
        """Broadcast `state_dict` as `version` to every receiver (blocks until they all have it)."""
        if self.rank != 0:
            raise ValueError("only rank 0 of the weight-broadcast group (the trainer) publishes")
        tensors = {k: v.detach().to(self.device).contiguous() for k, v in state_dict.items()}
        header = [version, [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in tensors.items()]]
        try:
            self._broadcast_header(header)
            for tensor in tensors.values():
                self._broadcast(tensor)
        except RuntimeError as exc:
            raise RuntimeError(f"weight broadcast of version {version} failed ({exc}); a generator in the group is "
                               "gone — the group cannot take a replacement: restart the run, or use "
                               "weightsync.backend: fs to survive lost workers") from exc
        return version

    def close(self) -> None:
        """Rank 0: tell the receivers to stop. Receivers: wait for that."""
        if self.rank == 0:
            self._broadcast_header([STOP, []])
        elif self._receiver is not None:
            self._receiver.join(self.timeout_s)

    # ---- receivers (ranks > 0) ----

    def fetch(self, version: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, state_dict) once `version` (None: the newest received) has arrived; KeyError for a version
        older than the ones kept; TimeoutError after timeout_s."""
        with self._arrived:
            ready = lambda: self._error or (self._versions and (version is None or max(self._versions) >= version))  # noqa: E731
            if not self._arrived.wait_for(ready, self.timeout_s):
                raise TimeoutError(f"weight version {version} did not arrive within {self.timeout_s} s")
            if self._error:
                raise RuntimeError(f"weight broadcast receiver failed: {self._error}") from self._error
            version = max(self._versions) if version is None else version
            if version not in self._versions:
                raise KeyError(f"weight version {version} is not kept (have {sorted(self._versions)})")
            return version, self._versions[version]

    def latest(self) -> int | None:
        with self._arrived:
            return max(self._versions) if self._versions else None

    def _receive_loop(self) -> None:
        try:
            while True:
                version, spec = self._broadcast_header(None)
                if version == STOP:
                    return
                state = {}
                for name, shape, dtype in spec:
                    state[name] = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
                    self._broadcast(state[name])
                with self._arrived:
                    self._versions[version] = state
                    for old in sorted(self._versions)[:-self.keep]:
                        del self._versions[old]
                    self._arrived.notify_all()
        except BaseException as exc:  # reported to the next fetch, which raises it
            log.exception("weight broadcast receiver stopped")
            with self._arrived:
                self._error = exc
                self._arrived.notify_all()

    # ---- wire format: a JSON header (length, then bytes), then each tensor in header order ----

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()

    def _broadcast_header(self, header):
        payload = json.dumps(header).encode() if self.rank == 0 else b""
        length = torch.tensor([len(payload)], dtype=torch.long, device=self.device)
        self._broadcast(length)
        buffer = (torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device) if self.rank == 0
                  else torch.empty(int(length.item()), dtype=torch.uint8, device=self.device))
        self._broadcast(buffer)
        return header if self.rank == 0 else json.loads(buffer.cpu().numpy().tobytes())
