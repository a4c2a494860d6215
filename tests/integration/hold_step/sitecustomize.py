"""Test-only: loaded through PYTHONPATH by a `forgeflow grpo` child of the fault tests (start_cli_run with
hold_step=N). That process waits before recording step N, so a kill the test sends after step N - 1 lands while
the run still has work left, however fast the steps are. The variable is removed at once: children (workers, the
Prefect server) never see it."""

import importlib.abc
import importlib.util
import os
import sys
import time

HOLD_STEP = int(os.environ.pop("FORGEFLOW_TEST_HOLD_STEP", "0"))


def hold(records_class) -> None:
    real_step = records_class.step

    def held_step(self, step, metrics):
        if step == HOLD_STEP:
            time.sleep(300)  # the test kills this process; the sleep only bounds a test that never does
        real_step(self, step, metrics)

    records_class.step = held_step


class PatchRecordsOnImport(importlib.abc.MetaPathFinder):
    """Patches infra.records when the CLI imports it (importing it here would come before the CLI's own set-up)."""

    def find_spec(self, name, path, target=None):
        if name != "infra.records":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            hold(module.RunRecords)

        spec.loader.exec_module = exec_and_patch
        return spec


if HOLD_STEP:
    sys.meta_path.insert(0, PatchRecordsOnImport())
