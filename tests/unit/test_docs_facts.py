"""What the docs state of the runner and the sources is what the code does, where a
test can tell: the idle poll back-off on a busy source (docs/concepts/topologies.md),
and the unit of ``--batch-size`` for each ready-made source, the same in
``transactional run --help`` (so in run.md's options) and on the source's page."""

from __future__ import annotations

import pytest

from tests.docs import ROOT
from transactional.cli.settings import BY_NAME
from transactional.config import RunnerConfig
from transactional.runtime.machine import Machine
from transactional.runtime.messages import (
    Emit,
    NotReady,
    Opened,
    Processed,
    Started,
    Tick,
    Verified,
)
from transactional.types import TransactionAttempt as A


def test_the_poll_back_off_goes_on_mid_stream_as_the_docs_say() -> None:
    """The page's example: with the defaults, txid 1 processes for 10 s while the source
    has nothing beyond it; txid 2 is asked for at 0, 1, 3 and 7 s, then at 15 s, though
    txid 1's records set the wait back at 10 s."""
    page = " ".join((ROOT / "docs" / "concepts" / "topologies.md").read_text().split())
    assert "asked for at 0, 1, 3 and 7 s, and then at 15 s" in page
    machine = Machine(RunnerConfig(topology_id="docs"))
    machine.step(Opened(1, frozenset()), 0.0)
    assert machine.step(Started(A(1, 1)), 0.0) == [Emit(A(2, 2), 1)]
    asked, now = [], 0.0
    while now < 10.0:  # txid 2 is not ready at each poll
        asked.append(now)
        assert machine.step(NotReady(2), now) == []
        now = machine.poll_at
        if now < 10.0:
            (emit,) = machine.step(Tick(), now)
            assert isinstance(emit, Emit) and emit.attempt.txid == 2
    assert asked == [0.0, 1.0, 3.0, 7.0]
    machine.step(Processed(A(1, 1), 5, empty=False), 10.0)
    machine.step(Verified(A(1, 1)), 10.0)  # txid 1 held records: the wait is reset
    assert machine.poll_interval == 1.0
    assert not [c for c in machine.step(Tick(), 14.9) if isinstance(c, Emit)]
    (emit,) = [c for c in machine.step(Tick(), 15.0) if isinstance(c, Emit)]
    assert emit.attempt.txid == 2


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
