"""The tweet demo's commands in "Getting started" (docs/getting-started.md), run as
printed from an empty directory: the Delta tables and the tops ``show`` prints hold
exactly the counts of the generated tweets, counted here in Python; the same tweets
loaded into Kafka and counted from there give the same counts. And what ``make demo``
runs counts its own sample exactly."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.docs import ROOT, Block, example, run_shell
from tests.processes import printed_tops
from tests.reference import expected_counts
from transactional.testing.servers import KafkaServer

pytestmark = pytest.mark.e2e
PAGE = "docs/getting-started.md"


def hashtags(delta: Path) -> Counter[str]:
    rows = DeltaTable(str(delta / "hashtags")).to_pyarrow_table().to_pylist()
    return Counter({r["hashtag"]: r["count"] for r in rows})


def test_the_demos_commands_count_exactly(kafka: KafkaServer, tmp_path: Path) -> None:
    *_, show = run_shell(example(PAGE, "generate --count", "sh"), tmp_path)
    expected = expected_counts(tmp_path / "data" / "tweets")
    assert expected.tweets and hashtags(tmp_path / ".transactional" / "delta") == expected.hashtags
    printed = printed_tops(show)[("", "top hashtags")]
    top = sorted(expected.hashtags.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    assert printed == top

    # The docs' broker is the test's, and the topic one of this test's own.
    topic = f"tweets-{uuid.uuid4().hex[:8]}"
    replace = {"127.0.0.1:9092": kafka.bootstrap_servers, "--topic tweets": f"--topic {topic}"}
    run_shell(example(PAGE, "load --input data/tweets --kafka", "sh"), tmp_path, replace)
    assert hashtags(tmp_path / "kafka-state" / "delta") == expected.hashtags


@pytest.mark.slow
def test_make_demos_command_counts_its_sample_exactly(tmp_path: Path) -> None:
    """What ``make demo`` runs once installed (its recipe, read from the Makefile), from
    an empty directory: the sample it generates counted exactly into its Delta tables."""
    makefile = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1]
    recipe = makefile.split("\n")[1].strip().lstrip("@")
    assert recipe == "$(BIN)/python -m examples.tweets run --until-drained", recipe
    command = recipe.replace("$(BIN)/python", ".venv/bin/python")
    run_shell(Block("Makefile", 0, "sh", command), tmp_path)
    state = tmp_path / ".transactional"
    expected = expected_counts(state / "sample")
    assert expected.tweets and hashtags(state / "delta") == expected.hashtags
