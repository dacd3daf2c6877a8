"""The Redis Streams source on a real Redis, driven by hand the way a runner drives it:
every entry read once across txids, in order, the same metadata giving the same
records again; a stream trimmed under a stored range stops the partitioned spout and
is named by the opaque one; start positions; bad settings refused with what to change.
The expected records are the entries as this test wrote them (the ids ``XADD``
returned), not what the source reads."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.spouts import drive_partitioned, opened, rows
from transactional.errors import ConfigurationError, SourceDataLostError
from transactional.sources.redis_streams import (
    RedisStreamsOpaqueSpout,
    RedisStreamsPartitionedSpout,
)
from transactional.spout import PARTITION_COLUMN
from transactional.types import TransactionAttempt

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

pytestmark = [pytest.mark.integration, pytest.mark.connect]

COLUMNS = ("stream", "id", "fields", "raw", "error")


def _read(df: Any) -> list[tuple[Any, ...]]:
    return [
        (stream, entry, dict(fields) if fields is not None else None, raw, error)
        for stream, entry, fields, raw, error in rows(df, COLUMNS)
    ]


def _add(client: redis.Redis, stream: str, entries: list[dict[bytes, bytes]]) -> list[Any]:
    """XADD each entry; returns the record the source must give for it (``data`` is
    the value field)."""
    out = []
    for fields in entries:
        entry = client.xadd(stream, fields).decode()  # type: ignore[arg-type, union-attr]
        decoded = {
            k.decode(errors="backslashreplace"): v.decode(errors="backslashreplace")
            for k, v in fields.items()
        }
        valid = all(_utf8(k) and _utf8(v) for k, v in fields.items())
        raw = decoded.get("data")
        error = None if valid else "invalid UTF-8"
        if valid and raw is None:
            error = "no field 'data'"
        out.append((stream, entry, decoded, raw, error))
    return out


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _entries(stream: str, n: int) -> list[dict[bytes, bytes]]:
    out: list[dict[bytes, bytes]] = []
    for i in range(n):
        fields = {b"data": f"{stream}-{i} é".encode(), b"n": str(i).encode()}
        if i % 9 == 4:
            fields = {b"other": b"x"}  # no value field
        if i % 11 == 6:
            fields[b"data"] = b"caf\xe9"  # not UTF-8
        out.append(fields)
    return out


@pytest.fixture
def client(redis_url: str) -> Any:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def _spout(kind: type, redis_url: str, streams: list[str], **settings: Any) -> Any:
    return kind(redis_url, streams, **{"batch_size": 7, "value_field": "data", **settings})


@pytest.mark.parametrize("kind", [RedisStreamsPartitionedSpout, RedisStreamsOpaqueSpout])
def test_every_entry_is_read_once_in_order(
    spark: Any, client: Any, redis_url: str, kind: type
) -> None:
    streams = ["s:a", "s:b", "s:c"]
    expected = {
        p: _add(client, s, _entries(s, n))
        for p, (s, n) in enumerate(zip(streams, [20, 0, 9], strict=True))
    }
    client.xgroup_create("s:b", "g", id="$", mkstream=True)  # an empty stream that exists
    spout = opened(_spout(kind, redis_url, streams), spark)
    opaque = kind is RedisStreamsOpaqueSpout

    got, history = drive_partitioned(spout, {}, opaque, read=_read)
    assert got == expected
    assert all(m.count <= 7 for metas in history for m in metas.values())
    if not opaque:  # the same metadata gives the same records, one frame or one each
        metas = history[1]
        frame = spout.emit_partitions(TransactionAttempt(2, 2), metas)
        tagged = sorted((r[PARTITION_COLUMN], r["id"]) for r in frame.collect())
        assert tagged == sorted(
            (p, rec[1]) for p in metas for rec in expected[p][7 : 7 + metas[p].count]
        )
        again = _read(spout.emit_partition_batch(TransactionAttempt(2, 3), 0, metas[0]))
        assert again == expected[0][7:14]

    last = {p: m for metas in history for p, m in metas.items()}
    late = _add(client, "s:b", [{b"data": b"late"}])
    more, _ = drive_partitioned(spout, last, opaque, read=_read)
    assert more == {0: [], 1: late, 2: []}
    spout.close()


def test_a_trimmed_range_stops_the_partitioned_spout(
    spark: Any, client: Any, redis_url: str
) -> None:
    _add(client, "t", _entries("t", 30))
    spout = opened(_spout(RedisStreamsPartitionedSpout, redis_url, ["t"]), spark)
    attempt = TransactionAttempt(1, 1)
    first = spout.emit_partition_batch_new(attempt, 0, None)
    second = spout.emit_partition_batch_new(TransactionAttempt(2, 1), 0, first)
    client.xtrim("t", maxlen=25, approximate=False)  # entries 0..4: inside the first range
    with pytest.raises(SourceDataLostError, match=r"txid 1 reads the 7 entries of stream 't'"):
        spout.emit_partition_batch(attempt, 0, first)
    # The second range (entries 7..13) is whole: it still replays.
    assert len(_read(spout.emit_partition_batch(TransactionAttempt(2, 2), 0, second))) == 7
    client.xtrim("t", maxlen=10, approximate=False)  # entries 14..19, never read, are gone too
    with pytest.raises(
        SourceDataLostError, match=rf"6 entries of stream 't' after {second.last} were trimmed"
    ):
        spout.emit_partition_batch_new(TransactionAttempt(3, 1), 0, second)
    client.xdel("t", client.xrange("t")[3][0])  # entry 23, never read
    with pytest.raises(SourceDataLostError, match=r"were deleted \(XDEL\) before they were read"):
        spout.emit_partition_batch_new(
            TransactionAttempt(3, 1),
            0,
            second.model_copy(update={"last": client.xrange("t")[0][0].decode(), "position": 21}),
        )
    spout.close()


def test_the_opaque_spout_names_entries_trimmed_before_they_were_read(
    spark: Any, client: Any, redis_url: str
) -> None:
    expected = _add(client, "t", _entries("t", 30))
    spout = opened(_spout(RedisStreamsOpaqueSpout, redis_url, ["t"]), spark)
    first, frame = spout.emit_partition_batch(TransactionAttempt(1, 1), 0, None)
    assert _read(frame) == expected[:7]
    client.xtrim("t", maxlen=12, approximate=False)  # entries 7..17 are deleted unread
    meta, frame = spout.emit_partition_batch(TransactionAttempt(2, 1), 0, first)
    got = _read(frame)
    assert got[:7] == expected[18:25]
    assert got[7][:4] == ("t", None, None, None)
    assert got[7][4] == (
        f"11 entries of stream 't' after {expected[6][1]} were trimmed before they were "
        "read; the batch goes on from the next entry held"
    )
    assert (meta.lost, meta.count, meta.position) == (11, 7, 25)
    assert spout.lag() == 5
    after, frame = spout.emit_partition_batch(TransactionAttempt(3, 1), 0, meta)
    assert _read(frame) == expected[25:30] and after.lost == 0 and after.lost_note is None
    spout.close()


def test_start_positions(spark: Any, client: Any, redis_url: str) -> None:
    old = [client.xadd("p", {b"data": f"old{i}".encode()}, id=f"{1000 + i}-0") for i in range(3)]
    assert [o.decode() for o in old] == ["1000-0", "1001-0", "1002-0"]
    now = _add(client, "q", [{b"data": b"q0"}, {b"data": b"q1"}])

    def read(**start: Any) -> dict[int, list[Any]]:
        spout = opened(_spout(RedisStreamsPartitionedSpout, redis_url, ["p", "q"], **start), spark)
        got, _ = drive_partitioned(spout, {}, False, read=_read)
        spout.close()
        return {p: [r[3] for r in records] for p, records in got.items()}

    assert read() == {0: ["old0", "old1", "old2"], 1: ["q0", "q1"]}
    assert read(start={"p": "1001-0"}) == {0: ["old1", "old2"], 1: ["q0", "q1"]}
    assert read(start=dt.datetime(1970, 1, 1, 0, 0, 1, 1500, tzinfo=dt.UTC)) == {
        0: ["old2"],
        1: ["q0", "q1"],
    }
    latest = opened(
        _spout(RedisStreamsPartitionedSpout, redis_url, ["p", "q"], start="latest"), spark
    )
    assert latest.is_ready(1, {}) is False
    late = _add(client, "q", [{b"data": b"q2"}])
    got, _ = drive_partitioned(latest, {}, False, read=_read)
    assert got == {0: [], 1: late}
    assert now[1][1] < late[0][1]
    latest.close()


def test_bad_settings_are_refused_with_what_to_change(
    spark: Any, client: Any, redis_url: str
) -> None:
    client.set("plain", b"x")
    client.xadd("s", {b"data": b"1"})
    refused = {
        "streams must be a list of stream keys": dict(streams="s"),
        "a stream is named twice": dict(streams=["s", "s"]),
        "start must be 'earliest', 'latest'": dict(start="newest"),
        "start names 'z', which is not among the streams": dict(start={"z": "1-0"}),
        "start id 'soon' of stream 's' is not an entry id": dict(start={"s": "soon"}),
        "batch_size must be at least 1": dict(batch_size=0),
    }
    for message, settings in refused.items():
        with pytest.raises(ConfigurationError, match=message):
            RedisStreamsPartitionedSpout(redis_url, **{"streams": ["s"], **settings})
    with pytest.raises(ConfigurationError, match=r"'nope' does not exist, 'plain' is a string"):
        opened(RedisStreamsPartitionedSpout(redis_url, ["s", "nope", "plain"]), spark)
    with pytest.raises(ConfigurationError, match=r"cannot reach Redis at redis://127\.0\.0\.1:1/0"):
        opened(RedisStreamsPartitionedSpout("redis://127.0.0.1:1/0", ["s"]), spark)


@pytest.mark.classic
def test_the_docs_streams_example_counts_every_event_once(
    tmp_path: Path, client: Any, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    from collections import Counter

    from tests.docs import run_example

    events = {
        "events:0": [b"signup", b"login", b"login", b"caf\xe9"],
        "events:1": [b"login", b"logout"],
    }
    for stream, kinds in events.items():
        for kind in kinds:
            client.xadd(stream, {b"kind": kind})
    run_example(
        "docs/how-to/redis-streams.md",
        "",
        {"REDIS_URL": redis_url, "STATE": str(tmp_path / "state.db")},
        monkeypatch,
    )

    good = Counter(k.decode() for kinds in events.values() for k in kinds if _utf8(k))
    assert {k.decode(): int(v) for k, v in client.hgetall("kinds").items()} == good
    bad = [json.loads(v) for v in client.lrange("dead_letters", 0, -1)]
    assert [(b["raw"], b["reason"]) for b in bad] == [("caf\\xe9", "invalid UTF-8")]
