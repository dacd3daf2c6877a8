"""The rotation (``tests/rotation.py``): what a rotated run of the crash chains still
kills, and that three consecutive seeds kill every chain at every step (counted from the
chains' names and the protocol's steps, not from the selection's own code); the
variations of the Connect suite and of the tests marked rotated halved, every test still
run; the seed of ``auto`` read from ``.ci/seed``."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests import rotation
from tests.cluster import test_chaos_campaign as campaign
from tests.e2e import test_crash_matrix as matrix
from tests.e2e import test_guarantee_crashes as guarantees
from tests.rotation import Rotation, occasional, parse, variations
from transactional.faults import FaultPoint

EVERY_STEP = {(point, txid) for point, txid in matrix.CHAIN}
#: The commit mode of each spout kind's sinks in the chains.
MODE = {"partitioned": "transactional", "transactional": "transactional", "opaque": "opaque"}


def killed(
    seed: int | None, chains: dict[str, int], slices: int = matrix.SLICES
) -> dict[str, set[tuple[FaultPoint, int]]]:
    return {
        name: set(matrix.steps(Rotation(seed), phase, slices)) for name, phase in chains.items()
    }


def group(kills: dict[str, set[tuple[FaultPoint, int]]], key: str) -> dict[str, set]:
    """The steps killed by chain ``spout-place``'s ``key``: its spout, place or mode."""
    out: dict[str, set] = {}
    for name, steps in kills.items():
        spout, _, place = name.partition("-")
        by = {"spout": spout, "place": place or "local", "mode": MODE[spout]}[key]
        out.setdefault(by, set()).update(steps)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 1234])
def test_every_run_kills_at_every_step_on_the_opaque_spout_on_connect_and_in_each_mode(
    seed: int,
) -> None:
    kills = killed(seed, matrix.PHASES)
    assert set(kills) == set(matrix.CHAINS)
    assert set().union(*kills.values()) == EVERY_STEP
    by_spout, by_place, by_mode = (group(kills, key) for key in ("spout", "place", "mode"))
    assert set(by_spout) == {"transactional", "partitioned", "opaque"}
    assert set(by_place) == {"local", "s3", "connect"}
    assert by_spout["opaque"] == by_place["connect"] == EVERY_STEP
    assert by_mode == {"transactional": EVERY_STEP, "opaque": EVERY_STEP}
    # Two thirds of the other steps elsewhere, and the group kill on every chain.
    for steps in (*by_spout.values(), *by_place.values()):
        assert len(steps) >= 1 + 2 * (len(EVERY_STEP) - 1) // 3, steps
    for name, steps in kills.items():  # a third (2 of 6) and the group kill: 3 of 7
        assert (FaultPoint.AFTER_SINK_WRITE, 2) in steps, name
        assert len(steps) == 3, (name, steps)
    # The weaker guarantees: both halves between them, each with a kill after a write.
    both = killed(seed, guarantees.PHASES, slices=2)
    assert set().union(*both.values()) == EVERY_STEP
    assert all((FaultPoint.AFTER_SINK_WRITE, 2) in steps for steps in both.values())
    assert all(len(steps) == 4 for steps in both.values())
    # The overlapping commits' chain: the kill after a write, and one other.
    overlap = guarantees.overlap_steps(Rotation(seed))
    assert (FaultPoint.AFTER_SINK_WRITE, 2) in overlap and len(overlap) == 2


@pytest.mark.parametrize("seed", [0, 41])
def test_consecutive_seeds_kill_every_chain_at_every_step(seed: int) -> None:
    for chains, slices in ((matrix.PHASES, 3), (guarantees.PHASES, 2)):
        runs = [killed(seed + k, chains, slices) for k in range(slices)]
        for name in chains:
            assert set().union(*(run[name] for run in runs)) == EVERY_STEP, name
            assert len({frozenset(run[name]) for run in runs}) == slices  # each run differs
        assert killed(None, chains, slices) == dict.fromkeys(chains, EVERY_STEP)
    overlaps = [set(guarantees.overlap_steps(Rotation(seed + k))) for k in range(3)]
    assert set().union(*overlaps) == set(guarantees.OVERLAP_CHAIN)
    assert guarantees.overlap_steps(Rotation(None)) == guarantees.OVERLAP_CHAIN


@pytest.mark.parametrize("seed", [0, 62])
def test_the_campaign_meets_one_spout_kind_a_run_and_each_within_three(seed: int) -> None:
    runs = [campaign.spouts(Rotation(seed + k)) for k in range(3)]
    assert all(len(kinds) == 1 for kinds in runs)
    assert sorted(kind for kinds in runs for kind in kinds) == sorted(matrix.SPOUTS)
    assert campaign.spouts(Rotation(None)) == campaign.KINDS


def test_a_chains_kills_keep_the_protocols_order() -> None:
    for seed in (0, 1, 2):
        for phase in (0, 1, 2):
            kills = matrix.steps(Rotation(seed), phase)
            assert kills == sorted(kills, key=matrix.CHAIN.index)
        overlap = guarantees.overlap_steps(Rotation(seed))
        assert overlap == sorted(overlap, key=guarantees.OVERLAP_CHAIN.index)


def test_a_seed_that_is_not_a_number_is_refused() -> None:
    assert parse("all") == Rotation(None)
    assert parse("12") == Rotation(12)
    with pytest.raises(pytest.UsageError, match="not a seed; give a number, auto or all"):
        parse("twelve")


def test_auto_is_the_number_ci_runs_and_a_missing_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    committed = int((Path(__file__).resolve().parents[2] / ".ci" / "seed").read_text())
    assert parse("auto") == Rotation(committed)
    monkeypatch.setattr(rotation, "SEED_FILE", tmp_path / "seed")
    with pytest.raises(pytest.UsageError, match=r"no seed in .*seed.*give a number or all"):
        parse("auto")
    (tmp_path / "seed").write_text("63\n")
    assert parse("auto") == Rotation(63)


@dataclass(frozen=True)
class Item:
    nodeid: str
    #: Its ``rotated(slices=N)`` marker's N (None: no such marker).
    slices: int | None = None

    def get_closest_marker(self, name: str) -> Any:
        if name != "rotated" or self.slices is None:
            return None
        return SimpleNamespace(kwargs={"slices": self.slices})


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


def test_a_test_marked_with_n_slices_keeps_one_in_n_and_n_seeds_run_them_all() -> None:
    items = [Item(f"tests/c.py::test_shapes[{n}]", slices=4) for n in range(4)]
    runs = [variations(cast(Any, items), Rotation(seed))[0] for seed in range(10, 14)]
    assert [len(kept) for kept in runs] == [1, 1, 1, 1]
    assert {kept[0] for kept in runs} == set(items)


def test_each_occasional_case_runs_once_in_five_consecutive_seeds() -> None:
    items = [Item(f"tests/a.py::test_kinds[{k:02}]") for k in range(12)][::-1]  # any order
    ids = sorted(item.nodeid for item in items)
    for seed in (0, 62):
        runs = []
        for k in range(5):
            kept, dropped = occasional(cast(Any, items), Rotation(seed + k))
            assert sorted(map(id, kept + dropped)) == sorted(map(id, items))  # each once
            assert len(kept) in (2, 3)  # a fifth of twelve
            # Neighbours in the ids' order (a test's variations) fall in different runs.
            places = sorted(ids.index(item.nodeid) for item in kept)
            assert all(b - a == 5 for a, b in itertools.pairwise(places)), places
            runs.append({i.nodeid for i in kept})
        assert Counter(n for run in runs for n in run) == {i.nodeid: 1 for i in items}
    assert occasional(cast(Any, items), Rotation(None)) == (items, [])
