"""Bad configuration fails at start, or at the first batch, with a message that says
what to change, is never retried, and leaves the stored state and the sinks as they
were. The demo's cases run its CLI (exit code 2, the message on stderr); the library's
run ``TransactionalRunner.run``."""

from __future__ import annotations

import io
import json
import math
import shutil
import socket
import sqlite3
from collections.abc import Mapping
from contextlib import redirect_stderr
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from kazoo.client import KazooClient
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from coordinators import SQLiteStateStore, ZooKeeperStateStore
from examples.tweets.cli import main as demo
from examples.tweets.sinks import make_committer
from examples.tweets.topology import build_topology
from tests.e2e.test_cli import cli, env
from tests.history import assert_exact, read_redis
from tests.reference import expected_counts
from transactional import (
    BatchMetadata,
    Bolt,
    PartitionedTransactionalSpout,
    RunnerConfig,
    TopologyBuilder,
    TransactionalRunner,
    TransactionalSpout,
)
from transactional.errors import (
    BatchConfigurationError,
    ContractError,
    CoordinatorError,
    SparkAnalysisError,
)
from transactional.ledger import ID
from transactional.sources.text import RECORD_SCHEMA
from transactional.store import StateStore, TopologyIdentity
from transactional.types import CommitMode, TransactionAttempt

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

LINES = [json.dumps({"id": i, "text": f"#t{i % 3} @u{i % 2} hi"}) for i in range(14)]
LINES[5] = '{"id": 5, "text": '  # a dead letter


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sqlite_rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, the leadership fence included."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in sorted(tables)}
    finally:
        conn.close()


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


# ---------------------------------------------------------------- the demo's CLI


@dataclass(frozen=True)
class Baseline:
    input: Path
    state: Path
    delta: Path


@pytest.fixture(scope="module")
def baseline(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """A finished demo run (SQLite state, Delta sink) that every test copies."""
    root = tmp_path_factory.mktemp("baseline")
    source = root / "tweets.jsonl"
    source.write_text("".join(line + "\n" for line in LINES))
    out = io.StringIO()
    code = demo(
        [
            "run",
            "--input",
            str(source),
            "--state-dir",
            str(root / "state"),
            "--delta-path",
            str(root / "delta"),
            "--batch-size",
            "20",
            "--until-drained",
            "--master",
            "local[2]",
            "--top",
            "0",
        ],
        out=out,
    )
    assert code == 0, out.getvalue()
    assert "committed_txids=1 " in out.getvalue()
    return Baseline(source, root / "state", root / "delta")


@pytest.fixture
def copy(baseline: Baseline, tmp_path: Path) -> Baseline:
    shutil.copytree(baseline.state, tmp_path / "state")
    shutil.copytree(baseline.delta, tmp_path / "delta")
    return Baseline(baseline.input, tmp_path / "state", tmp_path / "delta")


def run_demo(copy: Baseline, *flags: str) -> tuple[int, str]:
    """The demo's ``run`` on the copied state and sink (and input, unless ``flags`` name
    another source), then (exit code, the error line on stderr)."""
    state = sqlite_rows(copy.state / "state.db")
    delta = tree(copy.delta)
    source = [] if "--source" in flags else ["--input", str(copy.input)]
    err = io.StringIO()
    with redirect_stderr(err):
        code = demo(
            [
                "run",
                *source,
                "--state-dir",
                str(copy.state),
                "--until-drained",
                "--master",
                "local[2]",
                "--top",
                "0",
                *flags,
            ],
            out=io.StringIO(),
        )
    assert sqlite_rows(copy.state / "state.db") == state
    assert tree(copy.delta) == delta
    errors = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err.getvalue()
    return code, errors[0]


def test_unreachable_zookeeper(copy: Baseline) -> None:
    port = closed_port()
    code, error = run_demo(
        copy, "--zookeeper", f"127.0.0.1:{port}", "--delta-path", str(copy.delta)
    )
    assert code == 2
    assert error.startswith(f"error: cannot reach ZooKeeper at 127.0.0.1:{port} (127.0.0.1:")
    assert "fix --zookeeper" in error


def test_unreachable_redis_sink(copy: Baseline) -> None:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    code, error = run_demo(copy, "--sink", "redis", "--redis-url", url)
    assert code == 2
    assert error.startswith(f"error: cannot reach Redis at {url} (")
    assert "start redis-server there or fix --redis-url" in error


def test_unreachable_redis_source(copy: Baseline) -> None:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    flags = ["--source", "redis", "--redis-url", url, "--delta-path", str(copy.delta)]
    code, error = run_demo(copy, *flags)
    assert code == 2
    assert error.startswith(f"error: cannot reach Redis at {url} (")


def test_a_delta_path_under_a_regular_file(copy: Baseline, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file")
    code, error = run_demo(copy, "--delta-path", str(blocker / "delta"))
    assert code == 2
    assert error == (
        f"error: --delta-path {blocker / 'delta'} cannot be a directory: {blocker} is a file; "
        "pass the path of a directory (it is created if missing)"
    )
    assert blocker.read_text() == "a regular file"


def test_another_spout_on_the_same_topology_id(copy: Baseline) -> None:
    code, error = run_demo(copy, "--spout", "opaque", "--delta-path", str(copy.delta))
    assert code == 2
    assert "topology id 'tweets' is registered for spout 'transactional.sources.files." in error
    assert "use another --topology-id, or delete the state of 'tweets' in" in error


# ---------------------------------------------------------------- the library


class Offsets(BatchMetadata):
    start: int
    count: int


class LineSpout(TransactionalSpout[Offsets]):
    """``LINES`` in batches of 8; ``broken`` makes ``emit_batch`` return a list of rows,
    or a DataFrame without the ``raw`` column the parse bolt reads."""

    metadata_type = Offsets

    def __init__(self, broken: str | None = None) -> None:
        self.broken = broken
        self.emits = 0

    def open(self, context: Any) -> None:
        self.spark = context.spark

    def is_ready(self, txid: int, prev: Offsets | None) -> bool:
        return (prev.start + prev.count if prev else 0) < len(LINES)

    def initialize_transaction(self, txid: int, prev: Offsets | None) -> Offsets:
        start = prev.start + prev.count if prev else 0
        return Offsets(start=start, count=min(8, len(LINES) - start))

    def emit_batch(self, attempt: TransactionAttempt, meta: Offsets) -> Any:
        self.emits += 1
        rows = [(line, None) for line in LINES[meta.start : meta.start + meta.count]]
        if self.broken == "list":
            return rows
        if self.broken == "schema":
            return self.spark.createDataFrame([(r[0],) for r in rows], "line STRING")
        return self.spark.createDataFrame(rows, RECORD_SCHEMA)


def run_library(spark: Any, spout: Any, store: StateStore, redis_url: str) -> Any:
    committer = make_committer("redis", CommitMode.TRANSACTIONAL, redis_url=redis_url)
    config = RunnerConfig(topology_id="lib", max_pending=1, max_attempts=5)
    return TransactionalRunner(build_topology(spout, committer), store, spark, config).run(
        until_drained=True
    )


BROKEN = {
    "list": "txid 1 cannot run (process): ContractError: spout 'spout' "
    "(tests.e2e.test_bad_config.LineSpout).emit_batch returned list, not a "
    "pyspark.sql.DataFrame of the runner's session (txid 1)",
    "schema": "txid 1 cannot run (process): ContractError: ParseTweets reads the spout's "
    "columns raw STRING, error STRING (transactional.sources.text.RECORD_SCHEMA), but the batch "
    "has line STRING: make the spout emit that schema",
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_spout_of_the_wrong_shape_stops_at_its_first_batch(
    spark: Any, redis_url: str, tmp_path: Path, broken: str
) -> None:
    db = tmp_path / "state.db"
    spout = LineSpout(broken)
    with pytest.raises(BatchConfigurationError) as info:
        run_library(spark, spout, SQLiteStateStore(db), redis_url)
    assert str(info.value).startswith(BROKEN[broken])
    assert isinstance(info.value.cause, ContractError)
    assert spout.emits == 1  # not retried, although max_attempts is 5
    # Nothing committed; txid 1's metadata was stored before its emission, as always.
    store = SQLiteStateStore(db)
    store.open("lib")
    state = store.read_state()
    store.close()
    assert state.currtx == 1 and state.metas == {1: {"start": 0, "count": 8}}
    assert redis.Redis.from_url(redis_url).dbsize() == 0

    # The spout fixed, a restart replays txid 1 from its stored metadata and finishes.
    run_library(spark, LineSpout(), SQLiteStateStore(db), redis_url)
    source = tmp_path / "lines.jsonl"
    source.write_text("".join(line + "\n" for line in LINES))
    assert_exact(read_redis(redis_url), expected_counts(source), ids=False)


class Odd(BatchMetadata):
    start: int
    count: int
    weight: float = 1.0
    tag: bytes = b""


class OddSpout(TransactionalSpout[Odd]):
    metadata_type = Odd

    def initialize_transaction(self, txid: int, prev: Odd | None) -> Odd:
        return Odd(start=0, count=8, weight=math.nan)

    def emit_batch(self, attempt: TransactionAttempt, meta: Odd) -> Any:
        raise AssertionError("never emitted: its metadata cannot be stored")


class OddPartitions(PartitionedTransactionalSpout[Odd]):
    metadata_type = Odd

    def num_partitions(self) -> int:
        return 2

    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last: Odd | None
    ) -> Odd:
        return Odd(start=0, count=8, tag=b"\xff\x00" if partition == 1 else b"")

    def emit_partition_batch(self, attempt: TransactionAttempt, partition: int, meta: Odd) -> Any:
        raise AssertionError("never emitted: its metadata cannot be stored")


UNSERIALISABLE = {
    OddSpout: "spout 'spout' (tests.e2e.test_bad_config.OddSpout).initialize_transaction "
    "returned Odd metadata that JSON cannot hold: "
    "field 'weight' = nan (Out of range float values are not JSON compliant",
    OddPartitions: "spout 'spout' (tests.e2e.test_bad_config.OddPartitions)."
    "emit_partition_batch_new returned Odd metadata that JSON cannot hold: field 'tag' = b'\\xff\\x00' ('utf-8' codec can't decode byte 0xff",
}


def zk_children(hosts: str, topology_id: str) -> dict[str, list[str]]:
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    try:
        root = f"/transactional/{topology_id}"
        return {
            node: sorted(client.get_children(f"{root}/{node}"))
            for node in ("coordinator", "coordinator/meta", "partition")
        }
    finally:
        client.stop()
        client.close()


@pytest.mark.parametrize("kind", [OddSpout, OddPartitions], ids=["transactional", "partitioned"])
@pytest.mark.parametrize("backend", ["sqlite", "zookeeper"])
def test_metadata_json_cannot_hold_is_refused_before_anything_is_stored(
    request: pytest.FixtureRequest,
    spark: Any,
    redis_url: str,
    tmp_path: Path,
    backend: str,
    kind: type[Any],
) -> None:
    hosts = request.getfixturevalue("zk_hosts") if backend == "zookeeper" else ""

    def make() -> StateStore:
        if backend == "zookeeper":
            return ZooKeeperStateStore(hosts)
        return SQLiteStateStore(tmp_path / "state.db")

    with pytest.raises(BatchConfigurationError) as info:
        run_library(spark, kind(), make(), redis_url)
    assert str(info.value).startswith(
        f"txid 1 cannot run (start): ContractError: {UNSERIALISABLE[kind]}"
    )
    assert "not retried; not stored" in str(info.value)
    store = make()
    store.open("lib")
    try:
        assert store.read_state().metas == {} and store.read_state().partitions == {}
        assert store.read_state().currtx == 1
    finally:
        store.close()
    if backend == "zookeeper":
        assert zk_children(hosts, "lib") == {
            "coordinator": ["currtx", "digest", "group", "meta", "rewind"],
            "coordinator/meta": [],
            "partition": [],
        }
    assert redis.Redis.from_url(redis_url).dbsize() == 0


@pytest.mark.parametrize("backend", ["sqlite", "zookeeper"])
def test_the_stores_themselves_write_nothing_they_cannot_encode(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    """The runner checks first, but a store given such a value must not half-write it."""
    hosts = request.getfixturevalue("zk_hosts") if backend == "zookeeper" else ""
    store: StateStore = (
        ZooKeeperStateStore(hosts) if hosts else SQLiteStateStore(tmp_path / "state.db")
    )
    store.open("lib")
    try:
        store.register(TopologyIdentity("spout", "partitioned"))
        store.acquire_leadership(timeout=10)
        store.start_transaction(1, {"partitions": 2}, {0: {"n": 1}, 1: {"n": 2}})
        before = store.read_state()
        bad: list[tuple[Any, Mapping[int, Any]]] = [
            ({"w": math.nan}, {}),
            ({"partitions": 2}, {0: {"n": 3}, 1: {"tag": b"\xff"}}),
            ({"partitions": 2}, {0: {"n": 3}, 1: {"w": math.inf}}),
        ]
        for meta, partitions in bad:
            with pytest.raises(CoordinatorError, match="is not JSON-serialisable"):
                store.start_transaction(2, meta, partitions)
        with pytest.raises(CoordinatorError, match="is not JSON-serialisable"):
            store.advance(1, {0: {"w": math.nan}})
        assert store.read_state() == before
    finally:
        store.close()
    if hosts:
        children = zk_children(hosts, "lib")
        assert children["coordinator/meta"] == ["00000000000000000001"]
        assert children["partition"] == ["0", "1"]


# ---------------------------------------------------------------- Spark's analysis


def stored(db: Path, topology_id: str) -> tuple[int, dict[int, Any]]:
    """``(currtx, each txid's stored metadata)`` of ``topology_id`` in the SQLite store."""
    store = SQLiteStateStore(db)
    store.open(topology_id, read_only=True)
    try:
        state = store.read_state()
        return state.currtx, dict(state.metas)
    finally:
        store.close()


def test_a_bolt_reading_a_column_that_does_not_exist_stops_at_its_first_attempt(
    redis_url: str, tmp_path: Path
) -> None:
    """``transactional run`` as a user runs it: Spark refuses the bolt's plan on every
    attempt, so the first stops the run (exit 2), and nothing reaches the sink."""
    calls, state = tmp_path / "calls", tmp_path / "state"
    done = cli(
        "run",
        "tests.e2e.cli_topologies:numbers_missing_column",
        "--topology-id",
        "missing",
        "--state-dir",
        str(state),
        "--master",
        "local[2]",
        "--max-pending",  # one txid at a time: the bolt's calls are then exactly known
        "1",
        "--until-drained",
        environ=env(redis_url, CLI_CALLS=str(calls)),
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: txid 1 cannot run (process): SparkAnalysisError: bolt 'bucket' "
        "(tests.e2e.cli_topologies.MissingColumn) built a plan Spark refuses "
        "(UNRESOLVED_COLUMN.WITH_SUGGESTION): A column, variable, or function parameter with "
        "name `nope` cannot be resolved. Did you mean one of the following? [`id`]. SQLSTATE: "
        "42703; fix the bolt's code. This is a configuration or code error, so it was not "
        "retried; metadata=Range(start=0, count=50). Fix it and start the runner again: it "
        "resumes from this txid, nothing is lost."
    ], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "at org.apache.spark" not in done.stderr
    assert calls.read_text() == "1\n"  # one attempt: the bolt was called once
    assert redis.Redis.from_url(redis_url).dbsize() == 0  # nothing in the sink
    assert stored(state / "state.db", "missing") == (1, {1: {"start": 0, "count": 50}})


def test_a_bolt_that_loses_records_stops_the_run_at_once_naming_them(
    redis_url: str, tmp_path: Path
) -> None:
    """The record ledger through ``transactional run``: a bolt that accounts for its
    records but loses the odd numbers fails its first txid with a ``LedgerError``, which
    is not retried: exit 2, one line naming the bolt and the lost records, nothing in
    the sink, the txid kept to resume from."""
    state = tmp_path / "state"
    done = cli(
        "run",
        "tests.e2e.cli_topologies:numbers_losing_odd",
        "--topology-id",
        "lossy",
        "--state-dir",
        str(state),
        "--master",
        "local[2]",
        "--max-pending",
        "1",
        "--until-drained",
        environ=env(redis_url),
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    lost = [n for n in range(50) if n % 2]  # txid 1 holds 0..49; the bolt keeps the even
    assert len(errors) == 1, done.stderr[-3000:]
    # A bolt that folds keeps no id per record: the ledger names how many, not which.
    assert errors[0].startswith(
        "error: txid 1 cannot run (process): LedgerError: ledger: bolt 'bucket' "
        "(tests.e2e.cli_topologies.LosesOdd) on stream 'default', txid 1: "
        f"{len(lost)} record(s) unaccounted for; given 50 from the spout's batch, accounted "
        f"for {50 - len(lost)} "
    ), errors
    assert "Nothing of the txid was committed" in errors[0] and "not retried" in errors[0]
    assert "Traceback" not in done.stderr
    assert redis.Redis.from_url(redis_url).dbsize() == 0  # nothing in the sink
    assert stored(state / "state.db", "lossy") == (1, {1: {"start": 0, "count": 50}})


class ReadsLedgerIds(Bolt):
    """Reads the ledger's id column without accounting for its records."""

    def __init__(self) -> None:
        self.calls = 0

    def process(self, attempt: TransactionAttempt, batch: Any) -> Any:
        self.calls += 1
        return batch.groupBy(F.col(ID).cast("string").alias("key")).count()


@pytest.mark.connect
def test_a_bolt_that_does_not_account_reading_the_ledger_id_is_told_how(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    bolt = ReadsLedgerIds()
    sink = RedisCommitter(redis_url, {"default": CounterTable("ids", ("key",))})
    spout = LineSpout()
    topology = (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("ids", bolt)
        .set_committer("sink", sink, "ids")
        .build()
    )
    db = tmp_path / "state.db"
    config = RunnerConfig(topology_id="lib", max_pending=1, max_attempts=5)
    runner = TransactionalRunner(topology, SQLiteStateStore(db), spark, config)
    with pytest.raises(BatchConfigurationError) as info:
        runner.run(until_drained=True)
    cause = info.value.cause
    assert isinstance(cause, SparkAnalysisError)
    assert cause.error_class == "UNRESOLVED_COLUMN.WITH_SUGGESTION"
    assert str(cause).startswith(
        "bolt 'ids' (tests.e2e.test_bad_config.ReadsLedgerIds) built a plan Spark refuses "
        "(UNRESOLVED_COLUMN.WITH_SUGGESTION): A column, variable, or function parameter with "
        f"name `{ID}` cannot be resolved."
    ), str(cause)
    assert str(cause).endswith(
        f"; it reads the ledger's id column {ID}, which only a bolt that accounts for its "
        "records is given: set `accounts = True`, or drop the column"
    ), str(cause)
    assert bolt.calls == 1 and spout.emits == 1  # not retried, although max_attempts is 5
    assert redis.Redis.from_url(redis_url).dbsize() == 0
    assert stored(db, "lib") == (1, {1: {"start": 0, "count": 8}})
