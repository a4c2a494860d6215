"""Test-only: put on PYTHONPATH (by fault_helpers.hold_step_env) for a flow process a test kills or races. For each
step N in FORGEFLOW_TEST_HOLD_STEPS, the first process of the run about to record N creates `held-N` in
FORGEFLOW_TEST_HOLD_DIR and waits until the test creates `release-N` (or kills it), so whatever the test does next
lands while the run still has work left, however fast the steps are. Later processes find `held-N` and go on."""

import importlib.abc
import importlib.util
import os
import sys
import time
from pathlib import Path

HOLD_STEPS = {int(s) for s in os.environ.get("FORGEFLOW_TEST_HOLD_STEPS", "").split(",") if s}
HOLD_DIR = Path(os.environ.get("FORGEFLOW_TEST_HOLD_DIR", "."))


def hold(records_class) -> None:
    real_step = records_class.step

    def held_step(self, step, metrics):
        if step in HOLD_STEPS and not (HOLD_DIR / f"held-{step}").exists():
            (HOLD_DIR / f"held-{step}").touch()
            deadline = time.monotonic() + 300  # only bounds a test that neither kills nor releases
            while not (HOLD_DIR / f"release-{step}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        real_step(self, step, metrics)

    records_class.step = held_step


class PatchRecordsOnImport(importlib.abc.MetaPathFinder):
    """Patches infra.records when the flow imports it (importing it here would come before the CLI's own set-up)."""

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


if HOLD_STEPS and "FORGEFLOW_TEST_HOLD_DIR" in os.environ:
    sys.meta_path.insert(0, PatchRecordsOnImport())
