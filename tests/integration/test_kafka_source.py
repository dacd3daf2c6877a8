"""The Kafka source on a real broker (KRaft, loopback): offset ranges decided on the
driver and read by Spark's Kafka reader, exact per partition across txids and replays;
the start positions; a missing topic and deleted offsets said plainly; and the tweet
topology counted exactly from a topic of several partitions through a crash and a
broker restart."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from examples.tweets.generate import generate_lines
from examples.tweets.sinks import make_committer
from examples.tweets.topology import build_topology
from tests.history import assert_exact, read_redis
from tests.reference import Expected, expected_counts
from tests.runner_logs import FailedTxids
from tests.witness import clock_past, process_state, waited
from transactional.errors import ConfigurationError, EmitError, SourceDataLostError
from transactional.faults import FaultPoint
from transactional.sources.kafka import KafkaOpaqueSpout, KafkaPartitionedSpout, KafkaRange
from transactional.sources.kafka._offsets import KafkaOffsets
from transactional.spout import PARTITION_COLUMN, SpoutContext
from transactional.testing import FaultPlan, TopologyHarness
from transactional.testing.servers import KafkaServer
from transactional.types import CommitMode, TransactionAttempt, dump_meta, load_meta

pytestmark = [pytest.mark.integration, pytest.mark.connect]

Record = tuple[str, str | None]
#: librdkafka's own lines (a client reconnecting to a stopped broker) go to logging.
LOG = logging.getLogger("tests.kafka")


_topics = iter(range(1_000_000))


def new_topic(kafka: KafkaServer, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"t{next(_topics)}-{int(time.time() * 1000) % 100_000}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(60)
    return name


def produce(kafka: KafkaServer, topic: str, messages: Mapping[int, Sequence[bytes | None]]) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True, "logger": LOG}
    )
    for partition, values in messages.items():
        for value in values:
            producer.produce(topic, value=value, partition=partition)
            producer.poll(0)
    assert producer.flush(60) == 0, "messages left unsent"


def delete_before(kafka: KafkaServer, topic: str, partition: int, offset: int) -> None:
    """Move the partition's start to ``offset``, as retention would."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(topic, partition, offset)]).values():
        future.result(60)


def decoded(value: bytes) -> Record:
    """The text rule, again: one trailing CR removed, bad UTF-8 escaped and flagged."""
    value = value.removesuffix(b"\r")
    try:
        return value.decode("utf-8"), None
    except UnicodeDecodeError:
        return value.decode("utf-8", "backslashreplace"), "invalid UTF-8"


#: Messages that make values awkward; the rest are generated tweets.
AWKWARD = [b"caf\xe9 #latin1", b"crlf #x\r", b"", b"\xff\xfe", b"\xe2\x82\xac ok"]


def _messages(partitions: int, per_partition: int, seed: int) -> dict[int, list[bytes]]:
    lines = list(generate_lines(partitions * per_partition, seed=seed, bad_rate=0.1))
    out = {p: lines[p::partitions] for p in range(partitions)}
    out[0] = AWKWARD + out[0]
    return out


def _open(spout: Any, spark: Any) -> Any:
    spout.open(SpoutContext(spark, "test"))
    return spout


def _rows(frame: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in frame.orderBy("partition", "offset").collect()]


def _drive(spout: Any, last: dict[int, KafkaRange], limit: int = 40) -> list[dict[int, KafkaRange]]:
    """Decide txids until the spout is not ready; the metadata of each, through JSON."""
    history = []
    for txid in range(1, limit):
        if not spout.is_ready(txid, last):
            return history
        attempt = TransactionAttempt(txid, 1)
        metas = {
            p: load_meta(
                KafkaRange, dump_meta(spout.emit_partition_batch_new(attempt, p, last.get(p)))
            )
            for p in range(spout.num_partitions())
        }
        history.append(metas)
        last = {**last, **metas}
    raise AssertionError("the spout never drained")


def test_partitioned_spout_reads_each_partition_exactly_in_ranges(
    spark: Any, kafka: KafkaServer
) -> None:
    topic = new_topic(kafka, 3)
    messages = _messages(3, 40, seed=1)
    produce(kafka, topic, messages)
    spout = _open(KafkaPartitionedSpout(kafka.bootstrap_servers, topic, batch_size=15), spark)
    assert spout.num_partitions() == 3

    history = _drive(spout, {})
    got: dict[int, list[Record]] = {0: [], 1: [], 2: []}
    for txid, metas in enumerate(history, start=1):
        assert all(m.offsets <= 15 for m in metas.values())
        frame = spout.emit_partitions(TransactionAttempt(txid, 1), metas)
        rows = frame.orderBy("partition", "offset").collect()
        for row in rows:
            assert row[PARTITION_COLUMN] == row["partition"]
            got[row["partition"]].append((row["raw"], row["error"]))
        # The same metadata gives the same records, one partition at a time too.
        again = [
            r
            for p, meta in metas.items()
            for r in _rows(spout.emit_partition_batch(TransactionAttempt(txid, 2), p, meta))
        ]
        assert again == [tuple(r)[:-1] for r in rows]
    assert got == {p: [decoded(v) for v in values] for p, values in messages.items()}

    # New messages make it ready again, and the next ranges start where the last ended.
    produce(kafka, topic, {1: [b"late"]})
    last = {p: m for metas in history for p, m in metas.items()}
    more = _drive(spout, last)
    assert [(p, m.start, m.end) for p, m in more[0].items() if m.offsets] == [
        (1, last[1].end, last[1].end + 1)
    ]


class _Requests:
    """Counts the spout's requests to the broker: topic metadata and offset lists."""

    def __init__(self, spout: Any) -> None:
        self.metadata = self.offsets = 0
        view = spout.offsets
        ask_metadata, ask_offsets = view.count, view.offsets

        def count(at_open: bool = False) -> int:
            self.metadata += 1
            return int(ask_metadata(at_open))

        def offsets(specs: Mapping[int, Any]) -> dict[int, int]:
            self.offsets += bool(specs)
            return dict(ask_offsets(specs))

        view.count, view.offsets = count, offsets

    def taken(self) -> tuple[int, int]:
        seen, self.metadata, self.offsets = (self.metadata, self.offsets), 0, 0
        return seen


@pytest.mark.parametrize("kind", [KafkaPartitionedSpout, KafkaOpaqueSpout])
def test_a_txid_is_decided_with_one_request_per_question(
    spark: Any, kafka: KafkaServer, kind: type
) -> None:
    """As the runner decides a txid: the partition count, then ``is_ready`` asks every
    end once (and the start of partitions never read); the emits of the same attempt
    reuse them, and a replay's new attempt asks afresh."""
    topic = new_topic(kafka, 3)
    produce(kafka, topic, _messages(3, 10, seed=3))
    spout = _open(kind(kafka.bootstrap_servers, topic, batch_size=4), spark)
    requests = _Requests(spout)
    last: dict[int, KafkaRange] = {}

    def decide(txid: int) -> dict[int, KafkaRange]:
        attempt = TransactionAttempt(txid, 1)
        count = spout.num_partitions()
        assert spout.is_ready(txid, last)
        if kind is KafkaPartitionedSpout:
            return {
                p: spout.emit_partition_batch_new(attempt, p, last.get(p)) for p in range(count)
            }
        return {p: spout.emit_partition_batch(attempt, p, last.get(p))[0] for p in range(count)}

    messages = _messages(3, 10, seed=3)
    assert spout.lag() is None  # nothing looked at yet
    first = decide(1)
    assert requests.taken() == (1, 2)  # metadata; every end, every start (none read)
    # The lag: what the topic holds beyond the ranges decided, with no request of its own.
    assert spout.lag() == sum(map(len, messages.values())) - sum(m.offsets for m in first.values())
    assert [(m.start, m.end) for m in first.values()] == [(0, 4)] * 3
    last = first
    second = decide(2)
    # The opaque spout also asks every start once, for offsets deleted since.
    assert requests.taken() == ((1, 1) if kind is KafkaPartitionedSpout else (1, 2))
    assert [(m.start, m.end) for m in second.values()] == [(4, 8)] * 3
    assert spout.lag() == 35 - 24  # 15 + 10 + 10 messages, 8 a partition decided
    if kind is KafkaOpaqueSpout:
        again = {
            p: spout.emit_partition_batch(TransactionAttempt(2, 2), p, first[p])[0]
            for p in range(3)
        }
        assert again == second
        assert requests.taken() == (1, 2)  # a new attempt: count, ends, starts


def _consumer_connections(kafka: KafkaServer) -> int:
    """Connections open to the broker from other processes than this one (Spark's JVM,
    classic or a Connect server), as the operating system lists them."""
    import os

    import psutil

    return sum(
        1
        for c in psutil.net_connections(kind="tcp")
        if c.raddr
        and c.raddr.port == kafka.port
        and c.status == psutil.CONN_ESTABLISHED
        and c.pid != os.getpid()
    )


def test_the_reads_of_a_topology_reuse_their_consumers(spark: Any, kafka: KafkaServer) -> None:
    """One consumer group for every read of a topology: Spark's reader pools consumers by
    group and partition, so each txid's tasks take up the ones the txid before used,
    instead of connecting anew (a group per read: two partitions, two more connections
    every txid, each kept until the pool's idle timeout)."""
    topic = new_topic(kafka, 2)
    produce(kafka, topic, _messages(2, 30, seed=5))
    spout = _open(KafkaPartitionedSpout(kafka.bootstrap_servers, topic, batch_size=5), spark)
    history = _drive(spout, {})
    assert len(history) == 7  # 30 and 35 messages, 5 a txid

    def read(txid: int) -> None:
        frame = spout.emit_partitions(TransactionAttempt(txid, 1), history[txid - 1])
        assert frame.count() == sum(m.offsets for m in history[txid - 1].values())

    read(1)
    read(2)
    before = _consumer_connections(kafka)
    for txid in range(3, 8):
        read(txid)
    assert _consumer_connections(kafka) - before <= 1  # the admin client's, at most


def _kafka_plan(frame: Any) -> str:
    """The frame's plan as Spark analysed it."""
    return str(frame._jdf.queryExecution().analyzed().toString())


@pytest.mark.classic  # a Connect client has no JVM to build the RDD in
def test_a_classic_read_plans_no_kafka_relation_and_reads_what_sparks_reader_reads(
    spark: Any, kafka: KafkaServer
) -> None:
    """On a classic session the spout builds Spark's Kafka RDD over the ranges it
    decided (no relation planned, so no broker asked, each txid); its rows are the ones
    Spark's reader reads for the same ranges. An option only Spark's reader knows
    keeps the reader; an option the reader refuses fails at open."""
    topic = new_topic(kafka, 2)
    produce(kafka, topic, {0: [*AWKWARD, None, b"x"], 1: [f"m{i}".encode() for i in range(9)]})
    spout = _open(KafkaPartitionedSpout(kafka.bootstrap_servers, topic, batch_size=4), spark)
    history = _drive(spout, {})
    assert len(history) == 3
    columns = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    for txid, metas in enumerate(history, start=1):
        frame = spout.emit_partitions(TransactionAttempt(txid, 1), metas)
        assert "KafkaRelation" not in _kafka_plan(frame)
        wanted = {p: m for p, m in metas.items() if m.offsets}
        direct = spout._direct.frame(topic, {p: (m.start, m.end) for p, m in wanted.items()})
        by_reader = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("assign", json.dumps({topic: list(wanted)}))
            .option(
                "startingOffsets", json.dumps({topic: {str(p): m.start for p, m in wanted.items()}})
            )
            .option(
                "endingOffsets", json.dumps({topic: {str(p): m.end for p, m in wanted.items()}})
            )
            .load()
        )
        assert "KafkaRelation" in _kafka_plan(by_reader)
        assert _rows(direct.select(columns)) == _rows(by_reader.select(columns))
        assert len(_rows(direct)) == sum(m.offsets for m in wanted.values())

    split = _open(
        KafkaPartitionedSpout(kafka.bootstrap_servers, topic, options={"minPartitions": "4"}),
        spark,
    )
    metas = _drive(split, {})[0]
    frame = split.emit_partitions(TransactionAttempt(1, 1), metas)
    assert "KafkaRelation" in _kafka_plan(frame)
    assert frame.rdd.getNumPartitions() >= 4  # the reader's option, honoured
    assert len(_rows(frame)) == len(AWKWARD) + 2 + 9
    with pytest.raises(
        ConfigurationError,
        match=r"KafkaPartitionedSpout: Spark's Kafka reader refuses the options \['kafka.auto.offset.reset'\]: .*auto.offset.reset",
    ):
        _open(
            KafkaPartitionedSpout(
                kafka.bootstrap_servers, topic, options={"kafka.auto.offset.reset": "latest"}
            ),
            spark,
        )


@pytest.mark.classic  # reads the frames' partition counts (no RDD over Connect)
def test_a_replay_gives_the_same_ledger_ids_in_any_partitioning(
    spark: Any, kafka: KafkaServer
) -> None:
    """The record ledger's ids come from the spout's position columns (partition and
    offset), so a replay that reads a txid's batch in another partitioning (all
    partitions in one frame, one frame a partition, or shuffled into three) gives every
    record the same id; ids computed here again from the positions, apart from the
    ledger."""
    from pyspark.sql import functions as F

    from transactional.ledger import ID
    from transactional.spark.ids import RecordIds, id_column

    topic = new_topic(kafka, 2)
    produce(kafka, topic, {0: [f"a{i}".encode() for i in range(7)], 1: [b"b0", b"b1"]})
    spout = _open(KafkaPartitionedSpout(kafka.bootstrap_servers, topic, batch_size=10), spark)
    metas = _drive(spout, {})[0]
    ids = RecordIds(1, KafkaPartitionedSpout.position_columns)

    def ledger_ids(frame: Any) -> list[tuple[int, int, int]]:
        rows = frame.select("partition", "offset", id_column(ids)).collect()
        return sorted((r["partition"], r["offset"], r[ID]) for r in rows)

    whole = spout.emit_partitions(TransactionAttempt(1, 1), metas).drop(PARTITION_COLUMN)
    apart = [spout.emit_partition_batch(TransactionAttempt(1, 2), p, m) for p, m in metas.items()]
    layouts = [whole, apart[0].unionByName(apart[1]), whole.repartition(3, "offset")]
    assert [f.rdd.getNumPartitions() for f in layouts] == [2, 2, 3]
    first = ledger_ids(layouts[0])
    assert all(ledger_ids(f) == first for f in layouts[1:])
    positions = spark.createDataFrame([(p, o) for p, o, _ in first], "partition INT, offset LONG")
    again = positions.select(F.xxhash64("partition", "offset").alias("x")).collect()
    assert [i for _, _, i in first] == [r["x"] for r in again]
    assert len({i for _, _, i in first}) == 9  # one id a record


def test_start_positions(spark: Any, kafka: KafkaServer) -> None:
    topic = new_topic(kafka, 2)
    produce(kafka, topic, {0: [b"a0", b"a1", b"a2"], 1: [b"b0", b"b1"]})
    middle = clock_past(datetime.now(UTC))  # after the first records' timestamps
    clock_past(middle)  # and the next ones' after it
    produce(kafka, topic, {0: [b"a3"], 1: [b"b2", b"b3"]})

    def first(start: Any) -> dict[int, tuple[int, int]]:
        spout = _open(
            KafkaPartitionedSpout(kafka.bootstrap_servers, topic, 100, start=start), spark
        )
        return {p: (m.start, m.end) for p, m in _drive(spout, {})[0].items()}

    assert first("earliest") == {0: (0, 4), 1: (0, 4)}
    latest = _open(
        KafkaPartitionedSpout(kafka.bootstrap_servers, topic, 100, start="latest"), spark
    )
    assert latest.is_ready(1, {}) is True  # no partition has a range yet
    assert {p: (m.start, m.end) for p, m in _drive(latest, {})[0].items()} == {0: (4, 4), 1: (4, 4)}
    assert first({0: 2}) == {0: (2, 4), 1: (0, 4)}  # partitions not named: earliest
    assert first(middle) == {0: (3, 4), 1: (2, 4)}

    delete_before(kafka, topic, 0, 2)
    with pytest.raises(SourceDataLostError, match=r"start offset 1 .* partition 0 was deleted"):
        first({0: 1})


def test_a_record_without_a_value_is_flagged_not_dropped(spark: Any, kafka: KafkaServer) -> None:
    topic = new_topic(kafka, 1)
    produce(kafka, topic, {0: [b"before", None, b"after"]})
    spout = _open(KafkaPartitionedSpout(kafka.bootstrap_servers, topic), spark)
    metas = _drive(spout, {})[0]
    rows = _rows(spout.emit_partitions(TransactionAttempt(1, 1), metas))
    assert [(r[0], r[1], r[5]) for r in rows] == [
        ("before", None, 0),
        (None, "no value (a tombstone)", 1),
        ("after", None, 2),
    ]


def test_a_missing_topic_or_a_stopped_broker_is_a_configuration_error(
    spark: Any, kafka: KafkaServer
) -> None:
    topic = new_topic(kafka, 1)
    with pytest.raises(
        ConfigurationError, match=r"topic 'nope' does not exist on .* \(topics there: .*" + topic
    ):
        _open(KafkaPartitionedSpout(kafka.bootstrap_servers, "nope"), spark)
    with pytest.raises(ConfigurationError, match=r"cannot reach Kafka at 127\.0\.0\.1:1"):
        _open(KafkaPartitionedSpout("127.0.0.1:1", topic, timeout_s=2), spark)
    with pytest.raises(ConfigurationError, match="value_format must be"):
        KafkaPartitionedSpout(kafka.bootstrap_servers, topic, value_format="json")  # type: ignore[arg-type]


@pytest.mark.connect_full  # the driver asks the broker itself, on either session
def test_the_offsets_are_asked_again_after_a_broker_restart(kafka: KafkaServer) -> None:
    """librdkafka's admin client refuses to work after the broker restarted (it keeps
    leader epochs the new broker fences): the spout's view asks through a new client."""
    topic = new_topic(kafka, 2)
    produce(kafka, topic, {0: [b"a", b"b"], 1: [b"c"]})
    offsets = KafkaOffsets("test", kafka.bootstrap_servers, topic, "read_committed", {}, 2.0)
    assert offsets.latest([0, 1]) == {0: 2, 1: 1}
    # A broker that stops answering mid-request: librdkafka gives offset -1001 and no
    # error (seen in CI with a broker killed while the client still held its leaders).
    assert kafka.proc is not None
    os.killpg(kafka.proc.pid, signal.SIGSTOP)
    try:
        pid = kafka.proc.pid
        waited("the broker stopped", lambda: process_state(pid) == "T" or None, 10, 0.01)
        with pytest.raises(EmitError, match=rf"test: offsets of '{topic}': no offset for "):
            offsets.latest([0, 1])
    finally:
        os.killpg(kafka.proc.pid, signal.SIGCONT)
    assert offsets.latest([0, 1]) == {0: 2, 1: 1}
    kafka.stop()
    try:
        with pytest.raises(EmitError, match=f"test: offsets of '{topic}'"):
            offsets.latest([0, 1])
    finally:
        kafka.start()
    produce(kafka, topic, {1: [b"d"]})
    deadline = time.monotonic() + 60
    while True:
        try:
            assert offsets.latest([0, 1]) == {0: 2, 1: 2}
            break
        except EmitError:
            assert time.monotonic() < deadline, "the offsets were never read again"
            time.sleep(1)


def test_deleted_offsets_stop_a_replay_and_are_named_by_the_opaque_spout(
    spark: Any, kafka: KafkaServer
) -> None:
    topic = new_topic(kafka, 2)
    produce(kafka, topic, {0: [f"m{i}".encode() for i in range(10)], 1: [b"x"]})
    spout = _open(KafkaPartitionedSpout(kafka.bootstrap_servers, topic, batch_size=4), spark)
    metas = {p: spout.emit_partition_batch_new(TransactionAttempt(1, 1), p, None) for p in (0, 1)}
    delete_before(kafka, topic, 0, 3)
    with pytest.raises(
        SourceDataLostError, match=r"txid 1 reads offsets 0 to 3 .* now starts at 3"
    ):
        spout.emit_partitions(TransactionAttempt(1, 2), metas)

    opaque = _open(KafkaOpaqueSpout(kafka.bootstrap_servers, topic, batch_size=4), spark)
    meta, frame = opaque.emit_partition_batch(
        TransactionAttempt(1, 1), 0, KafkaRange(start=0, end=1)
    )
    assert (meta.start, meta.end, meta.lost) == (3, 7, 2)
    rows = [(r["raw"], r["error"], r["offset"]) for r in frame.orderBy("offset").collect()]
    assert rows[0] == (
        "",
        f"offsets 1 to 2 of {topic!r} partition 0 were deleted (retention) before they were "
        "read: 2 offsets lost",
        1,
    )
    assert rows[1:] == [(f"m{i}", None, i) for i in range(3, 7)]


def _expected(messages: Mapping[int, list[bytes]], tmp_path: Path) -> Expected:
    """The reference counts, from the messages written out as a JSON Lines file."""
    path = tmp_path / "messages.jsonl"
    path.write_bytes(b"".join(v + b"\n" for values in messages.values() for v in values))
    return expected_counts(path)


class _BrokerKilledAt:
    """SIGKILLs the broker when ``txid``'s first attempt starts its emit, so that the
    emit (and whatever else is in flight) meets it down; the broker is started again
    once a txid failed."""

    def __init__(self, kafka: KafkaServer, txid: int, failures: FailedTxids) -> None:
        self.kafka, self.txid, self.failures = kafka, txid, failures
        self.killed = threading.Event()
        self.errors: list[BaseException] = []
        self.restarter = threading.Thread(target=self._restart)

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        if point is FaultPoint.EMIT and attempt.txid == self.txid and not self.killed.is_set():
            self.kafka.stop()
            self.killed.set()
            self.restarter.start()

    def _restart(self) -> None:
        try:
            assert self.failures.seen.wait(120), "nothing failed while Kafka was down"
            self.kafka.start()
        except BaseException as exc:  # reported by the test thread
            self.errors.append(exc)


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(CommitMode.TRANSACTIONAL, marks=pytest.mark.slow),
        # On Connect in make connect-test-full: the Kafka reads of the other cases run there.
        pytest.param(CommitMode.OPAQUE, marks=pytest.mark.connect_full),
    ],
)
def test_tweets_counted_exactly_from_kafka_through_a_crash_and_a_broker_restart(
    spark: Any, kafka: KafkaServer, redis_url: str, tmp_path: Path, mode: CommitMode
) -> None:
    topic = new_topic(kafka, 3)
    messages = _messages(3, 150, seed=7)
    produce(kafka, topic, messages)
    kind = KafkaPartitionedSpout if mode is CommitMode.TRANSACTIONAL else KafkaOpaqueSpout

    def build() -> Any:
        spout = kind(kafka.bootstrap_servers, topic, batch_size=25, timeout_s=5)
        return build_topology(spout, make_committer("redis", mode, redis_url=redis_url))

    harness = TopologyHarness(build, spark, topology_id="tweets", state_dir=tmp_path / "state")
    crashed = harness.run_until_drained(FaultPlan().crash(FaultPoint.BEFORE_SINK_WRITE, txid=3))
    assert crashed.crashed

    failures = FailedTxids()
    logging.getLogger("transactional.runner").addHandler(failures)
    broker = _BrokerKilledAt(kafka, 5, failures)
    try:
        harness.run_until_drained(broker, max_attempts=30, attempt_timeout_s=60)
    except Exception as e:
        e.add_note(f"the broker's restart: {broker.errors or 'no error'}; its log:")
        e.add_note(kafka.log_tail())
        raise
    finally:
        if broker.killed.is_set():
            broker.restarter.join(180)
        logging.getLogger("transactional.runner").removeHandler(failures)
    assert broker.killed.is_set() and failures.seen.is_set()
    assert not broker.errors, broker.errors
    assert_exact(read_redis(redis_url), _expected(messages, tmp_path), ids=False)


@pytest.mark.classic
def test_the_docs_kafka_example_counts_every_page_once(
    spark: Any, kafka: KafkaServer, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from collections import Counter

    from tests.docs import run_example

    topic = new_topic(kafka, 2)
    pages = [b"home", b"about", b"home", b"caf\xe9", b"pricing", b"home", b"about"]
    produce(kafka, topic, {0: pages[:4], 1: pages[4:]})
    run_example(
        "docs/how-to/kafka.md",
        "",
        {
            "KAFKA": kafka.bootstrap_servers,
            "KAFKA_TOPIC": topic,
            "REDIS_URL": redis_url,
            "STATE": str(tmp_path / "state.db"),
        },
        monkeypatch,
    )

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    good = Counter(p.decode() for p in pages if p != b"caf\xe9")
    assert {k: int(v) for k, v in client.hgetall("pages").items()} == good
    bad = [json.loads(v) for v in client.lrange("dead_letters", 0, -1)]
    assert [(b["raw"], b["reason"]) for b in bad] == [("caf\\xe9", "invalid UTF-8")]
    client.close()


def test_a_broker_whose_cluster_id_starts_with_a_dash_formats_and_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One random id in 64 starts with "-" (the first six bits 62, "-" in URL-safe base64);
    # the storage tool used to take it for an option and refuse to format.
    from transactional.testing import servers

    monkeypatch.setattr(servers.uuid, "uuid4", lambda: uuid.UUID(bytes=b"\xf8" + bytes(15)))
    server = KafkaServer()
    try:
        meta = (server.dir / "log" / "meta.properties").read_text().splitlines()
        assert "cluster.id=-" + "A" * 21 in meta
        server.start()
        topic = new_topic(server, 2)
        produce(server, topic, {0: [b"a"], 1: [b"b", b"c"]})
        offsets = KafkaOffsets("test", server.bootstrap_servers, topic, "read_committed", {}, 10.0)
        assert offsets.latest([0, 1]) == {0: 1, 1: 2}
    finally:
        server.close()


def test_a_lossy_bolt_over_kafka_names_the_offsets_it_lost(
    spark: Any, kafka: KafkaServer, tmp_path: Path
) -> None:
    """The record ledger names the first five records a bolt lost by their partition and
    offset, and says how many it lost."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from transactional import (
        BatchConfigurationError,
        Bolt,
        CommitOutcome,
        Committer,
        TopologyBuilder,
    )
    from transactional.ledger import LedgerError

    topic = new_topic(kafka, 2)
    values = {p: [f"p{p}-{i}" for i in range(10)] for p in (0, 1)}
    produce(kafka, topic, {p: [v.encode() for v in vs] for p, vs in values.items()})
    removed = sorted({(0, 3), (0, 4), (0, 9), (1, 0), (1, 7), (1, 8), (1, 9)})  # (p, offset)
    lines = [values[p][offset] for p, offset in removed]

    class LeavesOut(Bolt):
        accounts = True

        def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
            return batch.where(~F.col("raw").isin(lines))

    class Nowhere(Committer):
        def commit(self, attempt: TransactionAttempt, prepared: Any) -> CommitOutcome:
            raise AssertionError(f"txid {attempt.txid} reached the sink")

    def build() -> Any:
        spout = KafkaPartitionedSpout(kafka.bootstrap_servers, topic, batch_size=10, timeout_s=5)
        return (
            TopologyBuilder()
            .set_spout(spout)
            .set_bolt("leaves", LeavesOut())
            .set_committer("sink", Nowhere(), "leaves")
            .build()
        )

    harness = TopologyHarness(build, spark, topology_id="ledger", state_dir=tmp_path)
    with pytest.raises(BatchConfigurationError) as caught:
        harness.run_until_drained(max_pending=1, warm_up=False)
    error = caught.value.cause
    assert isinstance(error, LedgerError), error
    assert (error.txid, error.given, error.unaccounted, error.miscounted) == (1, 20, 7, 7)
    assert error.named == tuple(f"partition {p} offset {offset}" for p, offset in removed[:5])
    assert f"7 record(s) unaccounted for ({', '.join(error.named)} and 2 more)" in str(error)
