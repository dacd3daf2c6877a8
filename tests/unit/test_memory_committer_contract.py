"""The committer contract (``transactional.testing.committer_contract``) on the in-memory
committer the runner's unit tests use: the double must keep the contract it stands in for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from transactional.testing import MemoryCommitter
from transactional.testing.committer_contract import CommitterContract, SinkUnderTest
from transactional.types import CommitMode


class MemorySink(SinkUnderTest):
    """The sink is the committer object itself: a "restart" reopens the same one."""

    def __init__(self) -> None:
        self.instances: dict[CommitMode, MemoryCommitter] = {}

    def committer(self, mode: CommitMode) -> MemoryCommitter:
        return self.instances.setdefault(mode, MemoryCommitter(mode))

    def inputs(self, counts: Mapping[str, int]) -> Mapping[str, Any]:
        return {"default": list(counts.items())}

    def read(self) -> dict[str, int]:
        (committer,) = self.instances.values()
        return {k: v for k, v in committer.counts.items() if v}


class TestMemoryCommitter(CommitterContract):
    groups = True

    @pytest.fixture
    def sink(self) -> MemorySink:
        return MemorySink()
