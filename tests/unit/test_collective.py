"""A failure on any rank of a multi-rank worker reaches the controller through rank 0 (two real gloo processes)."""

import os
import tempfile
from pathlib import Path

import torch.multiprocessing as mp

from workers.collective import collective, follow_calls


class TwoRankWorker:
    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    @collective
    def fails_on(self, rank: int) -> str:
        if self.rank == rank:
            raise ValueError(f"bad shard on rank {rank}")
        return "ok"

    @collective
    def shutdown(self) -> bool:
        return True


def run_rank(rank: int, address_file: str, results: str) -> None:
    import torch

    torch.set_num_threads(1)
    from infra.dist_store import close_job_process_group, init_job_process_group

    init_job_process_group(rank, 2, "127.0.0.1", Path(address_file), timeout_s=60)
    worker = TwoRankWorker(rank, 2)
    try:
        if rank > 0:
            follow_calls(worker)
            return
        lines = []
        for target in (1, 0, None):
            try:
                lines.append(f"{target}: {worker.fails_on(target)}")
            except Exception as exc:
                lines.append(f"{target}: {type(exc).__name__}: {exc}")
        worker.shutdown()
        Path(results).write_text("\n".join(lines))
    finally:
        close_job_process_group()


def test_a_failure_on_rank_1_is_raised_by_rank_0():
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.txt"
        mp.start_processes(run_rank, args=(str(Path(tmp) / "store.json"), str(results)), nprocs=2,
                           start_method="spawn")
        lines = results.read_text().splitlines()
    assert lines[0].startswith("1: RuntimeError: fails_on failed on rank(s) [1] of 2: rank 1: ValueError: bad shard")
    assert lines[1] == "0: ValueError: bad shard on rank 0"
    assert lines[2] == "None: ok"  # the ranks keep serving after a failed call
