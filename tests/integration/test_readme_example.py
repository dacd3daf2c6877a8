"""The README's user-defined topology runs as printed and counts exactly."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.readme import every_bolt_checked
from transactional.ledger import ID, with_ids

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    section = README.read_text().split("## Define your own topology", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README lost its example"
    return match.group(1)


@pytest.mark.integration
def test_readme_example_counts_every_word_once(spark: object) -> None:
    namespace: dict[str, object] = {"__name__": "readme_example"}
    with every_bolt_checked():
        exec(compile(readme_example(), str(README), "exec"), namespace)
    words = namespace["WORDS"]
    assert isinstance(words, list)
    sink = namespace["sink"]
    assert sink.counts == Counter(words)  # type: ignore[attr-defined]
    assert sink.last_txid == -(-len(words) // 100)  # type: ignore[attr-defined]


@pytest.mark.integration
def test_readme_prebuilt_columns_bolt_splits_every_batch_with_the_same_columns(
    spark: object,
) -> None:
    section = README.read_text().split("### Columns built once", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README lost its Prebuilt example"
    namespace: dict[str, object] = {"__name__": "readme_prebuilt"}
    exec(compile(match.group(1), str(README), "exec"), namespace)
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
