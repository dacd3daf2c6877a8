"""Rotation: where CI runs a part of a product of cases too costly to run whole every
time, the part is chosen by a seed.

- The crash chains' kills (chain x protocol step, ``make test-slow``): every run keeps
  every chain, and every protocol step on every spout kind, place and commit mode (the
  chains take opposite halves of the steps: ``tests/e2e/test_crash_matrix.py``).
- The Spark Connect suite's variations (``make connect-test``): every test runs, with
  half of its parameters (``variations``).

The halves alternate with the seed's parity, so two consecutive seeds run every cell.
The seed is printed at the end of the run with the command that reruns its selection.

- ``--rotation all`` (the default of a plain ``pytest``): every cell.
- ``--rotation N``: the half of seed N.
- ``--rotation auto`` (``make test-slow``, which CI runs): the commit count of ``HEAD``,
  which grows with every commit; in a shallow clone, where the count says nothing, the
  ``HEAD`` commit's time in minutes.
"""

from __future__ import annotations

import subprocess
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Halves: a cell runs when its parity matches the seed's.
SLICES = 2


@dataclass(frozen=True)
class Rotation:
    #: None: every cell.
    seed: int | None

    def takes(self, phase: int, index: int) -> bool:
        """Whether this run takes cell ``index`` of a case whose ``phase`` (0 or 1) sets
        which half it runs under a seed: cases of one kind get opposite phases, so that
        each seed still covers every index across them."""
        return self.seed is None or (self.seed + phase + index) % SLICES == 0

    def describe(self, command: str) -> str:
        """The line a rotated run ends with (``seed`` set)."""
        return (
            f"rotation: seed {self.seed} (half {self.seed % SLICES} of {SLICES}); this "
            f"selection again: {command} ROTATION={self.seed}; every cell: ROTATION=all"
        )


def parse(value: str) -> Rotation:
    if value == "all":
        return Rotation(None)
    if value == "auto":
        return Rotation(auto_seed())
    try:
        return Rotation(int(value))
    except ValueError:
        raise pytest.UsageError(
            f"--rotation: {value!r} is not a seed; give a number, auto or all"
        ) from None


def auto_seed() -> int:
    """The commit count of ``HEAD`` (the HEAD commit's time in minutes in a shallow clone)."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    try:
        if git("rev-parse", "--is-shallow-repository") == "true":
            return int(git("log", "-1", "--format=%ct")) // 60
        return int(git("rev-list", "--count", "HEAD"))
    except (OSError, subprocess.CalledProcessError) as exc:
        raise pytest.UsageError(
            f"--rotation auto: no git history here to take a seed from ({exc}); "
            "give a number or all"
        ) from None


def variations(
    items: Sequence[pytest.Item], chosen: Rotation
) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(kept, dropped): of each test function's parametrized variations, the half this
    seed takes (at least one: a test with one variation always runs). The phase of a
    function comes from its name, so that the halves of different functions differ."""
    functions: dict[str, list[pytest.Item]] = {}
    for item in items:
        functions.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    kept: list[pytest.Item] = []
    for name, variants in functions.items():
        phase = zlib.crc32(name.encode()) % SLICES
        if len(variants) == 1:
            kept.extend(variants)
            continue
        kept.extend(v for n, v in enumerate(variants) if chosen.takes(phase, n))
    keep = {id(item) for item in kept}
    return [i for i in items if id(i) in keep], [i for i in items if id(i) not in keep]


def of(config: pytest.Config) -> Rotation:
    rotation: Rotation = config.stash[KEY]
    return rotation


KEY = pytest.StashKey[Rotation]()
