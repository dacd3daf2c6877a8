"""The testing example (docs/how-to/testing.md) runs as printed, after the topology it
tests (docs/concepts/topologies.md), on Spark and the SQLite store, and leaves the sink
exact after its crash and resume."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.docs import example
from tests.integration.test_docs_topology import topology_example
from transactional.faults import FaultPoint


def the_testing_example() -> str:
    return example("docs/how-to/testing.md", "TopologyHarness").code


@pytest.mark.integration
def test_the_testing_example_crashes_resumes_and_counts_every_word_once(
    spark: object,
) -> None:
    code = topology_example().code + "\n" + the_testing_example()
    namespace: dict[str, Any] = {"__name__": "docs_testing_example"}
    exec(compile(code, "docs/how-to/testing.md", "exec"), namespace)

    words, sink, harness = namespace["WORDS"], namespace["sink"], namespace["harness"]
    txids = -(-len(words) // 100)
    assert txids == 3  # the plan's crash at txid 3 must be the last txid's commit
    assert sink.counts == Counter(words) and sink.last_txid == txids
    first, second = harness.runs
    assert first.injected == [
        (FaultPoint.EMIT, 1, 1),
        (FaultPoint.AFTER_SINK_WRITE, 2, 1),
        (FaultPoint.BEFORE_SINK_WRITE, 3, 1),
    ]
    assert first.stats.committed_txids == 2 and first.stats.failures == 2
    assert second.injected == [] and second.stats.committed_txids == 1
