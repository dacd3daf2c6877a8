"""The rules of the code's layout that no other test would notice breaking
(docs/architecture.md, Layers): no import circle among the core's modules, the imports
made only for type checking included; the state machine changed only inside it, by
its events; no class renamed by a rewrite of its ``__module__``. Read from the code's
own syntax trees, so a breach is named by file and line."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ("transactional", "coordinators", "committers")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> dict[str, Path]:
    return {module_name(p): p for d in CORE for p in sorted((ROOT / d).rglob("*.py"))}


def imports(path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The core modules ``path`` imports, anywhere in it (a function's body and an
    ``if TYPE_CHECKING:`` block too); a package it lies inside is not counted."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me and not me.startswith(name + "."):
                yield name


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle_through_a_type_checking_import() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_core() -> None:
    modules = core_modules()
    assert "transactional.runtime.machine" in modules and "committers.delta" in modules
    graph = {name: set(imports(path, modules)) for name, path in modules.items()}
    assert "transactional.runtime.invariants" in graph["transactional.runtime.machine"]
    assert circles(graph) == []


def assignments(path: Path) -> Iterator[tuple[int, ast.expr]]:
    """Every target ``path`` assigns to (``=``, ``+=``, an annotated assignment), with
    its line."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield node.lineno, target
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            yield node.lineno, node.target


def owner(target: ast.expr) -> str:
    """The text of what holds an assigned attribute or item: ``self.machine`` for
    ``self.machine.stopping = True``."""
    while isinstance(target, ast.Subscript):
        target = target.value
    return ast.unparse(target.value) if isinstance(target, ast.Attribute) else ""


def test_the_machine_is_written_only_by_itself() -> None:
    machine = ROOT / "transactional" / "runtime" / "machine.py"
    writes = [
        f"{path.relative_to(ROOT)}:{line}: {ast.unparse(target)}"
        for path in core_modules().values()
        if path != machine
        for line, target in assignments(path)
        if owner(target).split(".")[-1] == "machine"
    ]
    assert writes == []


def test_no_class_is_renamed_by_its_module() -> None:
    renames = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in core_modules().values()
        for line, target in assignments(path)
        if isinstance(target, ast.Attribute) and target.attr == "__module__"
    ]
    assert renames == []
