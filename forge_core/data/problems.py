"""Problem records and loaders for GSM8K-format and MATH-format data (local JSONL/parquet or a hub dataset)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from forge_core.rewards.math import find_boxed, parse_target

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Problem:
    """One question with its full reference solution and its final answer (`target`, a number as text); a generated
    sum also keeps its `terms`, so that a teacher can solve it again (not part of its identity: a sum written to a
    file and read back is the same problem)."""

    question: str
    solution: str
    target: str
    terms: tuple[int, ...] = field(default=(), compare=False)


@dataclass
class ProblemSet:
    """Loaded problems plus the rows skipped as malformed (`source:line: reason`)."""

    problems: list[Problem]
    skipped: list[str] = field(default_factory=list)
    source: str = ""


FORMATS = {"gsm8k": ("question", "answer"), "math": ("problem", "solution")}


def row_to_problem(row: dict, fmt: str) -> Problem:
    """Convert one raw row; raises ValueError describing what is wrong with it."""
    q_key, a_key = FORMATS[fmt]
    if not isinstance(row, dict):
        raise ValueError(f"row is {type(row).__name__}, expected an object with keys {q_key!r}, {a_key!r}")
    missing = [k for k in (q_key, a_key) if not isinstance(row.get(k), str) or not row.get(k).strip()]
    if missing:
        raise ValueError(f"missing or empty key(s) {missing} (format {fmt!r} needs {q_key!r} and {a_key!r})")
    solution = row[a_key]
    if fmt == "gsm8k":
        if "####" not in solution or parse_target(solution) is None:
            raise ValueError(f"answer has no '#### <number>' final line: {solution[-60:]!r}")
        target = solution.rsplit("####", 1)[1].strip().replace(",", "")
    else:
        boxed = find_boxed(solution)
        if boxed is None:
            raise ValueError("solution has no \\boxed{...} final answer")
        target = boxed.strip()
    return Problem(question=row[q_key].strip(), solution=solution, target=target)


def read_rows(path: Path) -> list[tuple[int, object]]:
    """(line number, parsed row) pairs from a .jsonl/.json/.parquet file; a JSON syntax error keeps its line."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(i + 1, row) for i, row in enumerate(pq.read_table(path).to_pylist())]
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return [(i + 1, row) for i, row in enumerate(data)]
    rows: list[tuple[int, object]] = []
    with path.open() as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                rows.append((lineno, exc))
    return rows


def load_problems(path: str | Path, fmt: str = "gsm8k", on_error: str = "raise", limit: int | None = None) -> ProblemSet:
    """Load a local GSM8K/MATH file; malformed rows raise (naming file and line) or are skipped and counted."""
    if fmt not in FORMATS:
        raise ValueError(f"dataset.format {fmt!r} unknown; choose one of {sorted(FORMATS)}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"dataset.on_error must be 'raise' or 'skip'; got {on_error!r}")
    path = Path(path)
    if not path.exists():
        raise ValueError(f"dataset.path {str(path)!r} does not exist; make one with `forgeflow data make-arith --out {path}`")
    result = ProblemSet([], [], str(path))
    for lineno, row in read_rows(path):
        try:
            if isinstance(row, Exception):
                raise ValueError(f"invalid JSON: {row}")
            result.problems.append(row_to_problem(row, fmt))
        except ValueError as exc:
            where = f"{path}:{lineno}: {exc}"
            if on_error == "raise":
                raise ValueError(where + " (fix the row or set dataset.on_error: skip)") from None
            result.skipped.append(where)
        if limit is not None and len(result.problems) >= limit:
            break
    if result.skipped:
        log.warning("%s: skipped %d malformed rows (first: %s)", path, len(result.skipped), result.skipped[0])
    return result


def load_hub_problems(name: str, split: str, fmt: str = "gsm8k", config: str | None = "main",
                      on_error: str = "raise") -> ProblemSet:
    """Load a Hugging Face dataset by name (needs network and the `datasets` package: `pip install forgeflow[hub]`)."""
    try:
        import datasets
    except ImportError as exc:
        raise ValueError(f"dataset {name!r} needs the `datasets` package: pip install 'forgeflow[hub]'") from exc
    rows = datasets.load_dataset(name, config, split=split)
    result = ProblemSet([], [], f"hub:{name}/{split}")
    for i, row in enumerate(rows):
        try:
            result.problems.append(row_to_problem(dict(row), fmt))
        except ValueError as exc:
            if on_error == "raise":
                raise ValueError(f"{name}[{split}] row {i}: {exc}") from None
            result.skipped.append(f"{name}[{split}] row {i}: {exc}")
    return result
