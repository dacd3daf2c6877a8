"""The user-defined topology of "Topologies" (docs/concepts/topologies.md) runs as
printed and counts exactly; so does its bolt with columns built once."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.docs import Block, every_bolt_checked, example
from transactional.ledger import ID, with_ids

PAGE = "docs/concepts/topologies.md"


def topology_example() -> Block:
    return example(PAGE, "class WordSpout(TransactionalSpout[Offsets])")


@pytest.mark.integration
def test_the_topology_example_counts_every_word_once(spark: object) -> None:
    namespace: dict[str, object] = {"__name__": "docs_example"}
    with every_bolt_checked():
        exec(topology_example().compiled(), namespace)
    words = namespace["WORDS"]
    assert isinstance(words, list)
    sink = namespace["sink"]
    assert sink.counts == Counter(words)  # type: ignore[attr-defined]
    assert sink.last_txid == -(-len(words) // 100)  # type: ignore[attr-defined]


@pytest.mark.integration
def test_the_prebuilt_columns_bolt_splits_every_batch_with_the_same_columns(
    spark: object,
) -> None:
    namespace: dict[str, object] = {"__name__": "docs_prebuilt"}
    exec(example(PAGE, "from transactional.spark import Prebuilt").compiled(), namespace)
    bolt = namespace["Words"]()  # type: ignore[operator]
    texts = [["a b", "b"], ["c a a"]]
    built = []
    for txid, lines in enumerate(texts, start=1):
        plain = spark.createDataFrame([(t,) for t in lines], "text string")  # type: ignore[attr-defined]
        batch = with_ids(plain)  # as the runner gives an accounting bolt its batch
        rows = bolt.process(txid, batch).collect()
        assert Counter(r.word for r in rows) == Counter(w for t in lines for w in t.split(" "))
        # Each text carried by one word (its first): the ledger counts it once.
        carried = Counter(r[ID] for r in rows if r[ID] is not None)
        assert sorted(carried.values()) == [1] * len(lines)
        built.append(bolt._columns(batch))
    assert built[0] is built[1]  # the second batch reused the first one's columns


@pytest.mark.integration
def test_the_bolt_planned_once_is_called_once_and_counts_every_batch(
    spark: object, tmp_path: object
) -> None:
    from tests.integration.test_plan_once import PlannedRows, harness
    from tests.integration.topologies import RangeSpout

    namespace: dict[str, object] = {"__name__": "docs_plan_once"}
    exec(example(PAGE, "plan_once = True  # the same plan").compiled(), namespace)
    bolt_class = namespace["Hundreds"]
    calls: list[int] = []

    class Counted(bolt_class):  # type: ignore[misc, valid-type]
        def process(self, attempt: object, batch: object) -> object:
            calls.append(1)
            return super().process(attempt, batch)

    sink = PlannedRows()
    run = harness(spark, tmp_path, Counted(), sink, spout=lambda: RangeSpout(500, 100))
    run.run_until_drained(max_pending=1, warm_up=False)
    counts: Counter[int] = Counter()
    for row in sink.rows["default"]:
        counts[row["hundred"]] += row["count"]
    assert counts == Counter(n // 100 for n in range(500)) and sink.last_txid == 5
    assert len(calls) == 1
