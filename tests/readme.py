"""Running the README's examples as a user would: the first Python block of a section,
executed with its settings taken from the environment."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def run_readme_example(
    section: str, settings: Mapping[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Execute the first ```python block after the heading ``section`` (e.g.
    ``"### Files"``) with ``settings`` in the environment."""
    text = README.read_text().split(f"{section}\n", 1)
    assert len(text) == 2, f"the README lost its section {section!r}"
    match = re.search(r"```python\n(.*?)```", text[1], re.S)
    assert match, f"the README lost the example of {section!r}"
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    with every_bolt_checked():
        exec(compile(match.group(1), str(README), "exec"), {"__name__": "readme_example"})


@contextmanager
def every_bolt_checked() -> Iterator[None]:
    """The README's examples account for their records: a run that names a bolt the
    record ledger cannot check (its one warning at start) fails the test."""
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
