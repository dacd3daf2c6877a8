"""The record-history checker: for every record of an input, how many times a sink
reflects it, read with the sink's own client (redis-py, ``deltalake``), never through
the framework's committers or readers.

After Jepsen's checkers (a history judged against a model computed apart from the
system) and Flink's end-to-end exactly-once tests (every record of the source counted
in the sink). The model is ``tests.reference``: the demo's counting rule written again
over the input's bytes. The demo must run with ``--record-ids``, which counts every
tweet under its own id as well, so each tweet is seen one by one; each bad line is one
dead letter, seen by its text. A verdict lists:

- **lost**: a record the sink reflects fewer times than the input holds it (0 for a
  record the input holds once);
- **duplicated**: a record reflected more times (2 or more);
- **phantoms**: something in the sink that no input record explains (an id, a dead
  letter, a hashtag, a user or a pair the input never made, or a key of the sink
  outside the tables and bookkeeping a run writes);
- **leftovers**: what an undone or unfinished attempt left behind (a row or field
  counting 0, which no record explains and an undo should have deleted; an opaque Delta
  row marked with a txid past the one the sink committed; a Redis staging list);
- **miscounted**: a hashtag, user or pair whose count differs from the records'.

A sink that holds no per-record ids fails the check (``MissingIds``): it could not show
a lost record. A test whose run did not count them says so (``ids=False``): then each
table is still judged key by key, every row and dead letter, but a lost or duplicated
tweet shows only as a miscount of its hashtags and users.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.reference import Expected

#: The demo's counter tables, by the name of the answer's field.
TABLES = {"hashtags": "hashtags", "users": "users", "pairs": "users_hashtags"}
#: Their key columns in Delta.
KEY_COLUMNS = {"hashtags": ("hashtag",), "users": ("user",), "pairs": ("user", "hashtag")}
IDS = "tweet_ids"
DEAD_LETTERS = "dead_letters"
#: What a verdict lists at most of each kind in its text.
SHOWN = 5


class MissingIds(AssertionError):
    """The sink holds no per-record ids: the run was not started with ``--record-ids``."""


@dataclass
class Image:
    """A sink as its own client reads it. Counter tables keep every row, zeros too."""

    sink: str
    #: ``hashtags``, ``users``, ``pairs`` (keys ``(user, hashtag)``), ``ids`` (int keys).
    counts: dict[str, Counter[Any]] = field(default_factory=dict)
    dead_letters: list[str] = field(default_factory=list)
    #: Keys or rows nothing a run writes explains, described.
    strange: list[str] = field(default_factory=list)
    #: Remnants of an attempt, described.
    leftovers: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    """One sink judged record by record against an input's answer."""

    sink: str
    #: Input records: tweets (each time the input holds one) and bad lines.
    records: int
    lost: tuple[str, ...] = ()
    duplicated: tuple[str, ...] = ()
    phantoms: tuple[str, ...] = ()
    leftovers: tuple[str, ...] = ()
    miscounted: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not (
            self.lost or self.duplicated or self.phantoms or self.leftovers or self.miscounted
        )

    def figures(self) -> dict[str, int]:
        return {
            "records": self.records,
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "phantoms": len(self.phantoms),
            "leftovers": len(self.leftovers),
            "miscounted": len(self.miscounted),
        }

    def __str__(self) -> str:
        parts = [f"{self.sink}: {self.records} records"]
        for name in ("lost", "duplicated", "phantoms", "leftovers", "miscounted"):
            found = getattr(self, name)
            if found:
                more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
                parts.append(f"{len(found)} {name} ({'; '.join(found[:SHOWN])}{more})")
        return ", ".join(parts) if not self.exact else f"{parts[0]}, exact"


def judge(image: Image, expected: Expected, *, midway: bool = False, ids: bool = True) -> Verdict:
    """``image`` against the answer ``expected`` (``tests.reference``), record by record
    (``ids=False``: the run did not count tweets by id, so they are not judged one by
    one, and ids in the sink are a phantom table).

    ``midway``: the image was read while a run goes on, so only what no later commit
    can put right is wrong: a record reflected more often than the input holds it (each
    commit of either sink, an opaque undo and redo too, is atomic per table), a phantom,
    a count above the records'. Nothing is lost yet, and an attempt may still be undone."""
    held = image.counts.get("ids")
    if held is None and ids:
        raise MissingIds(
            f"{image.sink}: no per-record ids in the sink; run the demo with --record-ids"
        )
    lost: list[str] = []
    duplicated: list[str] = []
    phantoms = list(image.strange)
    leftovers = list(image.leftovers)
    if not ids and held is not None:
        phantoms.append(f"{IDS}: {len(held)} ids a run without --record-ids never counts")
    for tweet in sorted(set(expected.ids) | set(held or ())) if ids else ():
        want, got = expected.ids.get(tweet, 0), (held or Counter()).get(tweet, 0)
        _compare(f"tweet {tweet}", want, got, lost, duplicated, phantoms, leftovers)
    wanted, letters = Counter(expected.dead_letters), Counter(image.dead_letters)
    for raw in sorted(set(wanted) | set(letters)):
        _compare(f"bad line {raw[:60]!r}", wanted[raw], letters[raw], lost, duplicated, phantoms)
    miscounted: list[str] = []
    for name in TABLES:
        want_table: Counter[Any] = getattr(expected, name)
        got_table = image.counts.get(name, Counter())
        for key in sorted(set(want_table) | set(got_table), key=repr):
            want, got = want_table.get(key, 0), got_table.get(key, 0)
            if key not in want_table:
                what = f"{name} {key!r} counting {got}"
                (leftovers if got == 0 else phantoms).append(what)
            elif got > want or (got < want and not midway):
                miscounted.append(f"{name} {key!r}: {got}, not {want}")
    return Verdict(
        image.sink,
        sum(expected.ids.values()) + len(expected.dead_letters),
        () if midway else tuple(lost),
        tuple(duplicated),
        tuple(phantoms),
        () if midway else tuple(leftovers),
        tuple(miscounted),
    )


def assert_exact(image: Image, expected: Expected, *, ids: bool) -> None:
    """``image`` holds exactly the answer ``expected`` (``judge``; ``ids``: whether the
    run counted tweets by id, ``--record-ids``), or an ``AssertionError`` listing what
    is lost, duplicated, phantom, left over or miscounted."""
    verdict = judge(image, expected, ids=ids)
    assert verdict.exact, str(verdict)


def _compare(
    what: str,
    want: int,
    got: int,
    lost: list[str],
    duplicated: list[str],
    phantoms: list[str],
    leftovers: list[str] | None = None,
) -> None:
    if want == 0 and got == 0 and leftovers is not None:
        leftovers.append(f"{what} counting 0")
    elif want == 0:
        phantoms.append(f"{what}, {got} times")
    elif got < want:
        lost.append(f"{what}: {got} of {want} times")
    elif got > want:
        duplicated.append(f"{what}: {got} times, not {want}")


# -- reading the sinks ---------------------------------------------------------------


def read_redis(
    url: str, prefix: str = "", *, cluster: bool = False, inputs: str | None = None
) -> Image:
    """The demo's tables in Redis behind ``prefix``, read with redis-py (``cluster``: its
    Redis Cluster client), and every other key behind the prefix: a committer's
    bookkeeping keys (``<prefix>transactional:...``) are expected, a staging list of an
    unfinished commit is a leftover, anything else is strange unless it matches the glob
    ``inputs`` (the run's own input, e.g. the demo's Redis queues ``tweets:*``)."""
    import redis
    import redis.cluster

    from committers import decode_key

    client: Any = (
        redis.cluster.RedisCluster.from_url(url, decode_responses=True)
        if cluster
        else redis.Redis.from_url(url, decode_responses=True)
    )
    image = Image("redis")
    try:
        for name, table in TABLES.items():
            fields = client.hgetall(prefix + table)
            image.counts[name] = Counter(
                {decode_key(k, 2) if name == "pairs" else k: int(v) for k, v in fields.items()}
            )
        if client.exists(prefix + IDS):
            ids = client.hgetall(prefix + IDS)
            image.counts["ids"] = Counter({int(k): int(v) for k, v in ids.items()})
        letters = client.lrange(prefix + DEAD_LETTERS, 0, -1)
        image.dead_letters = [json.loads(v)["raw"] for v in letters]
        known = {prefix + t for t in (*TABLES.values(), IDS, DEAD_LETTERS)}
        pattern = _glob_escaped(prefix) + "*"
        for key in sorted(set(client.scan_iter(match=pattern, count=1000))):
            if key in known or (inputs is not None and fnmatch.fnmatchcase(key, inputs)):
                continue
            rest = key[len(prefix) :]
            if not rest.startswith("transactional:"):
                image.strange.append(f"key {key!r}")
            elif ":stage:" in rest:
                image.leftovers.append(f"staging key {key!r}")
        return image
    finally:
        client.close()


def _glob_escaped(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def read_delta(path: Path | str, committed: int | None = None) -> Image:
    """The demo's tables under ``path`` (a directory or an S3 URL), read with
    ``deltalake`` (not Spark, not the committer): every row, a zero count too.
    ``committed``: the last txid the run committed, beyond which an opaque table's row
    is a leftover."""
    import pyarrow.fs as pa_fs
    from deltalake import DeltaTable

    root = str(path).rstrip("/")
    image = Image("delta")

    def rows(table: str) -> list[dict[str, Any]]:
        return DeltaTable(f"{root}/{table}").to_pyarrow_table().to_pylist()

    for name, table in TABLES.items():
        got: Counter[Any] = Counter()
        for row in rows(table):
            key = tuple(row[c] for c in KEY_COLUMNS[name])
            key = key if len(key) > 1 else key[0]
            _add(image, got, f"{table} {key!r}", key, row, committed)
        image.counts[name] = got
    if DeltaTable.is_deltatable(f"{root}/{IDS}"):  # with --record-ids
        ids: Counter[Any] = Counter()
        for row in rows(IDS):
            _add(image, ids, f"{IDS} {row['id']}", row["id"], row, committed)
        image.counts["ids"] = ids
    image.dead_letters = [r["raw"] for r in rows(DEAD_LETTERS)]
    known = {*TABLES.values(), IDS, DEAD_LETTERS}
    fs, where = pa_fs.FileSystem.from_uri(root if "://" in root else os.path.abspath(root))
    names = sorted(i.base_name for i in fs.get_file_info(pa_fs.FileSelector(where)))
    image.strange += [f"table {n!r}" for n in names if n not in known]
    return image


def _add(
    image: Image,
    table: Counter[Any],
    what: str,
    key: Any,
    row: Mapping[str, Any],
    committed: int | None,
) -> None:
    if key in table:
        image.strange.append(f"{what}: two rows")
    table[key] += row["count"]  # a row counting 0 stays a key of the Counter: judged
    txid = row.get("txid")
    if committed is not None and txid is not None and txid > committed:
        image.leftovers.append(f"{what} marked txid {txid}, past the committed {committed}")
