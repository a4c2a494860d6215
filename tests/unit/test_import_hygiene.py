"""forge_core must stay pure PyTorch: importing any of its modules pulls in no orchestration/tracking/db package."""

import pkgutil
import subprocess
import sys

import forge_core

FORBIDDEN = ("prefect", "mlflow", "sqlalchemy", "submitit", "vllm")


def all_modules():
    return [m.name for m in pkgutil.walk_packages(forge_core.__path__, "forge_core.")]


def test_forge_core_imports_nothing_forbidden():
    modules = all_modules()
    assert len(modules) > 10
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted(k for k in sys.modules if k.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"forge_core pulled in: {out.stdout.strip()}"


def test_the_check_can_fail():
    code = "import sys; sys.modules['prefect'] = object(); print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
