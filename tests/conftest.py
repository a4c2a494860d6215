import os
import tempfile

# everything a test run writes (runs, Prefect's database, weight stores) goes to a scratch home, not ./.forgeflow
os.environ.setdefault("FORGEFLOW_HOME", tempfile.mkdtemp(prefix="forgeflow-tests-"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # each pytest-xdist worker gets its own home below the session's: tests that look for "the new run" or count a
    # registry's rows must not see the other worker's, and SQLite files are not shared between writers
    os.environ["FORGEFLOW_HOME"] = os.path.join(os.environ["FORGEFLOW_HOME"], os.environ["PYTEST_XDIST_WORKER"])

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # tests share two cores with each other's helpers; one thread is fastest here


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
