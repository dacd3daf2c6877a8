"""The public surface matches the docs: every name README.md and docs/ import from the
framework is importable where they import it from and listed in that module's
``__all__`` (a module without one is re-exported by its package); what the docs and
users catch or call is re-exported by a package; no ``__all__`` lists a private name;
``py.typed`` ships with each package."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import transactional.errors

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("transactional", "committers", "coordinators")
#: The packages whose imports in the docs are checked.
DOCUMENTED = (*PACKAGES, "examples")
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def doc_imports() -> Iterator[tuple[str, str, str]]:
    """``(document, module, name)`` for every ``from module import name`` of the
    framework in a ```python block of the docs."""
    for doc in documents():
        for block in FENCE.findall(doc.read_text(encoding="utf-8")):
            for node in ast.walk(ast.parse(block, filename=str(doc))):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.level == 0
                    and node.module is not None
                    and node.module.split(".")[0] in DOCUMENTED
                ):
                    for alias in node.names:
                        yield doc.relative_to(ROOT).as_posix(), node.module, alias.name


IMPORTS = sorted(set(doc_imports()))


def exported(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    assert isinstance(names, list), f"{module.__name__} has no __all__ list"
    return names


def test_the_docs_import_the_framework() -> None:
    # Guards the parametrised test below against finding nothing to check.
    modules = {module.split(".")[0] for _, module, _ in IMPORTS}
    assert {"transactional", "committers", "coordinators"} <= modules, modules


@pytest.mark.parametrize(("doc", "module", "name"), IMPORTS)
def test_a_name_the_docs_import_is_public_there(doc: str, module: str, name: str) -> None:
    assert not any(part.startswith("_") for part in module.split(".")), (doc, module)
    imported = importlib.import_module(module)
    assert hasattr(imported, name), f"{doc}: {module} has no {name}"
    if hasattr(imported, "__path__") or hasattr(imported, "__all__"):
        assert name in exported(imported), f"{doc}: {name} is not in {module}.__all__"
    else:
        package = importlib.import_module(module.rpartition(".")[0])
        assert name in exported(package), (
            f"{doc}: {module}.{name} is not re-exported by {package.__name__}.__all__"
        )


#: What a user calls or subclasses that the docs name without importing it in a block.
NAMED = [
    ("transactional", "AdaptiveBatchSize"),
    ("transactional", "BatchSizeConfig"),
    ("transactional", "create_spark_session"),
    ("transactional.testing", "CommitterContract"),
    ("transactional.testing", "SinkUnderTest"),
]


@pytest.mark.parametrize(("package", "name"), NAMED)
def test_a_package_exports_what_users_call(package: str, name: str) -> None:
    module = importlib.import_module(package)
    assert name in exported(module) and hasattr(module, name), (package, name)


def test_every_error_is_exported_by_the_package() -> None:
    errors = {
        name
        for name, value in vars(transactional.errors).items()
        if inspect.isclass(value)
        and issubclass(value, transactional.errors.TransactionalError)
        and value.__module__ == transactional.errors.__name__
    }
    assert "FencedError" in errors and "SourceDataLostError" in errors
    assert errors - set(exported(transactional)) == set()
    import transactional as package

    for name in errors:
        assert getattr(package, name) is getattr(transactional.errors, name)


def literal_all(path: Path) -> list[str] | None:
    """A module's ``__all__``, read without importing it (None: it has none)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                assert node.value is not None
                names = ast.literal_eval(node.value)
                assert isinstance(names, list), path
                return names
    return None


def test_no_all_lists_a_private_name() -> None:
    listed = {
        path.relative_to(ROOT).as_posix(): names
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (names := literal_all(path)) is not None
    }
    assert "transactional/__init__.py" in listed and "committers/redis/__init__.py" in listed
    private = {path: [n for n in names if n.startswith("_")] for path, names in listed.items()}
    assert {path: names for path, names in private.items() if names} == {}


def test_every_package_ships_py_typed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    data = config["tool"]["setuptools"]["package-data"]
    for package in PACKAGES:
        assert "py.typed" in data[package], package
        assert (ROOT / package / "py.typed").is_file(), package
