"""Which failures the runner retries: a ``ConfigurationError`` (or a spout or bolt
breaking its contract) stops it at the first attempt, naming the txid; metadata JSON
cannot hold is refused before the store sees it; anything else is retried up to
``max_attempts`` and then reported as a poison batch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from transactional.config import RunnerConfig
from transactional.errors import (
    BatchConfigurationError,
    CommitError,
    ConfigurationError,
    ContractError,
    PoisonBatchError,
    SparkAnalysisError,
)
from transactional.runner import TransactionalRunner
from transactional.testing import (
    CountingBolt,
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListPartitionedSpout,
    ListTransactionalSpout,
    MemoryCommitter,
    Range,
    counting_topology,
)
from transactional.topology import TopologyBuilder
from transactional.types import BatchMetadata, CommitMode, TransactionAttempt


def make_runner(
    spout: Any, committer: MemoryCommitter, store: InMemoryStateStore, **config: Any
) -> TransactionalRunner:
    topology = counting_topology(spout, committer)
    settings: dict[str, Any] = {
        "topology_id": "t",
        "max_pending": 2,
        "max_attempts": 5,
        "backoff_initial_s": 0.0,
        "backoff_max_s": 0.0,
        "poll_interval_s": 0.01,
    }
    settings.update(config)
    return TransactionalRunner(
        topology, store, config=RunnerConfig(**settings), engine=InMemoryEngine()
    )


DATA = [f"r{i % 5}" for i in range(30)]


class Flaky(MemoryCommitter):
    """Raises ``error`` from ``prepare`` of ``txid`` while ``broken``."""

    def __init__(self, txid: int, error: Exception, mode: CommitMode = CommitMode.TRANSACTIONAL):
        super().__init__(mode)
        self.txid, self.error, self.broken = txid, error, True
        self.refused = 0

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, Any]) -> Counter[Any]:
        if self.broken and attempt.txid == self.txid:
            self.refused += 1
            raise self.error
        return super().prepare(attempt, inputs)


def test_a_configuration_error_is_not_retried_and_names_the_txid() -> None:
    store = InMemoryStateStore()
    committer = Flaky(2, ConfigurationError("sink table has no column 'count': fix the schema"))
    with pytest.raises(BatchConfigurationError) as info:
        make_runner(ListTransactionalSpout(DATA, 10), committer, store, max_pending=1).run(
            until_drained=True
        )
    assert committer.refused == 1  # one attempt, although max_attempts is 5
    error = info.value
    assert error.txid == 2 and error.metadata == Range(start=10, count=10)
    assert isinstance(error.cause, ConfigurationError) and error.phase == "process"
    assert str(error).startswith("txid 2 cannot run (process): ConfigurationError: sink table")
    assert "not retried" in str(error)
    assert store.currtx == 2 and committer.counts == Counter(DATA[:10])

    committer.broken = False  # the cause removed: a restart resumes at txid 2
    make_runner(ListTransactionalSpout(DATA, 10), committer, store).run(until_drained=True)
    assert committer.counts == Counter(DATA)


def test_other_errors_are_retried_up_to_max_attempts_then_poison() -> None:
    store = InMemoryStateStore()
    committer = Flaky(2, CommitError("sink unavailable"))
    with pytest.raises(PoisonBatchError) as info:
        make_runner(
            ListTransactionalSpout(DATA, 10), committer, store, max_pending=1, max_attempts=4
        ).run(until_drained=True)
    assert committer.refused == 4
    assert info.value.txid == 2 and info.value.attempts == 4
    assert "metadata=Range(start=10, count=10)" in str(info.value)
    assert "CommitError: sink unavailable" in str(info.value)
    assert store.currtx == 2 and committer.last_txid == 1


class NotAFrame(ListTransactionalSpout):
    def emit_batch(self, attempt: TransactionAttempt, meta: Range) -> Any:  # type: ignore[override]
        super().emit_batch(attempt, meta)
        return {"rows": self.records[meta.start : meta.end]}  # not a frame of this engine


def test_a_spout_emitting_something_other_than_a_frame_stops_at_once() -> None:
    store = InMemoryStateStore()
    spout = NotAFrame(DATA, 10)
    with pytest.raises(BatchConfigurationError) as info:
        make_runner(spout, MemoryCommitter(), store, max_pending=1).run(until_drained=True)
    assert [a.txid for a, _ in spout.emits] == [1]
    assert isinstance(info.value.cause, ContractError)
    assert (
        "spout 'spout' (tests.unit.test_runner_errors.NotAFrame).emit_batch returned dict, "
        "not a pyspark.sql.DataFrame of the runner's session (txid 1)"
    ) in str(info.value)
    assert store.currtx == 1


class WrongStreams(CountingBolt):
    def process(self, attempt: TransactionAttempt, batch: list[Any]) -> Any:  # type: ignore[override]
        return {"other": super().process(attempt, batch)}


def test_a_bolt_returning_undeclared_streams_stops_at_once() -> None:
    spout = ListTransactionalSpout(DATA, 10)
    topology = (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("count", WrongStreams())
        .set_committer("sink", MemoryCommitter(), "count")
        .build()
    )
    runner = TransactionalRunner(
        topology,
        InMemoryStateStore(),
        config=RunnerConfig(topology_id="t", max_pending=1, max_attempts=5),
        engine=InMemoryEngine(),
    )
    with pytest.raises(
        BatchConfigurationError,
        match=r"bolt 'count' \(tests\.unit\.test_runner_errors\.WrongStreams\)\.process "
        r"returned streams \['other'\] \(txid 1\): missing \['default'\], undeclared \['other'\]",
    ):
        runner.run(until_drained=True)
    assert len(spout.emits) == 1


class Odd(BatchMetadata):
    start: int
    count: int
    weight: float = 1.0
    tag: bytes = b""
    extra: Any = None

    @property
    def end(self) -> int:
        return self.start + self.count


BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"weight": float("nan")}, "field 'weight' = nan"),
    ({"weight": float("inf")}, "field 'weight' = inf"),
    ({"tag": b"\xff\x00"}, "field 'tag' = b'\\xff\\x00'"),
    ({"extra": (1, 2)}, "field(s) ['extra'] load back from JSON as different values"),
]


class OddTransactional(ListTransactionalSpout):
    metadata_type = Odd  # type: ignore[assignment]

    def __init__(self, bad: dict[str, Any]) -> None:
        super().__init__(DATA, 10)
        self.bad = bad

    def initialize_transaction(self, txid: int, prev_meta: Any) -> Any:
        start = prev_meta.end if prev_meta else 0
        return Odd(start=start, count=10, **(self.bad if txid == 2 else {}))


class OddPartitioned(ListPartitionedSpout):
    metadata_type = Odd  # type: ignore[assignment]

    def __init__(self, bad: dict[str, Any]) -> None:
        super().__init__([DATA[:15], DATA[15:]], 5)
        self.bad = bad

    def emit_partition_batch_new(self, attempt: TransactionAttempt, p: int, last: Any) -> Any:
        start = last.end if last else 0
        bad = self.bad if attempt.txid == 2 and p == 1 else {}
        return Odd(start=start, count=min(5, len(self.partitions[p]) - start), **bad)


class OddOpaque(ListOpaqueSpout):
    metadata_type = Odd  # type: ignore[assignment]

    def __init__(self, bad: dict[str, Any]) -> None:
        super().__init__([DATA[:15], DATA[15:]], 5)
        self.bad = bad

    def emit_partition_batch(self, attempt: TransactionAttempt, p: int, last: Any) -> Any:
        start = last.end if last else 0
        rows = self.partitions[p][start : start + 5]
        bad = self.bad if attempt.txid == 2 and p == 1 else {}
        return Odd(start=start, count=len(rows), **bad), rows


@pytest.mark.parametrize(("bad", "named"), BAD_FIELDS, ids=["nan", "inf", "bytes", "tuple"])
@pytest.mark.parametrize("kind", [OddTransactional, OddPartitioned, OddOpaque])
def test_metadata_json_cannot_hold_is_refused_before_it_is_stored(
    kind: type[Any], bad: dict[str, Any], named: str
) -> None:
    store = InMemoryStateStore()
    committer = MemoryCommitter(
        CommitMode.OPAQUE if kind is OddOpaque else CommitMode.TRANSACTIONAL
    )
    with pytest.raises(BatchConfigurationError) as info:
        make_runner(kind(bad), committer, store, max_pending=1).run(until_drained=True)
    message = str(info.value)
    method = {
        OddTransactional: "initialize_transaction",
        OddPartitioned: "emit_partition_batch_new",
        OddOpaque: "emit_partition_batch",
    }[kind]
    assert message.startswith(
        "txid 2 cannot run (start): ContractError: spout 'spout' "
        f"(tests.unit.test_runner_errors.{kind.__name__}).{method}"
    )
    assert named in message
    assert isinstance(info.value.cause, ContractError)
    # Txid 1 committed; of txid 2 no metadata reached the store (the opaque kind stores
    # only its partition count before emitting, and partition metadata at commit).
    assert store.currtx == 2 and store.advances == [1]
    assert 2 not in store.partitions
    assert store.starts == ([1, 2] if kind is OddOpaque else [1])
    assert sum(committer.counts.values()) == 10


# Spark's analysis errors, as a Spark Connect session raises them (pyspark.errors is
# shared: a classic session raises subclasses of the same AnalysisException).


def refusal(error_class: str, column: str = "nope") -> Exception:
    from pyspark.errors.exceptions import connect

    return connect.AnalysisException(
        message=f"[{error_class}] A column, variable, or function parameter with name "
        f"`{column}` cannot be resolved. SQLSTATE: 42703;\n'Project ['{column}]\n",
        errorClass=error_class,
        messageParameters={"objectName": f"`{column}`"},
        sql_state="42703",
    )


class Refused(CountingBolt):
    """Raises ``error`` from ``process`` (as a classic session does on building a plan
    Spark refuses), or with ``lazily`` returns a frame that raises it when first used
    (as Spark Connect does, whose plans are analysed then)."""

    def __init__(self, error: Exception, lazily: bool = False) -> None:
        self.error, self.lazily = error, lazily
        self.calls = 0

    def process(self, attempt: TransactionAttempt, batch: list[Any]) -> Any:  # type: ignore[override]
        self.calls += 1
        if self.lazily:
            return Unanalysed(self.error)
        raise self.error


class Unanalysed(list[Any]):
    """An in-memory frame whose plan Spark refuses when it is first used."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def __iter__(self) -> Any:
        raise self.error

    @property
    def schema(self) -> Any:
        raise self.error


def run_refused(bolt: Refused) -> None:
    topology = (
        TopologyBuilder()
        .set_spout(ListTransactionalSpout(DATA, 10))
        .set_bolt("count", bolt)
        .set_committer("sink", MemoryCommitter(), "count")
        .build()
    )
    config = RunnerConfig(
        topology_id="t", max_pending=1, max_attempts=3, backoff_initial_s=0.0, backoff_max_s=0.0
    )
    TransactionalRunner(topology, InMemoryStateStore(), config=config, engine=InMemoryEngine()).run(
        until_drained=True
    )


@pytest.mark.parametrize("lazily", [False, True], ids=["classic", "connect"])
def test_a_plan_spark_refuses_stops_at_once_naming_the_bolt_and_the_class(lazily: bool) -> None:
    bolt = Refused(refusal("UNRESOLVED_COLUMN.WITH_SUGGESTION"), lazily)
    with pytest.raises(BatchConfigurationError) as info:
        run_refused(bolt)
    assert bolt.calls == 1  # not retried, although max_attempts is 3
    cause = info.value.cause
    assert isinstance(cause, SparkAnalysisError) and isinstance(cause, ContractError)
    assert str(cause) == (
        "bolt 'count' (tests.unit.test_runner_errors.Refused) built a plan Spark refuses "
        "(UNRESOLVED_COLUMN.WITH_SUGGESTION): A column, variable, or function parameter "
        "with name `nope` cannot be resolved. SQLSTATE: 42703; fix the bolt's code"
    )


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(refusal("_LEGACY_ERROR_TEMP_3065"), id="unnamed-analysis-error"),
        pytest.param("unavailable", id="connect-grpc"),
    ],
)
def test_spark_errors_a_retry_can_fix_keep_their_retries(error: Any) -> None:
    if error == "unavailable":
        import grpc
        from pyspark.errors.exceptions import connect

        error = connect.SparkConnectGrpcException(
            message="failed to connect to all addresses",
            grpc_status_code=grpc.StatusCode.UNAVAILABLE,
        )
    bolt = Refused(error)
    with pytest.raises(PoisonBatchError):
        run_refused(bolt)
    assert bolt.calls == 3
