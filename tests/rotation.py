"""Rotation: where CI runs a part of a product of cases too costly to run whole every
time, the part is chosen by a seed.

- The crash chains' kills (chain x protocol step, ``make test-slow``): every run keeps
  every chain and the kill into a group, and a third of the other steps per chain; the
  chains of a spout kind, a place or a commit mode take different thirds, so every run
  kills at every step on the opaque spout, on Spark Connect and in each commit mode
  (``tests/e2e/test_crash_matrix.py``). The weaker guarantees' four chains (a guarantee
  in a commit mode) take different fifths (``tests/e2e/test_guarantee_crashes.py``).
- The Spark Connect suite's variations (``make connect-test``) and those of the tests
  marked ``rotated`` (``make test``, ``make test-slow``): every test runs, with half of its
  parameters (``variations``), or a smaller part where its marker says
  (``rotated(slices=N)``, at most five).
- The occasional cases: those marked ``exhaustive`` (the remaining value types, modes
  and formats of kinds every run covers) and, on Spark Connect, ``connect_full``
  (variations whose Connect path another case covers): a fifth of them a run
  (``occasional``).

A part is a slice of ``slices`` (2, 3 or 5) that moves on with the seed, so ``slices``
consecutive seeds run every cell. The seed is printed at the end of the run with the
command that reruns its selection.

- ``--rotation all`` (the default of a plain ``pytest``): every cell.
- ``--rotation N``: the selection of seed N.
- ``--rotation auto`` (the make targets, CI): the number in ``.ci/seed``, which each
  submission to CI raises by one, so consecutive CI runs take consecutive seeds and
  every cell is run within as many of them as its case has slices (at most five).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The seed of ``auto``: the number of the submission CI runs.
SEED_FILE = ROOT / ".ci" / "seed"
#: Halves, unless a case says otherwise: a cell runs when its parity matches the seed's.
SLICES = 2
#: The part of the occasional cases a run takes (``occasional``): CI's limit of five
#: consecutive runs to run every cell.
RARE = 5


@dataclass(frozen=True)
class Rotation:
    #: None: every cell.
    seed: int | None

    def takes(self, phase: int, index: int, slices: int = SLICES) -> bool:
        """Whether this run takes cell ``index`` of a case whose ``phase`` (0 to
        ``slices`` - 1) sets which slice it runs under a seed: cases of one kind get
        different phases, so that each seed still covers every index across them."""
        return self.seed is None or (self.seed + phase + index) % slices == 0

    def describe(self, command: str) -> str:
        """The line a rotated run ends with (``seed`` set)."""
        return (
            f"rotation: seed {self.seed}; this selection again: {command} "
            f"ROTATION={self.seed}; every cell: ROTATION=all"
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
    """The number in ``SEED_FILE``."""
    try:
        return int(SEED_FILE.read_text().strip())
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(
            f"--rotation auto: no seed in {SEED_FILE} ({exc}); give a number or all"
        ) from None


Step = TypeVar("Step")


def kills(
    chosen: Rotation, chain: Sequence[Step], always: Step, phase: int, slices: int
) -> list[Step]:
    """The steps of a crash ``chain`` a run kills at, in the chain's order: ``always``
    and the ``slices``-th part of the others this seed gives ``phase``."""
    rotating = [step for step in chain if step != always]
    return [s for s in chain if s == always or chosen.takes(phase, rotating.index(s), slices)]


def variations(
    items: Sequence[pytest.Item], chosen: Rotation
) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(kept, dropped): of each test function's parametrized variations, the half this
    seed takes (at least one: a test with one variation always runs), or the part its
    ``rotated(slices=N)`` marker says. The phase of a function comes from its name, so
    that the halves of different functions differ."""
    functions: dict[str, list[pytest.Item]] = {}
    for item in items:
        functions.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
    kept: list[pytest.Item] = []
    for name, variants in functions.items():
        marker = variants[0].get_closest_marker("rotated")
        slices = marker.kwargs.get("slices", SLICES) if marker is not None else SLICES
        phase = zlib.crc32(name.encode()) % slices
        if len(variants) == 1:
            kept.extend(variants)
            continue
        kept.extend(v for n, v in enumerate(variants) if chosen.takes(phase, n, slices))
    return _split(items, {id(item) for item in kept})


def occasional(
    items: Sequence[pytest.Item], chosen: Rotation
) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(kept, dropped): of the cases most runs leave out (``exhaustive``, and
    ``connect_full`` on Connect), the ``RARE``-th part this seed takes, by their place in
    the order of their ids: so consecutive cases (a test's variations) fall in different
    runs, and ``RARE`` consecutive seeds run each once."""
    order = sorted(items, key=lambda item: item.nodeid)
    return _split(items, {id(item) for n, item in enumerate(order) if chosen.takes(0, n, RARE)})


def _split(
    items: Sequence[pytest.Item], taken: set[int]
) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(kept, dropped) of ``items`` in their order: kept those whose ``id`` is taken."""
    return [i for i in items if id(i) in taken], [i for i in items if id(i) not in taken]


def of(config: pytest.Config) -> Rotation:
    rotation: Rotation = config.stash[KEY]
    return rotation


KEY = pytest.StashKey[Rotation]()
