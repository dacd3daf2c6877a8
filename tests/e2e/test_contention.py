"""Live runners of one topology in contention (``tests.contention``): the leader frozen
past its session, partitioned from ZooKeeper while it keeps its sinks, and its session
expired, in turn, while the other runners take over; no write of a deposed leader lands
in Redis or Delta, by each sink's own history, and both are exact record by record.

Rotated: the Delta tables local or in the S3 stand-in, two or three runners, and the
faults' order (every fault in every contest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contention import FAULTS, contest, say

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SHAPES = [
    pytest.param("local", 3, 0, id="local-3-runners"),
    pytest.param("s3", 2, 1, id="s3-2-runners"),
    pytest.param("local", 2, 2, id="local-2-runners"),
    pytest.param("s3", 3, 0, id="s3-3-runners"),
]


@pytest.mark.rotated(slices=4)  # one contest a run: every shape in four runs
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("where", "runners", "turn"), SHAPES)
def test_deposed_leaders_write_nothing_while_the_others_take_over(
    where: str,
    runners: int,
    turn: int,
    zk_hosts: str,
    redis_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # In S3: a bucket of the stand-in, its settings in the environment the runners get.
    delta = (
        f"s3://{request.getfixturevalue('s3_bucket')}/delta"
        if where == "s3"
        else str(tmp_path / "delta")
    )
    order = [FAULTS[(turn + i) % len(FAULTS)] for i in range(len(FAULTS))]
    done = contest(
        zk_hosts=zk_hosts,
        redis_url=redis_url,
        delta_path=delta,
        workdir=tmp_path,
        faults=order,
        runners=runners,
        tweets=900,
        seed=7 + turn,
        say=say,
    )
    assert [d.fault for d in done.deposals] == order
    assert len({d.leader for d in done.deposals}) == len(order)  # a new leader each time
