"""A malformed dataset row is named when the config is loaded: before Prefect or any worker starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config_checks import load_config


def write_gsm8k(path: Path, bad_line: int | None = None) -> Path:
    rows = [json.dumps({"question": f"{i}+1=", "answer": f"#### {i + 1}"}) for i in range(40)]
    if bad_line is not None:
        rows[bad_line - 1] = "{not json"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_malformed_row_fails_the_config_check_with_file_and_line(tmp_path):
    path = write_gsm8k(tmp_path / "train.jsonl", bad_line=7)
    # the recipe's teacher re-solves generated sums: a file of problems has none (sft.drop_carry 0)
    overrides = {"dataset.kind": "gsm8k", "dataset.path": str(path), "eval.num_prompts": 8, "sft.drop_carry": 0}
    with pytest.raises(ValueError, match=r"train.jsonl:7: invalid JSON.*dataset.on_error: skip"):
        load_config("configs/grpo_math_tiny.yaml", overrides)
    assert load_config("configs/grpo_math_tiny.yaml", {**overrides, "dataset.on_error": "skip"})


def test_cli_names_the_row_without_a_traceback_and_starts_nothing(tmp_path):
    path = write_gsm8k(tmp_path / "train.jsonl", bad_line=3)
    out = subprocess.run([str(Path(sys.executable).with_name("forgeflow")), "grpo", "--config",
                          "configs/grpo_math_tiny.yaml", "--dataset.kind", "gsm8k", "--dataset.path", str(path),
                          "--sft.drop_carry", "0"],
                         capture_output=True, text=True, env={"FORGEFLOW_HOME": str(tmp_path / "home"),
                                                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2
    assert "train.jsonl:3: invalid JSON" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "home" / "runs").exists()


def test_a_dataset_is_read_once_per_process_until_its_file_changes(tmp_path, monkeypatch):
    from infra import components as C

    path = write_gsm8k(tmp_path / "train.jsonl")
    cfg = load_config("configs/grpo_math_tiny.yaml", {"dataset.kind": "gsm8k", "dataset.path": str(path),
                                                      "eval.num_prompts": 8, "sft.drop_carry": 0})
    reads = []
    real = C.read_splits
    monkeypatch.setattr(C, "read_splits", lambda c: reads.append(1) or real(c))
    first, second = C.load_splits(cfg), C.load_splits(cfg)
    assert reads == [] and first == second  # the config check above already read it
    first[0].pop()  # callers get their own lists: the cached split is untouched
    assert len(C.load_splits(cfg)[0]) == 32
    path.write_text(path.read_text() + '{"question": "9+1=", "answer": "#### 10"}\n')
    assert len(C.load_splits(cfg)[0]) == 33 and reads == [1]
