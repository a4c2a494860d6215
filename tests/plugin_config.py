"""A config file on disk that lists plugins: the only way a run may name import paths (infra/plugins.py)."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_plugin_config(directory: Path, plugins: list[str], base: str = "configs/grpo_math_tiny.yaml") -> str:
    """`base` plus `plugins: [...]`, written under `directory`; returns its path."""
    data = yaml.safe_load(Path(base).read_text())
    path = Path(directory) / "with-plugins.yaml"
    path.write_text(yaml.safe_dump({**data, "plugins": list(plugins)}, sort_keys=False))
    return str(path)
