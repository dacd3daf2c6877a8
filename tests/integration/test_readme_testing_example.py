"""The README's testing example runs as printed, after the topology it tests, on Spark
and the SQLite store, and leaves the sink exact after its crash and resume."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.integration.test_readme_example import README, readme_example
from transactional.faults import FaultPoint


def readme_testing_example() -> str:
    section = README.read_text().split("## Testing your topology", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "TopologyHarness" in block, "the README lost its testing example"
    return block


@pytest.mark.integration
def test_readme_testing_example_crashes_resumes_and_counts_every_word_once(
    spark: object,
) -> None:
    code = readme_example() + "\n" + readme_testing_example()
    namespace: dict[str, Any] = {"__name__": "readme_testing_example"}
    exec(compile(code, str(README), "exec"), namespace)

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
