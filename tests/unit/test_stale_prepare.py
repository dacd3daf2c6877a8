"""A prepared batch of another txid never reaches a sink: both counter committers
refuse it, alone and in a group, before they touch their store (neither is opened
here: a refusal that came later would fail on the closed connection instead)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from committers.delta import DeltaCommitter
from committers.delta._committer import DeltaBatch
from committers.redis import RedisCommitter
from committers.redis._batch import RedisBatch
from committers.tables import CounterTable
from transactional.errors import CommitError
from transactional.types import TransactionAttempt

COUNTERS = {"words": CounterTable("word_counts", ("word",))}


def committers(tmp_path: Path) -> list[tuple[Any, type]]:
    return [
        (RedisCommitter("redis://127.0.0.1:1", COUNTERS), RedisBatch),
        (DeltaCommitter(str(tmp_path / "tables"), COUNTERS), DeltaBatch),
    ]


def test_a_stale_batch_is_refused_alone(tmp_path: Path) -> None:
    for committer, batch in committers(tmp_path):
        with pytest.raises(CommitError) as refused:
            committer.commit(TransactionAttempt(3, 7), batch(2))
        assert str(refused.value) == (
            "prepared batch is for txid 2, commit was asked for txid 3: a stale prepare "
            "result reached commit"
        )


def test_a_stale_member_is_refused_in_a_group(tmp_path: Path) -> None:
    attempts = [TransactionAttempt(t, t) for t in (4, 5, 6)]
    for committer, batch in committers(tmp_path):
        with pytest.raises(CommitError) as refused:
            committer.commit_group(attempts, [batch(4), None, batch(5)])
        assert "prepared batch is for txid 5, commit was asked for txid 6" in str(refused.value)
