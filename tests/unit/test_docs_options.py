"""The options table of "Running a topology" (docs/how-to/run.md) is the one
docs/hooks.py makes from ``transactional run``'s parser, and names every flag of
``transactional run --help`` and no other; the refusals the page prints are what the
command prints."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs import ROOT, example
from transactional.cli import main
from transactional.cli._parser import build_parser

FLAG = re.compile(r"(?<![\w-])-{1,2}[a-z][a-z0-9-]*")


def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_on_the_page() -> str:
    made = hooks()
    text = made.OPTIONS_PAGE.read_text()
    begin, end = text.find(made.OPTIONS_BEGIN), text.find(made.OPTIONS_END)
    assert 0 <= begin < end, f"{made.OPTIONS_PAGE}: the options' markers are missing"
    return text[begin + len(made.OPTIONS_BEGIN) : end].strip() + "\n"


def test_the_page_holds_the_table_the_parser_makes() -> None:
    assert table_on_the_page() == hooks().run_options(), (
        "docs/how-to/run.md's options are stale: run `python docs/hooks.py`"
    )


def test_the_table_names_every_flag_of_run_help_and_no_other() -> None:
    """Before: a table by hand, without --guarantee, --no-ledger, --ledger-strict or
    --remote."""
    helped = build_parser().commands["run"].format_help()
    options = helped.split("\noptions:\n", 1)[1]  # not the usage's or the help texts'
    shown = {m.group(1) for m in re.finditer(r"^  (-[-\w]+)", options, re.M)}
    shown |= set(re.findall(r"^  -[-\w]+, (--[\w-]+)", options, re.M))  # -v, --verbose
    shown -= {"-h", "--help"}
    rows = [line.split(" | ")[0] for line in table_on_the_page().splitlines()[2:]]
    in_table = {flag for row in rows for flag in FLAG.findall(row)}
    assert in_table == shown
    assert {"--guarantee", "--no-ledger", "--ledger-strict", "--remote"} <= in_table


def test_the_refusals_the_page_prints_are_the_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    printed = example("docs/how-to/run.md", "unknown flag --max-pendng", "").code.splitlines()
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("TRANSACTIONAL_")]:
        monkeypatch.delenv(name)
    with pytest.raises(SystemExit):
        main(["run", "my_topology:build", "--topology-id", "payments", "--max-pendng", "2"])
    flag = capsys.readouterr().err
    monkeypatch.setenv("TRANSACTIONAL_MAX_PENDNG", "2")
    assert main(["run", "my_topology:build", "--topology-id", "payments"]) == 2
    variable = capsys.readouterr().err
    assert printed == [flag.rstrip("\n"), variable.rstrip("\n")]
