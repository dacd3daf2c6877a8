"""What the docs state of the runner and the sources is what the code does, where a
test can tell: when the next txid is decided and the idle poll back-off
(docs/concepts/topologies.md),
and the unit of ``--batch-size`` for each ready-made source, the same in
``transactional run --help`` (so in run.md's options) and on the source's page."""

from __future__ import annotations

import pytest

from tests.docs import ROOT
from transactional.cli.settings import BY_NAME
from transactional.config import RunnerConfig
from transactional.runtime.machine import Machine
from transactional.runtime.messages import (
    Commit,
    Emit,
    NotReady,
    Opened,
    Processed,
    Started,
    Tick,
    Verified,
)
from transactional.types import TransactionAttempt as A


def test_the_next_txid_and_the_poll_back_off_as_the_docs_say() -> None:
    """The page's example: with the defaults, txid 1 is decided after the source has
    caught up and processes for 10 s; txid 2 is asked for at 10 s, when txid 1 is
    processed, then every second; an idle source is asked at 0, 1, 3, 7 and 15 s."""
    page = " ".join((ROOT / "docs" / "concepts" / "topologies.md").read_text().split())
    assert "the next txid is asked for at 10 s, as soon as the first is processed" in page
    assert "and then every second while the first commits" in page
    assert "a source idle from 0 s is asked at 0, 1, 3, 7 and 15 s" in page
    machine = Machine(RunnerConfig(topology_id="docs"))
    machine.step(Opened(1, frozenset()), 0.0)
    assert machine.step(Started(A(1, 1), backlog=False), 0.0) == []  # caught up
    for now in (1.0, 5.0, 9.9):
        assert machine.step(Tick(), now) == []
    machine.step(Processed(A(1, 1), 5, empty=False), 10.0)
    (emit,) = machine.step(Verified(A(1, 1)), 10.0)
    assert emit == Emit(A(2, 2), 1)
    asked, now = [], 10.0
    while now < 14.0:  # txid 2 is not ready at each poll, while txid 1 commits
        asked.append(now)
        out = machine.step(NotReady(2), now)
        if now == 10.0:  # the start answered: txid 1 commits
            assert [type(c) for c in out] == [Commit] and out[0].attempt == A(1, 1)
        else:
            assert out == []
        now = machine.poll_at
        (emit,) = machine.step(Tick(), now)
        assert isinstance(emit, Emit) and emit.attempt.txid == 2
    assert asked == [10.0, 11.0, 12.0, 13.0]

    idle = Machine(RunnerConfig(topology_id="docs"))
    (emit,) = idle.step(Opened(1, frozenset()), 0.0)
    asked, now = [], 0.0
    while now < 20.0:
        asked.append(now)
        assert idle.step(NotReady(1), now) == []
        now = idle.poll_at
        (emit,) = idle.step(Tick(), now)
        assert emit.attempt.txid == 1
    assert asked == [0.0, 1.0, 3.0, 7.0, 15.0]
    assert idle.poll_interval == 30.0  # the next wait: poll_max_s


def test_with_a_backlog_the_next_txid_is_decided_while_one_processes() -> None:
    """The source ahead of the txid just decided: the next is decided at once, and a
    poll that finds nothing while txids are in flight is not backed off."""
    machine = Machine(RunnerConfig(topology_id="docs", max_pending=3))
    machine.step(Opened(1, frozenset()), 0.0)
    assert machine.step(Started(A(1, 1), backlog=True), 0.0) == [Emit(A(2, 2), 1)]
    asked, now = [], 0.0
    while now < 4.0:
        asked.append(now)
        assert machine.step(NotReady(2), now) == []
        now = machine.poll_at
        (emit,) = machine.step(Tick(), now)
        assert emit.attempt.txid == 2
    assert asked == [0.0, 1.0, 2.0, 3.0]


#: Each ready-made source's page, and its unit of ``batch_size`` as the page says it.
UNITS = {
    "kafka.md": "`batch_size` offsets per partition",
    "redis-streams.md": "`batch_size` entries per stream per txid",
    "files.md": "`batch_size` records per file per txid",
    "delta-source.md": "`batch_size` records as the log counts them",
}
#: The same unit in ``--batch-size``'s help, for the same source.
IN_HELP = {
    "kafka.md": "per partition for Kafka (offsets)",
    "redis-streams.md": "Redis Streams (entries)",
    "files.md": "partitioned or opaque files (records)",
    "delta-source.md": "a Delta table (records)",
}


@pytest.mark.parametrize("page", sorted(UNITS))
def test_batch_size_has_one_unit_per_source_on_its_page_and_in_the_help(page: str) -> None:
    """Before: "records per new txid" in run.md, "offsets per partition" in kafka.md."""
    text = " ".join((ROOT / "docs" / "how-to" / page).read_text().split())
    assert UNITS[page] in text
    assert "`--batch-size N` of `transactional" in text  # the flag sets that same size
    assert IN_HELP[page] in " ".join(BY_NAME["batch_size"].help.split())
