"""The lean set of planted bugs, in every CI run (``make test-slow``): three bugs of
three parts planted together (``tests.mutation``) in one pytest run of the tests that
must catch them, each of which must fail, and for its own bug's reason. ``make
mutation`` runs every bug against all its tests (``tests/MUTATION.md``)."""

from __future__ import annotations

import re

import pytest

from tests import rotation
from tests.mutation.__main__ import run_planted
from tests.mutation.bugs import MATRIX, SWAP

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

#: Bug -> (the test that must catch it, what its failure must say).
LEAN = {
    # The crash chain (rotated as this run is: each run dies after a group's sink
    # write): the replay of a group Redis held counts again, each record judged by id.
    "redis-replays-held-txid": (f"{MATRIX}[partitioned-redis]", r"redis: \d+ records?, \d+ dup"),
    # The same chain's Delta side, read from each table's own log: rows committed
    # without their txid marker.
    "delta-marker-apart": (
        f"{MATRIX}[partitioned-delta]",
        r"rows changed in a commit with no txid marker",
    ),
    # The ledger: a bolt that swaps one record for another balances by count only.
    "ledger-ignores-xor": (SWAP, r"DID NOT RAISE"),
}


@pytest.mark.timeout(1200)
def test_three_planted_bugs_are_each_caught_by_their_test(request: pytest.FixtureRequest) -> None:
    seed = rotation.of(request.config).seed
    extra = [] if seed is None else ["--rotation", str(seed)]
    targets = [target for target, _ in LEAN.values()]
    result = run_planted(list(LEAN), targets, extra)
    failed = {f["test"]: f["failure"] for f in result["failures"]}
    assert sorted(failed) == sorted(targets), (result["passed"], sorted(failed), result["log"])
    for name, (target, reason) in LEAN.items():
        assert re.search(reason, failed[target]), (name, failed[target][-20_000:])
