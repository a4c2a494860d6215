"""What every worker shares: its role, the run config it was built from, health, and shutdown."""

from __future__ import annotations

import os
import socket
import time

import torch

from forge_core.seeding import seed_everything
from infra import components as C
from infra.config import RunConfig


class Worker:
    """Base of GeneratorWorker, TrainerWorker, ReferenceWorker, RewardWorker: builds once, then serves calls."""

    role = "worker"

    def __init__(self, cfg: RunConfig, threads: int | None = None):
        self.cfg = cfg
        # several workers share the cores: each sets its own thread count deliberately
        torch.set_num_threads(max(1, threads or cfg.threads or 1))
        seed_everything(cfg.seed)
        self.policy_version = 0
        self.step = 0
        self.started = time.time()
        self.calls = 0

    def health(self) -> dict:
        """pid, host, role, policy version, step, uptime and threads of this worker."""
        return {"pid": os.getpid(), "host": socket.gethostname(), "node": os.environ.get("SLURMD_NODENAME"),
                "role": self.role,
                "policy_version": self.policy_version, "step": self.step, "calls": self.calls,
                "uptime_s": time.time() - self.started, "threads": torch.get_num_threads()}

    def shutdown(self) -> bool:
        """Acknowledge; the server stops after replying."""
        return True

    def await_weight_group(self, timeout_s: float | None = None) -> bool:
        """weightsync.backend broadcast: block until the weight-broadcast group this worker opened (trainer) or
        joined (generator) has formed; raises at once when it could not form. With `timeout_s`: False while it is
        still forming after that long."""
        store = getattr(self, "store", None)
        if store is None or not hasattr(store, "wait_formed"):
            raise ValueError("await_weight_group before open_weight_group / join_weight_group "
                             "(weightsync.backend: broadcast only)")
        return store.wait_formed(timeout_s)


def worker_device(cfg: RunConfig, role: str) -> torch.device:
    """cuda:LOCAL_RANK when the plan gives this role GPUs and CUDA is usable here, else cpu."""
    from workers.plan import uses_gpu

    if uses_gpu(cfg, role) and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def model_source(cfg: RunConfig, init_path: str | None = None) -> str:
    """The checkpoint a worker loads: an explicit init path, else sft.init, else model.path."""
    return init_path or cfg.sft.init or cfg.model.path


def dtype_of(cfg: RunConfig) -> torch.dtype:
    return C.DTYPES[cfg.model.dtype]
