"""The small value types every other module speaks in."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict


@dataclass(frozen=True, order=True, slots=True)
class TransactionAttempt:
    """One (re)emission of a txid. A new ``attempt_id`` is drawn for every emission,
    so anything that carries a stale attempt can be recognised and ignored."""

    txid: int
    attempt_id: int

    def __str__(self) -> str:
        return f"{self.txid}.{self.attempt_id}"


class BatchMetadata(BaseModel):
    """Base of spout metadata: small, immutable and JSON-serialisable.

    It must say exactly which records form a batch (e.g. an offset and a count),
    because a replay rebuilds the batch from it alone.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")


M = TypeVar("M", bound=BatchMetadata)


class SpoutKind(StrEnum):
    """Storm's three spout kinds (``transactional.spout``): one batch per txid, a batch
    per partition per txid, or per-partition batches that need not replay the same."""

    TRANSACTIONAL = "transactional"
    PARTITIONED = "partitioned"
    OPAQUE = "opaque"


class CommitMode(StrEnum):
    """How a committer makes a replay exact: ``TRANSACTIONAL`` skips a txid the sink holds
    (the replay is the same batch); ``OPAQUE`` undoes the txid's earlier attempt first
    (the replay may differ), keeping the value before it."""

    TRANSACTIONAL = "transactional"
    OPAQUE = "opaque"


class Guarantee(StrEnum):
    """What a run promises about each source record (``RunnerConfig.guarantee``)."""

    #: Every record counted once, whatever fails: the full protocol.
    EXACTLY_ONCE = "exactly_once"
    #: Nothing lost; a batch replayed after its sink write is counted again.
    AT_LEAST_ONCE = "at_least_once"
    #: Nothing counted twice; a failed batch is dropped, counted and logged, never retried.
    AT_MOST_ONCE = "at_most_once"


class CommitOutcome(StrEnum):
    """What a committer did with a txid. A duplicate is an outcome, not an error."""

    APPLIED = "applied"
    SKIPPED = "skipped"  # transactional mode: the sink already holds this txid
    REAPPLIED = "reapplied"  # opaque mode: the txid's earlier attempt was undone, then applied


JsonValue = Any


def dump_meta(meta: BatchMetadata) -> dict[str, JsonValue]:
    return meta.model_dump(mode="json")


def load_meta(cls: type[M], value: JsonValue) -> M:
    return cls.model_validate(value)
