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

from tests.jvm import short_lived

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
#: interpreter (the README's ``.venv/``) is the one running the tests, and the
#: ``transactional`` command is its module.
SHELL_NAMES = {".venv/bin/python": sys.executable}
COMMAND = "transactional"


def run_shell(
    block: Block,
    cwd: Path,
    replace: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    watching: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> list[str]:
    """Run each command line of shell ``block`` in ``cwd`` as a user would type it (the
    project importable, as from its checkout; ``env``: the environment instead of this
    process's), after ``replace`` (e.g. the docs' broker address by the test's); a
    comment after ``#`` is the docs' own. Every command must exit 0; returns what each
    printed. A command holding a key of ``watching`` runs until it stops by itself only
    when interrupted (``status --watch``): it is interrupted (SIGINT, as Ctrl-C) once
    it has printed that key's text, and must then exit 0."""
    base = short_lived({**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)})
    printed = []
    for line in block.code.splitlines():
        command = line.split(" #", 1)[0].strip()
        if not command or command.startswith("#"):
            continue
        for old, new in {**SHELL_NAMES, **(replace or {})}.items():
            command = command.replace(old, new)
        argv = shlex.split(command)
        if argv[0] == COMMAND:
            argv = [sys.executable, "-m", "transactional.cli", *argv[1:]]
        waits = [text for key, text in (watching or {}).items() if key in command]
        if waits:
            printed.append(_interrupted(argv, cwd, base, waits[0], f"{block.page}:{block.line}"))
            continue
        done = subprocess.run(
            argv, cwd=cwd, env=base, capture_output=True, text=True, timeout=timeout
        )
        where = f"{block.page}:{block.line}: {command}"
        assert done.returncode == 0, f"{where}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        printed.append(done.stdout)
    return printed


def _interrupted(argv: list[str], cwd: Path, env: Mapping[str, str], text: str, where: str) -> str:
    """Run ``argv`` with its live display on (``TTY_COMPATIBLE``: as on a terminal)
    until it has printed ``text`` (within a minute), then interrupt it; its output."""
    import signal
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "out"
        with log.open("w") as out:
            proc = subprocess.Popen(
                argv, cwd=cwd, env={**env, "TTY_COMPATIBLE": "1"}, stdout=out, stderr=out
            )
        deadline = time.monotonic() + 60
        try:
            while text not in log.read_text() and proc.poll() is None:
                assert time.monotonic() < deadline, f"{where}: {argv} printed no {text!r}"
                time.sleep(0.1)
            assert proc.poll() is None, f"{where}: {argv} exited {proc.returncode} by itself"
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0, f"{where}: {argv} exited {proc.returncode}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return log.read_text()


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
