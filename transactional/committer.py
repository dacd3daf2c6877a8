"""The committer plug-in interface: where results go, idempotently and in txid order."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class CommitterContext:
    def __init__(self, spark: SparkSession | None, topology_id: str, name: str) -> None:
        self.spark = spark
        self.topology_id = topology_id
        self.name = name


class Committer(ABC):
    """Writes the results of one txid to a sink, atomically, recording the txid with them.

    The runner guarantees: ``prepare`` runs once per attempt, possibly in parallel with
    other txids' ``prepare`` and with ``commit`` of a lower txid; ``commit`` runs for
    one txid at a time, in strictly increasing txid order with no gap, except that a
    txid is committed again (same or new attempt) after a failure or restart.

    The implementation must guarantee (DESIGN.md section 6):

    - transactional mode: the sink keeps the last committed txid in the same atomic
      write as the data; a commit of ``txid <= last`` changes nothing and returns
      ``CommitOutcome.SKIPPED``;
    - opaque mode: committing ``txid == last`` first undoes everything the earlier
      attempt of that txid wrote, then applies; ``txid < last`` is a ``CommitError``.
    """

    mode: ClassVar[CommitMode] = CommitMode.TRANSACTIONAL

    def open(self, context: CommitterContext) -> None:  # noqa: B027 - optional hook
        """Called once before the first ``prepare``; check the sink is usable here so that
        bad configuration fails at start."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the runner stops."""

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]) -> Any:
        """Turn the attempt's input streams into what ``commit`` writes. Runs in the
        parallel phase, so heavy Spark work belongs here. Default: materialise each
        input once, so the rows cannot change between prepare and commit."""
        return {name: df.localCheckpoint(eager=True) for name, df in inputs.items()}

    @abstractmethod
    def commit(self, attempt: TransactionAttempt, prepared: Any) -> CommitOutcome:
        """Write ``prepared`` for ``attempt.txid`` atomically with the txid."""

    def committed_txid(self) -> int | None:
        """The last txid the sink holds (None if none). Used to resolve a commit whose
        outcome is unknown by reading the sink, never by guessing."""
        return None
