"""The floors of DESIGN.md, read from the code: forge_core ← infra ← workers ← runtime ← tasks ← flows ← cli. An import
only points down (or sideways within a floor), and no modules import each other in a circle.

Every import counts, also those inside functions; a module run as a program (`if __name__ == "__main__":`) is an
entry point, which hands over with runpy rather than importing upwards.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOORS = ["forge_core", "infra", "workers", "runtime", "tasks", "flows", "cli"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for floor in FLOORS for p in (ROOT / floor).rglob("*.py")}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports (a `from pkg import name` of a submodule counts as that submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {m: imported_modules(p, known) - {m} for m, p in modules.items()}


def floor_of(module: str) -> int:
    return FLOORS.index(module.split(".")[0])


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if floor_of(b) > floor_of(a))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_faces(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the arrows from a package to its own submodules (an __init__ that hands names on)."""
    return {m: {t for t in targets if not t.startswith(m + ".")} for m, targets in graph.items()}


def test_every_import_points_down_the_floors():
    graph = import_graph()
    assert len(graph) > 80 and any(graph.values())
    assert arrows_up(graph) == []


def test_no_modules_import_each_other_in_a_circle():
    assert circles(package_faces(import_graph())) == []


def test_the_checks_can_fail():
    graph = {"forge_core.a": {"infra.b"}, "infra.b": {"infra.c"}, "infra.c": {"infra.b"}}
    assert arrows_up(graph) == ["forge_core.a -> infra.b"]
    assert circles(graph) == [["infra.b", "infra.c"]]
