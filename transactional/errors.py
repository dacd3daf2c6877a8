"""One root, a small tree under it. Messages say what to change."""

from __future__ import annotations

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

    def __post_init__(self) -> None:
        #: Records given and not accounted for (negative: accounted for more than once).
        self.unaccounted = self.given - self.accounted
        named = " and ".join(repr(s) for s in self.streams)
        where = f"stream {named}" if len(self.streams) == 1 else f"streams {named} together"
        if self.unaccounted > 0:
            what = f"{self.unaccounted} record(s) unaccounted for"
        elif self.unaccounted < 0:
            what = f"{-self.unaccounted} record(s) accounted for more than once"
        else:
            what = (
                "as many records accounted for as given, but not the same ones (some lost, "
                "as many others duplicated)"
            )
        super().__init__(
            f"ledger: {self.bolt} on {where}, txid {self.txid}: {what}; given {self.given} "
            f"from {self.source}, accounted for {self.accounted} (carried with their id, "
            "folded, sent to dead letters or dropped with a reason). Nothing of the txid was "
            "committed. Make every branch of the bolt account for its records (a filter's "
            "other side, rows a join drops or multiplies), or turn the ledger off (--no-ledger)"
        )


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
