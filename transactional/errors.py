"""One root, a small tree under it. Messages say what to change."""

from __future__ import annotations

import sys
from dataclasses import dataclass


class TransactionalError(Exception):
    """Root of every error this framework raises on purpose."""


class ConfigurationError(TransactionalError):
    """Bad configuration, detected at start before any state is touched."""


class TopologyValidationError(ConfigurationError):
    """The topology's wiring is wrong (unknown stream, cycle, mode mismatch)."""


class ContractError(ConfigurationError):
    """A spout or bolt returned what its contract forbids (not a DataFrame, metadata of
    the wrong type or that JSON cannot hold, a batch without the columns a bolt reads).
    The same code gives the same answer on every attempt, so the runner never retries it.
    """


@dataclass(eq=False)
class LedgerError(ContractError):
    """A bolt that accounts for its records (``Bolt.accounts``) lost or duplicated some
    of a txid's (``transactional.ledger``): its code does so on every attempt of that
    batch, so the runner stops before anything of the txid is committed."""

    bolt: str
    source: str
    streams: tuple[str, ...]
    txid: int
    given: int
    accounted: int
    #: The first records lost or multiplied (at most five), by source position (by their
    #: values, from a spout without ``position_columns``).
    named: tuple[str, ...] = ()
    #: How many records were lost or multiplied in all (0: not known).
    miscounted: int = 0

    def __post_init__(self) -> None:
        #: Records given and not accounted for (negative: accounted for more than once).
        self.unaccounted = self.given - self.accounted
        streams = " and ".join(repr(s) for s in self.streams)
        where = f"stream {streams}" if len(self.streams) == 1 else f"streams {streams} together"
        if self.unaccounted > 0:
            what = f"{self.unaccounted} record(s) unaccounted for"
        elif self.unaccounted < 0:
            what = f"{-self.unaccounted} record(s) accounted for more than once"
        else:
            what = (
                "as many records accounted for as given, but not the same ones: some lost, "
                "as many others duplicated"
            )
        if self.named:
            more = self.miscounted - len(self.named)
            what += f" ({', '.join(self.named)}{f' and {more} more' if more > 0 else ''})"
        super().__init__(
            f"ledger: {self.bolt} on {where}, txid {self.txid}: {what}; given {self.given} "
            f"from {self.source}, accounted for {self.accounted} (carried with their id, "
            "folded, sent to dead letters or dropped with a reason). Nothing of the txid was "
            "committed. Make every branch of the bolt account for its records (a filter's "
            "other side, rows a join drops or multiplies), or turn the ledger off (--no-ledger)"
        )


class SparkAnalysisError(ContractError):
    """Spark's analysis refused a plan a spout, bolt or committer built (a column that
    does not resolve, a type mismatch, a missing table or function): the same code
    builds the same plan on every attempt, so the runner never retries it.
    ``classify`` is the one place that tells such an error from one a retry can fix."""

    def __init__(self, who: str, error_class: str, message: str, fix: str) -> None:
        self.who = who
        self.error_class = error_class
        super().__init__(f"{who} built a plan Spark refuses ({error_class}): {message}; {fix}")

    @staticmethod
    def classify(error: BaseException) -> str | None:
        """Spark's error class when ``error`` is an analysis error no retry can fix:
        ``pyspark.errors.AnalysisException`` (classic and Spark Connect alike, its
        subclasses among them) under a named class. Spark's unnamed ones
        (``_LEGACY_ERROR_*``, among them a Hive metastore that cannot be reached) and
        every other error (a lost executor, the network, Spark Connect's gRPC) are
        left to the retries."""
        errors = sys.modules.get("pyspark.errors")  # not imported: not Spark's error
        if errors is None or not isinstance(error, errors.AnalysisException):
            return None
        condition = error.getCondition()
        if not condition or condition.startswith("_LEGACY_ERROR"):
            return None
        return str(condition)


class NondeterministicSpoutError(ContractError):
    """A replay of a transactional or partitioned spout's txid held other records than
    its first emit (``RunnerConfig.check_determinism``): the runner stops before any sink
    sees the replay."""


class SourceDataLostError(ConfigurationError):
    """A source no longer holds records that a stored batch refers to (a Kafka range
    deleted by retention, a trimmed stream): a replayable spout cannot replay that batch
    exactly, and no retry can bring the records back, so the run stops at once."""


class SourceSchemaError(ConfigurationError):
    """A source's data no longer has the schema the topology reads (a new Parquet file
    with other columns, a CSV header naming other columns, a Delta table whose schema
    changed): its records cannot be given as the batches before them were, and no
    retry can change that, so the run stops at once."""


class CoordinatorError(TransactionalError):
    """The state store or the coordination around it failed."""


class UnknownTopologyError(ConfigurationError):
    """A read-only look at a topology id that the state store holds nothing for."""

    def __init__(self, topology_id: str, where: str, known: list[str]) -> None:
        self.topology_id = topology_id
        self.known = known
        listed = ", ".join(known) if known else "none"
        super().__init__(
            f"no topology {topology_id!r} in {where}; topologies there: {listed}. Check "
            "--topology-id and the store's location (--state-dir or --zookeeper)"
        )


class LostLeadershipError(CoordinatorError):
    """This runner is no longer the leader of its topology id and must not commit."""


class FencedError(LostLeadershipError):
    """A write was refused because another runner advanced the state since we read it."""


class StoreUnavailableError(CoordinatorError):
    """The state store cannot be reached."""


class EmitError(TransactionalError):
    """A spout failed to produce a batch."""


class CommitError(TransactionalError):
    """A committer failed to write a batch, or found the sink in a state it cannot accept."""


class AttemptTimeoutError(TransactionalError):
    """An attempt did not finish within its timeout; its Spark jobs were cancelled."""


class InjectedFault(TransactionalError):
    """A failure injected on purpose by a fault plan (tests, ``--fail-rate``)."""


class BatchConfigurationError(ConfigurationError):
    """A txid failed with a ``ConfigurationError``: no retry can fix that, so the runner
    stopped at its first attempt instead of backing off ``max_attempts`` times."""

    def __init__(self, txid: int, metadata: object, cause: BaseException, phase: str) -> None:
        self.txid = txid
        self.metadata = metadata
        self.cause = cause
        self.phase = phase
        stored = "not stored" if metadata is None else f"metadata={metadata!r}"
        super().__init__(
            f"txid {txid} cannot run ({phase}): {type(cause).__name__}: {cause}. This is a "
            f"configuration or code error, so it was not retried; {stored}. Fix it and "
            "start the runner again: it resumes from this txid, nothing is lost."
        )


class PoisonBatchError(TransactionalError):
    """A txid failed on every one of its attempts; the runner stopped and kept its state."""

    def __init__(self, txid: int, metadata: object, cause: BaseException, attempts: int) -> None:
        self.txid = txid
        self.metadata = metadata
        self.cause = cause
        self.attempts = attempts
        super().__init__(
            f"txid {txid} failed on all {attempts} attempts; metadata={metadata!r}; "
            f"last cause: {type(cause).__name__}: {cause}. The stored state is unchanged: "
            "remove the cause and start the runner again to resume from this txid."
        )
