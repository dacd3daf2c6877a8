"""The examples of README.md and the pages under docs/, found and run as a user would
run them: the one place that reads the pages' code blocks, for every test that runs one.

A test names a block by its page and a text only that block holds (``example``), runs it
with its settings taken from the environment (``run_example``), then checks what it did
against an answer of its own."""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: An opening fence (```python, ```sh, ``` ...) and its closing one, at a line's start.
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    """A fenced code block: its page (relative to the repository), the line of its first
    line of code, its language (``""`` when none is given) and its code."""

    page: str
    line: int
    lang: str
    code: str

    def compiled(self) -> Any:
        """The code compiled so that a traceback names the page and its line."""
        return compile("\n" * (self.line - 1) + self.code, str(ROOT / self.page), "exec")


def pages() -> list[str]:
    """README.md and every page of the site, relative to the repository."""
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


def blocks(page: str) -> list[Block]:
    """Every fenced code block of ``page``, in order."""
    text = (ROOT / page).read_text()
    return [
        Block(page, text.count("\n", 0, m.start(2)) + 1, m.group(1), m.group(2))
        for m in FENCE.finditer(text)
    ]


def example(page: str, holding: str = "", lang: str = "python") -> Block:
    """The one ``lang`` block of ``page`` whose code holds ``holding``."""
    found = [b for b in blocks(page) if b.lang == lang and holding in b.code]
    assert len(found) == 1, f"{page}: {len(found)} {lang} blocks hold {holding!r}, not one"
    return found[0]


def run_example(
    page: str,
    holding: str = "",
    settings: Mapping[str, str] | None = None,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> dict[str, Any]:
    """Execute ``example(page, holding)`` as a module of its own, with ``settings`` in the
    environment (through ``monkeypatch``, undone after the test); returns its names."""
    if settings:
        assert monkeypatch is not None, "settings need the test's monkeypatch"
        for name, value in settings.items():
            monkeypatch.setenv(name, value)
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    with every_bolt_checked():
        exec(example(page, holding).compiled(), namespace)
    return namespace


#: What a shell example names that is another thing in the tests: the project's
#: interpreter (the README's ``.venv/``) is the one running the tests.
SHELL_NAMES = {".venv/bin/python": sys.executable}


def run_shell(
    block: Block,
    cwd: Path,
    replace: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> list[subprocess.CompletedProcess[str]]:
    """Run each command line of shell ``block`` in ``cwd`` as a user would type it (the
    project importable, as from its checkout), after ``replace`` (e.g. the docs' broker
    address by the test's); a comment after ``#`` is the docs' own. Every command must
    exit 0; returns what each printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = []
    for line in block.code.splitlines():
        command = line.split(" #", 1)[0].strip()
        if not command or command.startswith("#"):
            continue
        for old, new in {**SHELL_NAMES, **(replace or {})}.items():
            command = command.replace(old, new)
        result = subprocess.run(
            shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, (
            f"{block.page}:{block.line}: {command}\n{result.stderr[-3000:]}"
        )
        done.append(result)
    return done


@contextmanager
def every_bolt_checked() -> Iterator[None]:
    """The docs' examples account for their records: a run that names a bolt the record
    ledger cannot check (its one warning at start) fails the test."""
    warned: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = warned.append  # type: ignore[method-assign]
    ledger = logging.getLogger("transactional.ledger")
    ledger.addHandler(handler)
    try:
        yield
    finally:
        ledger.removeHandler(handler)
    assert not warned, [r.getMessage() for r in warned]
