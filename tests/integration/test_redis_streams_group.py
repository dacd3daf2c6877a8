"""The Redis Streams source's consumer-group mode (``group=``) on a real Redis: runs
killed between the commit and the ``XACK`` and between the ``XREADGROUP`` and the store
write lose no entry and count none twice; the ``ack``/``fail``/``cleanup_before`` hooks
acknowledge what they must and nothing more; the group is created where the topology
starts and must be the topology's own; ``is_ready`` waits for an entry when asked to.

Every observation is read from Redis with redis-py (``XPENDING``, ``XINFO GROUPS``,
``XINFO CONSUMERS``, the sink's hash) or from the SQLite store with SQL, and compared
with what this test wrote: the ids ``XADD`` returned, sliced by the batch size."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from tests.processes import store_state
from tests.spouts import opened
from transactional import Bolt, TopologyBuilder
from transactional.errors import ConfigurationError
from transactional.sources.redis_streams import (
    MAX_BLOCK_MS,
    RedisStreamsOpaqueSpout,
    RedisStreamsPartitionedSpout,
)
from transactional.sources.redis_streams._entries import before
from transactional.testing import FaultPlan, FaultPoint, TopologyHarness
from transactional.topology import Topology
from transactional.types import Guarantee, TransactionAttempt

pytestmark = pytest.mark.integration

GROUP = "counters"
TOPOLOGY = "streams-group"
#: Entries per stream: "a" takes three txids of 4, "b" two, "c" does not exist before
#: the run (the group mode creates it) and never gets an entry.
SIZES = {"g:a": 11, "g:b": 6, "g:c": 0}
BATCH = 4


class CountEntries(Bolt):
    """Each entry once per batch, keyed ``"<stream> <id>"``: a sink count of 2 is an
    entry counted twice, a missing key an entry lost."""

    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        entry = F.concat_ws(" ", "stream", "id").alias("entry")
        return batch.select(entry).groupBy("entry").agg(F.count("*").alias("count"))


class Killed(BaseException):
    """The runner's process "died" (a BaseException: nothing catches it on the way out)."""


class DiesDeciding(RedisStreamsPartitionedSpout):
    """Dies once every stream of txid ``die_at`` went through ``XREADGROUP``, before
    the runner stores the txid's ranges."""

    die_at: int | None = None

    def emit_partition_batch_new(
        self, attempt: TransactionAttempt, partition: int, last_meta: Any
    ) -> Any:
        meta = super().emit_partition_batch_new(attempt, partition, last_meta)
        if attempt.txid == self.die_at and partition == self.num_partitions() - 1:
            raise Killed(f"killed deciding txid {attempt.txid}")
        return meta


@pytest.fixture
def client(redis_url: str) -> Any:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


def write(client: redis.Redis) -> dict[str, list[str]]:
    """The entries, as ``XADD`` named them, per stream."""
    return {
        stream: [str(client.xadd(stream, {"kind": f"k{i % 3}"})) for i in range(n)]
        for stream, n in SIZES.items()
    }


def harness(
    spark: Any, redis_url: str, tmp_path: Path, spout: Callable[[], RedisStreamsPartitionedSpout]
) -> TopologyHarness:
    def build() -> Topology:
        sink = RedisCommitter(redis_url, {"default": CounterTable("seen", ("entry",))})
        return (
            TopologyBuilder()
            .set_spout(spout())
            .set_bolt("count", CountEntries())
            .set_committer("sink", sink, "count")
            .build()
        )

    return TopologyHarness(
        build,
        spark,
        topology_id=TOPOLOGY,
        state_dir=tmp_path / "state",
        strict=True,
        guarantee=Guarantee.EXACTLY_ONCE,
    )


def seen(client: redis.Redis) -> dict[str, int]:
    counts: Any = client.hgetall("seen")
    return {k: int(v) for k, v in counts.items()}


def once(ids: dict[str, list[str]], upto: Callable[[str], int] | None = None) -> dict[str, int]:
    """Every entry (or each stream's first ``upto(stream)``) counted once."""
    return {
        f"{stream} {entry}": 1
        for stream, entries in ids.items()
        for entry in entries[: upto(stream) if upto else None]
    }


def pending(client: redis.Redis) -> dict[str, list[tuple[str, str]]]:
    """Per stream, the group's pending entries and the consumer each is pending with."""
    out = {}
    for stream in SIZES:
        rows: Any = client.xpending_range(stream, GROUP, "-", "+", 1000)
        out[stream] = [(r["message_id"], r["consumer"]) for r in rows]
    return out


def group_info(client: redis.Redis, stream: str) -> dict[str, Any]:
    groups: Any = client.xinfo_groups(stream)
    (info,) = [g for g in groups if g["name"] == GROUP]
    return dict(info)


def consumers(client: redis.Redis) -> set[str]:
    found: set[str] = set()
    for stream in SIZES:
        replies: Any = client.xinfo_consumers(stream, GROUP)
        found |= {c["name"] for c in replies}
    return found


def assert_all_acknowledged(client: redis.Redis, ids: dict[str, list[str]]) -> None:
    """Nothing pending; each group delivered exactly its stream's entries; no consumer
    left (the dead runner's removed once claimed, the last one at its clean stop)."""
    assert pending(client) == {stream: [] for stream in SIZES}
    for stream, entries in ids.items():
        info = group_info(client, stream)
        assert (info["pending"], info["last-delivered-id"]) == (
            0,
            entries[-1] if entries else "0-0",
        )
        assert info["entries-read"] == (len(entries) or None)
    assert consumers(client) == set()


def test_runs_killed_before_the_ack_and_before_the_store_lose_nothing_and_count_nothing_twice(
    spark: Any, redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    """Run 1 dies between txid 2's commit and its ``XACK``; run 2 dies once txid 3's
    entries were delivered (``XREADGROUP``), before its ranges were stored; run 3, with
    bigger batches, drains."""
    ids = write(client)  # "g:c" does not exist: the group mode creates it with its group
    runs = iter([(BATCH, None), (BATCH, 3), (6, None)])

    def spout() -> DiesDeciding:
        size, die_at = next(runs)
        made = DiesDeciding(redis_url, list(SIZES), size, group=GROUP)
        made.die_at = die_at
        return made

    run = harness(spark, redis_url, tmp_path, spout)
    first = run.run_until_drained(
        FaultPlan().crash(FaultPoint.AFTER_ADVANCE, txid=2), max_pending=1
    )
    assert first.crashed and first.stats.committed_txids == 2
    # Txids 1 and 2 are in the sink once each; txid 1 was acknowledged, txid 2 (committed,
    # the store advanced past it) is still pending with the dead runner's consumer.
    assert seen(client) == once(ids, lambda s: 2 * BATCH)
    assert store_state(tmp_path / "state", TOPOLOGY)[0] == 3
    (dead,) = {consumer for rows in pending(client).values() for _, consumer in rows}
    assert dead.startswith(f"{TOPOLOGY}:")
    assert pending(client) == {s: [(e, dead) for e in ids[s][BATCH : 2 * BATCH]] for s in SIZES}

    with pytest.raises(Killed):
        run.run_until_drained(max_pending=1)
    # Run 2 claimed txid 2's entries and removed the dead consumer; then txid 3's entries
    # were delivered to it, and no stored txid holds them.
    currtx, stored = store_state(tmp_path / "state", TOPOLOGY)
    assert currtx == 3 and max(stored) == 2
    assert seen(client) == once(ids, lambda s: 2 * BATCH)
    (killed,) = consumers(client)
    assert killed != dead
    assert pending(client) == {s: [(e, killed) for e in ids[s][BATCH:]] for s in SIZES}
    assert group_info(client, "g:a")["last-delivered-id"] == ids["g:a"][-1]
    ids["g:a"] += [str(client.xadd("g:a", {"kind": "late"})) for _ in range(3)]

    third = run.run_until_drained(max_pending=1)
    # Txid 3: the 3 entries delivered to run 2, then the 3 added since; txid 2 is not
    # replayed, and its entries were acknowledged with txid 3.
    assert third.stats.committed_txids == 1
    assert seen(client) == once(ids)  # every entry exactly once
    assert_all_acknowledged(client, ids)


def test_at_least_once_a_txid_written_then_crashed_counts_twice_and_nothing_is_lost(
    spark: Any, redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    ids = write(client)

    def spout() -> RedisStreamsPartitionedSpout:
        return RedisStreamsPartitionedSpout(redis_url, list(SIZES), BATCH, group=GROUP)

    run = harness(spark, redis_url, tmp_path, spout)
    first = run.run_until_drained(
        FaultPlan().crash(FaultPoint.AFTER_SINK_WRITE, txid=2),
        max_pending=1,
        guarantee=Guarantee.AT_LEAST_ONCE,
    )
    assert first.crashed  # the crash fired, after the sink took txid 2
    assert run.run_until_drained(max_pending=1, guarantee=Guarantee.AT_LEAST_ONCE).stats
    # Txid 2's entries (each stream's second batch) twice: written, then replayed.
    twice = once(ids, lambda s: 2 * BATCH).keys() - once(ids, lambda s: BATCH).keys()
    assert seen(client) == {k: 2 if k in twice else 1 for k in once(ids)}
    assert_all_acknowledged(client, ids)


def test_at_most_once_a_txid_that_always_fails_is_dropped_and_still_acknowledged(
    spark: Any, redis_url: str, client: redis.Redis, tmp_path: Path
) -> None:
    ids = write(client)

    def spout() -> RedisStreamsPartitionedSpout:
        return RedisStreamsPartitionedSpout(redis_url, list(SIZES), BATCH, group=GROUP)

    run = harness(spark, redis_url, tmp_path, spout)
    done = run.run_until_drained(
        FaultPlan().fail(FaultPoint.EMIT, txid=2, attempts=None),
        max_pending=2,
        guarantee=Guarantee.AT_MOST_ONCE,
    )
    assert (done.stats.dropped_txids, done.stats.failures) == (1, 1)  # failed once, dropped
    # Txid 2's entries are never counted, and Redis is told they are done with.
    dropped = once(ids, lambda s: 2 * BATCH).keys() - once(ids, lambda s: BATCH).keys()
    assert seen(client) == {k: 1 for k in once(ids) if k not in dropped}
    assert_all_acknowledged(client, ids)


def test_the_hooks_acknowledge_what_is_done_and_nothing_else(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    ids = write(client)
    spout = opened(RedisStreamsPartitionedSpout(redis_url, list(SIZES), BATCH, group=GROUP), spark)
    one = {p: spout.emit_partition_batch_new(TransactionAttempt(1, 1), p, None) for p in range(3)}
    (me,) = consumers(client)
    assert me.startswith("test:")
    two = {p: spout.emit_partition_batch_new(TransactionAttempt(2, 1), p, one[p]) for p in range(3)}
    every = {s: [(e, me) for e in ids[s][: 2 * BATCH]] for s in SIZES}
    assert pending(client) == every

    spout.fail(1, one)  # replayed from its ranges: Redis is told nothing
    assert pending(client) == every
    # Txid 2 dropped (at most once) while txid 1 is in flight: only its own entries.
    spout.ack(2, two)
    assert pending(client) == {s: [(e, me) for e in ids[s][:BATCH]] for s in SIZES}
    # Txid 1 done, with everything below it: every pending entry up to its ranges' ends.
    spout.cleanup_before(1)
    spout.ack(1, one)
    assert pending(client) == {s: [] for s in SIZES}

    # A group moved back behind the stored ranges delivers none of their entries again.
    client.xgroup_setid("g:a", GROUP, "0-0")
    three = spout.emit_partition_batch_new(TransactionAttempt(3, 1), 0, two[0])
    assert (three.after, three.count, three.last) == (ids["g:a"][7], 3, ids["g:a"][10])
    assert pending(client)["g:a"] == [(e, me) for e in ids["g:a"][8:]]
    spout.cleanup_before(3)
    spout.ack(3, {0: three, 1: two[1], 2: two[2]})
    assert pending(client)["g:a"] == []
    # A group destroyed under a running topology is created again where its ranges end.
    client.xgroup_destroy("g:b", GROUP)
    late = str(client.xadd("g:b", {"kind": "late"}))
    four = spout.emit_partition_batch_new(TransactionAttempt(4, 1), 1, two[1])
    assert (four.after, four.count, four.last) == (ids["g:b"][-1], 1, late)
    assert pending(client)["g:b"] == [(late, me)]
    spout.cleanup_before(4)
    spout.ack(4, {0: three, 1: four, 2: two[2]})
    assert pending(client) == {s: [] for s in SIZES}
    spout.close()
    assert consumers(client) == set()  # a clean stop with nothing pending leaves nothing


def test_the_opaque_spout_reads_through_the_group_and_replays_what_was_delivered(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    ids = write(client)
    spout = opened(RedisStreamsOpaqueSpout(redis_url, ["g:a"], BATCH, group=GROUP), spark)
    first, frame = spout.emit_partition_batch(TransactionAttempt(1, 1), 0, None)
    assert [r["id"] for r in frame.collect()] == ids["g:a"][:BATCH]
    spout.fail(1, {0: first})
    # The replay starts after the last committed metadata (none): the same entries,
    # which the group delivered already, and no other.
    again, frame = spout.emit_partition_batch(TransactionAttempt(1, 2), 0, None)
    assert [r["id"] for r in frame.collect()] == ids["g:a"][:BATCH]
    assert again == first
    assert group_info(client, "g:a")["last-delivered-id"] == ids["g:a"][BATCH - 1]
    spout.cleanup_before(1)
    spout.ack(1, {0: again})
    assert group_info(client, "g:a")["pending"] == 0
    spout.close()


def test_the_group_is_created_where_the_topology_starts(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    ids = write(client)
    client.xgroup_create("g:b", GROUP, id="0-0")  # there already: left as it is

    def delivered(**settings: Any) -> dict[str, str]:
        spout = opened(
            RedisStreamsPartitionedSpout(redis_url, list(SIZES), group=GROUP, **settings), spark
        )
        spout.close()
        out = {s: group_info(client, s)["last-delivered-id"] for s in SIZES}
        for stream in ("g:a", "g:c"):
            client.xgroup_destroy(stream, GROUP)
        return out

    assert delivered() == {"g:a": "0-0", "g:b": "0-0", "g:c": "0-0"}
    assert delivered(start="latest") == {"g:a": ids["g:a"][-1], "g:b": "0-0", "g:c": "0-0"}
    assert delivered(start={"g:a": ids["g:a"][3]}) == {
        "g:a": before(ids["g:a"][3]),
        "g:b": "0-0",
        "g:c": "0-0",
    }


def test_bad_group_settings_are_refused_with_what_to_change(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    client.xadd("s", {"kind": "x"})
    refused: dict[str, dict[str, Any]] = {
        "group must be the name of a consumer group": dict(group=""),
        "block_ms must be a whole number of milliseconds": dict(block_ms=True),
        rf"block_ms=-1: give 0 \(never wait\) up to {MAX_BLOCK_MS}": dict(block_ms=-1),
        rf"block_ms={MAX_BLOCK_MS + 1}: give 0": dict(block_ms=MAX_BLOCK_MS + 1),
    }
    for message, settings in refused.items():
        with pytest.raises(ConfigurationError, match=message):
            RedisStreamsPartitionedSpout(redis_url, ["s"], **settings)
    with pytest.raises(
        ConfigurationError,
        match=r"block_ms=2000 waits at least as long as the client's socket_timeout \(2\.0 s",
    ):
        opened(
            RedisStreamsPartitionedSpout(f"{redis_url}?socket_timeout=2", ["s"], block_ms=2000),
            spark,
        )

    client.xgroup_create("s", GROUP, id="0-0")
    client.xreadgroup(GROUP, "billing-7", {"s": ">"})
    with pytest.raises(
        ConfigurationError,
        match=r"consumer group 'counters' of stream 's' is read by 'billing-7', which is not "
        r"topology 'test''s.*XGROUP DELCONSUMER s counters NAME",
    ):
        opened(RedisStreamsPartitionedSpout(redis_url, ["s"], group=GROUP), spark)
    client.set("plain", "x")
    with pytest.raises(ConfigurationError, match=r"'plain' is a string"):
        opened(RedisStreamsPartitionedSpout(redis_url, ["plain"], group="other"), spark)


def test_is_ready_waits_for_an_entry_up_to_block_ms(
    spark: Any, redis_url: str, client: redis.Redis
) -> None:
    client.xadd("w", {"kind": "old"})
    spout = opened(RedisStreamsPartitionedSpout(redis_url, ["w"], block_ms=MAX_BLOCK_MS), spark)
    # redis-py 8 ends a read after 5 s unless told otherwise: the source's client waits
    # longer than the longest block.
    connection = spout.client.connection_pool.get_connection()
    assert connection.socket_timeout > MAX_BLOCK_MS / 1000
    spout.client.connection_pool.release(connection)
    last = spout.emit_partition_batch_new(TransactionAttempt(1, 1), 0, None)

    answer: list[bool] = []
    began = time.monotonic()
    waiting = threading.Thread(target=lambda: answer.append(spout.is_ready(2, {0: last})))
    waiting.start()
    deadline = time.monotonic() + 5
    while not any(c.get("cmd") == "xread" for c in client.client_list()):
        assert time.monotonic() < deadline, "is_ready never blocked in XREAD"
        time.sleep(0.01)
    client.xadd("w", {"kind": "new"})
    waiting.join(timeout=MAX_BLOCK_MS / 1000)
    assert answer == [True]
    assert time.monotonic() - began < MAX_BLOCK_MS / 1000 / 2  # woken, not timed out
    spout.close()
