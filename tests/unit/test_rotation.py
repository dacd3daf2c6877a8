"""The rotation (``tests/rotation.py``): what a rotated run of the crash chains still
kills, and that two consecutive seeds kill every chain at every step (counted from the
chains' names and the protocol's steps, not from the selection's own code); the Connect
suite's variations halved, every test still run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

import pytest

from tests.e2e import test_crash_matrix as matrix
from tests.e2e import test_guarantee_crashes as guarantees
from tests.rotation import Rotation, parse, variations
from transactional.faults import FaultPoint

EVERY_STEP = {(point, txid) for point, txid in matrix.CHAIN}
#: The commit mode of each spout kind's sinks in the chains.
MODE = {"partitioned": "transactional", "transactional": "transactional", "opaque": "opaque"}


def killed(seed: int | None, chains: dict[str, int]) -> dict[str, set[tuple[FaultPoint, int]]]:
    return {name: set(matrix.steps(Rotation(seed), phase)) for name, phase in chains.items()}


def group(kills: dict[str, set[tuple[FaultPoint, int]]], key: str) -> dict[str, set]:
    """The steps killed by chain ``spout-place``'s ``key``: its spout, place or mode."""
    out: dict[str, set] = {}
    for name, steps in kills.items():
        spout, _, place = name.partition("-")
        by = {"spout": spout, "place": place or "local", "mode": MODE[spout]}[key]
        out.setdefault(by, set()).update(steps)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 1234])
def test_every_run_kills_at_every_step_on_every_spout_place_and_mode(seed: int) -> None:
    kills = killed(seed, matrix.PHASES)
    assert set(kills) == set(matrix.CHAINS)
    for key, wanted in (
        ("spout", {"transactional", "partitioned", "opaque"}),
        ("place", {"local", "s3", "connect"}),
        ("mode", {"transactional", "opaque"}),
    ):
        by = group(kills, key)
        assert set(by) == wanted
        assert all(steps == EVERY_STEP for steps in by.values()), (key, by)
    for name, steps in kills.items():  # a half (3 of 6) and the group kill: 4 of 7
        assert (FaultPoint.AFTER_SINK_WRITE, 2) in steps, name
        assert len(steps) == 4, (name, steps)
    # The weaker guarantees: both halves between them, each with a kill after a write.
    both = killed(seed, guarantees.PHASES)
    assert set().union(*both.values()) == EVERY_STEP
    assert all((FaultPoint.AFTER_SINK_WRITE, 2) in steps for steps in both.values())


@pytest.mark.parametrize("seed", [0, 41])
def test_two_consecutive_seeds_kill_every_chain_at_every_step(seed: int) -> None:
    for chains in (matrix.PHASES, guarantees.PHASES):
        first, second = killed(seed, chains), killed(seed + 1, chains)
        for name in chains:
            assert first[name] | second[name] == EVERY_STEP, name
            assert first[name] != second[name]
        assert killed(None, chains) == dict.fromkeys(chains, EVERY_STEP)


def test_a_chains_kills_keep_the_protocols_order() -> None:
    for seed in (0, 1):
        for phase in (0, 1):
            kills = matrix.steps(Rotation(seed), phase)
            assert kills == sorted(kills, key=matrix.CHAIN.index)


def test_a_seed_that_is_not_a_number_is_refused() -> None:
    assert parse("all") == Rotation(None)
    assert parse("12") == Rotation(12)
    with pytest.raises(pytest.UsageError, match="not a seed; give a number, auto or all"):
        parse("twelve")


@dataclass(frozen=True)
class Item:
    nodeid: str


def test_each_test_keeps_half_of_its_variations_and_two_seeds_run_them_all() -> None:
    items = [
        *(Item(f"tests/a.py::test_sinks[{s}]") for s in ("redis", "delta")),
        *(Item(f"tests/a.py::test_kinds[{k}]") for k in ("one", "two", "three")),
        Item("tests/a.py::test_alone"),
        Item("tests/b.py::TestDelta::test_mode[opaque]"),
        Item("tests/b.py::TestDelta::test_mode[transactional]"),
    ]
    functions = {item.nodeid.split("[")[0] for item in items}
    runs = []
    for seed in (6, 7):
        kept, dropped = variations(cast(Any, items), Rotation(seed))
        assert sorted(map(id, kept + dropped)) == sorted(map(id, items))  # each once
        assert {item.nodeid.split("[")[0] for item in kept} == functions  # every test runs
        assert Item("tests/a.py::test_alone") in kept
        per = Counter(item.nodeid.split("[")[0] for item in kept)
        assert per.pop("tests/a.py::test_kinds") in (1, 2)  # of three
        assert per == dict.fromkeys(functions - {"tests/a.py::test_kinds"}, 1)  # one of two
        assert [i for i in items if i in kept] == kept  # in the collection's order
        runs.append(set(kept))
    assert runs[0] | runs[1] == set(items)
    assert runs[0] & runs[1] == {Item("tests/a.py::test_alone")}
    assert variations(cast(Any, items), Rotation(None)) == (items, [])
