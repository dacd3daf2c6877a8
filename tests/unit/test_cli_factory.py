"""``transactional run MODULE:FACTORY`` finds the module as ``python -m`` would (the
current directory first) and refuses, with exit 2 and one line naming it, a module that
is missing or fails to import, a factory that is not one, and what is not a Topology.
``status`` and ``list`` on a store that is not there create nothing."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from transactional.cli import main
from transactional.cli._factories import load_factory
from transactional.errors import ConfigurationError


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The current directory, as the user's project; sys.path and sys.modules restored."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("user_"):
            del sys.modules[name]


def unique(prefix: str = "user_") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def test_a_module_in_the_current_directory(project: Path) -> None:
    name = unique()
    (project / f"{name}.py").write_text("def build():\n    return 'built'\n")
    assert load_factory(f"{name}:build")() == "built"
    assert sys.path[0] == str(project)


def test_a_package_module_in_the_current_directory(project: Path) -> None:
    name = unique()
    (project / name).mkdir()
    (project / name / "__init__.py").write_text("")
    (project / name / "jobs.py").write_text("def build():\n    return 'nested'\n")
    assert load_factory(f"{name}.jobs:build")() == "nested"


def test_a_missing_module(project: Path) -> None:
    name = unique()
    with pytest.raises(ConfigurationError) as missing:
        load_factory(f"{name}:build")
    assert str(missing.value) == (
        f"cannot import the topology module {name!r}: not found from {project} or the "
        "installed packages; run from the directory that holds it, or install it"
    )
    (project / name).mkdir()
    (project / name / "__init__.py").write_text("")
    with pytest.raises(ConfigurationError) as submodule:
        load_factory(f"{name}.jobs:build")
    assert str(submodule.value).startswith(f"cannot import the topology module '{name}.jobs': ")


def test_a_module_whose_own_import_fails_shows_that_error(project: Path) -> None:
    """Even when the missing module's name is a prefix of the topology module's."""
    name = unique()
    (project / f"{name}_job.py").write_text(f"import {name}\n")
    with pytest.raises(ConfigurationError) as dependency:
        load_factory(f"{name}_job:build")
    assert str(dependency.value) == (
        f"the topology module '{name}_job' failed to import: ModuleNotFoundError: No module "
        f"named '{name}'; install what it imports"
    )
    (project / f"{name}_bad.py").write_text("VALUE = 1 / 0\n")
    with pytest.raises(ConfigurationError) as raised:
        load_factory(f"{name}_bad:build")
    assert str(raised.value) == (
        f"the topology module '{name}_bad' failed to import: ZeroDivisionError: division by zero"
    )


@pytest.mark.parametrize("spec", ["user_mod", "user_mod:", ":build"])
def test_a_spec_without_module_and_function(project: Path, spec: str) -> None:
    with pytest.raises(ConfigurationError) as bad:
        load_factory(spec)
    assert str(bad.value) == f"{spec!r}: give the topology factory as module:function"


def test_a_name_that_is_not_a_function(project: Path) -> None:
    name = unique()
    (project / f"{name}.py").write_text("build = 3\n")
    with pytest.raises(ConfigurationError) as bad:
        load_factory(f"{name}:build")
    assert str(bad.value) == (
        f"{name!r} (imported from {project / f'{name}.py'}) has no function 'build'; the "
        "factory is module:function, returning a Topology"
    )


@pytest.mark.parametrize(
    ("source", "line"),
    [
        (
            "def build():\n    return None\n",
            "error: topology factory '{name}:build' returned NoneType, not a Topology: return "
            "TopologyBuilder()...build()",
        ),
        (
            "def build(spark, store):\n    pass\n",
            "error: topology factory '{name}:build' takes 2 arguments; it must take none "
            "(recommended) or one, the SparkSession",
        ),
        (
            "import not_installed_anywhere\n",
            "error: the topology module '{name}' failed to import: ModuleNotFoundError: No "
            "module named 'not_installed_anywhere'; install what it imports",
        ),
    ],
    ids=["returns-none", "two-arguments", "import-fails"],
)
def test_run_refuses_a_bad_factory_with_exit_2_and_one_line(
    project: Path, capsys: pytest.CaptureFixture[str], source: str, line: str
) -> None:
    name = unique()
    (project / f"{name}.py").write_text(source)
    code = main(["run", f"{name}:build", "--topology-id", "t"])
    assert code == 2
    assert capsys.readouterr().err == line.format(name=name) + "\n"
    assert sorted(p.name for p in project.iterdir()) == [f"{name}.py"]  # no store created


def test_status_and_list_of_a_missing_store_create_nothing(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's bug: a mistyped --state-dir silently created a new database."""
    for args in (["status", "--topology-id", "t"], ["list"]):
        for where in ([], ["--state-dir", "stat-dir"]):
            assert main([*args, *where]) == 2
            path = project / (where[1] if where else ".transactional") / "state.db"
            assert capsys.readouterr().err == (
                f"error: there is no SQLite state store at {path.relative_to(project)} (no "
                "such file); check --state-dir: a run creates the store there\n"
            )
    assert list(project.iterdir()) == []


@pytest.mark.parametrize("name", ["numbers", "json.tool", "email.parser"])
def test_a_module_named_like_a_standard_library_one(project: Path, name: str) -> None:
    top = name.partition(".")[0]
    (project / f"{top}.py").write_text("def build():\n    return 'mine'\n")
    with pytest.raises(ConfigurationError) as hidden:
        load_factory(f"{name}:build")
    assert str(hidden.value) == (
        f"the topology module {name!r} is named like Python's own module {top!r}, which it "
        f"would hide from everything imported after it: rename {top}.py"
    )
    assert str(project) not in sys.path  # refused before the directory was put on the path
