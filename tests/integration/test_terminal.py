"""What a CLI sweep prints: forgeflow's own lines (each child's steps, named by its flow run) and warnings, not
Prefect's per-task-run state lines nor its worker-thread timeout warning."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

from tests.integration.fault_helpers import ROOT, TINY

pytestmark = pytest.mark.integration


def test_a_cli_sweep_prints_each_childs_steps_and_no_prefect_chatter():
    cli = [sys.executable, "-m", "cli", "sweep", "--grid", "loss.name=dapo,gspo"]
    for key, value in {**TINY, "steps": 2}.items():
        if key != "loss.name":
            cli += [f"--{key}", json.dumps(value) if not isinstance(value, str) else value]
    env = {**os.environ, "PREFECT_HOME": tempfile.mkdtemp(prefix="prefect-sweep-cli-")}
    out = subprocess.run(cli, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-5000:]
    lines = text.splitlines()
    for loss in ("dapo", "gspo"):  # the flow-run name in each line tells the children apart
        steps = [line for line in lines if f"grpo · {loss} · " in line and "step " in line and "/2 reward" in line]
        assert len(steps) == 2, (loss, text[-5000:])
        assert any(f"grpo · {loss} · " in line and "held-out accuracy at the end" in line for line in lines)
    assert not [line for line in lines if "Finished in state" in line or "Timeout of" in line], text[-5000:]
    assert "sweep sweep-" in text and "plot:" in text  # the CLI's own summary
