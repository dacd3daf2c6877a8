"""The history checker: a topology's sinks read with their own clients and judged,
record by record and key by key, against an answer computed apart from the topology.

How to use it, and what each verdict means: docs/how-to/check-history.md.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from committers.keys import decode_key, key_text, parse_key_type
from committers.tables import CounterTable
from committers.values import ValueType, parse_text
from transactional.committer import noted_fence

__all__ = [
    "Answer",
    "DeltaCommit",
    "Image",
    "Verdict",
    "assert_exact",
    "delta_log",
    "delta_root",
    "deposed",
    "judge",
    "read_delta",
    "read_redis",
]

#: A key as the checker compares it: each key column's text (None: null).
Key = tuple[str | None, ...]
Number = int | float | Decimal
#: The dead-letter table (Delta) and list (Redis) the ready-made committers write.
DEAD_LETTERS = "dead_letters"
#: What a verdict's text lists at most of each kind.
SHOWN = 5


@dataclass(frozen=True)
class Answer:
    """What the sinks hold once every input record is processed exactly once, computed
    from the input by the test, not by the topology.

    ``tables``: counter table name -> key -> value (a key is the key column's value, or
    a tuple of them for several columns). ``ids``: the name of one of those tables whose
    keys are record ids, each counted once per time the input holds the record; its
    keys are judged as records (lost, duplicated, phantom) rather than as counts.
    ``dead_letters``: the ``raw`` of each record that must become a dead letter, as
    many times as the input holds it."""

    tables: Mapping[str, Mapping[Any, Number]]
    ids: str | None = None
    dead_letters: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.ids is not None and self.ids not in self.tables:
            raise ValueError(f"Answer: ids names {self.ids!r}, which is not among its tables")

    @property
    def records(self) -> int | None:
        """Input records the answer accounts one by one: the ids table's counts and the
        dead letters; None without an ids table."""
        if self.ids is None:
            return None
        return int(sum(self.tables[self.ids].values())) + len(self.dead_letters)


@dataclass
class Image:
    """A sink as its own client reads it: every row, a row counting zero too."""

    sink: str
    #: Table name -> key (each key column's text) -> value.
    tables: dict[str, dict[Key, Number]] = field(default_factory=dict)
    #: Each dead letter's ``raw``.
    dead_letters: list[str] = field(default_factory=list)
    #: Keys, tables or rows that nothing a run writes explains, described.
    strange: list[str] = field(default_factory=list)
    #: What an undone or unfinished attempt left, described.
    leftovers: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    """One sink judged against an answer."""

    sink: str
    #: Records judged one by one (``Answer.records``); None without an ids table.
    records: int | None
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
        """How many of each kind (``records``: 0 without an ids table)."""
        return {
            "records": self.records or 0,
            **{kind: len(getattr(self, kind)) for kind in KINDS},
        }

    def __str__(self) -> str:
        head = f"{self.sink}: " + (
            f"{self.records} records" if self.records is not None else "every table"
        )
        if self.exact:
            return f"{head}, exact"
        parts = [head]
        for kind in KINDS:
            found = getattr(self, kind)
            if found:
                more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
                parts.append(f"{len(found)} {kind} ({'; '.join(found[:SHOWN])}{more})")
        return ", ".join(parts)


KINDS = ("lost", "duplicated", "phantoms", "leftovers", "miscounted")


def judge(
    image: Image,
    answer: Answer,
    tables: Sequence[CounterTable] = (),
    *,
    midway: bool = False,
) -> Verdict:
    """``image`` against ``answer``. ``tables``: the committers' counter tables, for
    their key types (a key is compared as its columns' texts; undeclared: strings).

    - **lost**: a record (a key of the ids table, or a dead letter) the sink holds fewer
      times than the input does;
    - **duplicated**: one it holds more times;
    - **phantoms**: a record, dead letter or key no input record explains, a table the
      answer does not have, and whatever the reader found strange;
    - **leftovers**: a key counting 0 that no record explains (an undo that did not
      delete it), and what the reader found an attempt left;
    - **miscounted**: a key of another table whose value differs from the answer's.

    ``midway``: the image was read while a run goes on: only what no later commit can
    put right is wrong (a record held more often than the input holds it, a phantom, a
    count above the answer's); nothing is lost yet, and an attempt may still be undone."""
    declared = {t.name: t for t in tables}
    lost: list[str] = []
    duplicated: list[str] = []
    phantoms = list(image.strange)
    leftovers = list(image.leftovers)
    miscounted: list[str] = []
    phantoms += [f"table {name!r}" for name in sorted(set(image.tables) - set(answer.tables))]
    for name, wanted in answer.tables.items():
        texts = _key_texts(declared.get(name))
        want = {texts(key): value for key, value in wanted.items()}
        got = image.tables.get(name, {})
        for key in sorted(set(want) | set(got), key=_order):
            what = f"{name} {_shown(key)}"
            has, needs = got.get(key, 0), want.get(key, 0)
            if name == answer.ids:
                _records(what, int(needs), int(has), lost, duplicated, phantoms, leftovers)
            elif key not in want:
                (leftovers if has == 0 else phantoms).append(f"{what} counting {has}")
            elif has > needs or (has < needs and not midway):
                miscounted.append(f"{what}: {has}, not {needs}")
    letters, wanted_letters = Counter(image.dead_letters), Counter(answer.dead_letters)
    for raw in sorted(set(letters) | set(wanted_letters)):
        what = f"dead letter {raw[:60]!r}"
        _records(what, wanted_letters[raw], letters[raw], lost, duplicated, phantoms)
    return Verdict(
        image.sink,
        answer.records,
        () if midway else tuple(lost),
        tuple(duplicated),
        tuple(phantoms),
        () if midway else tuple(leftovers),
        tuple(miscounted),
    )


def assert_exact(image: Image, answer: Answer, tables: Sequence[CounterTable] = ()) -> None:
    """``image`` holds exactly ``answer`` (``judge``), or an ``AssertionError`` saying
    what is lost, duplicated, phantom, left over or miscounted."""
    verdict = judge(image, answer, tables)
    assert verdict.exact, str(verdict)


def _records(
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


def _key_texts(table: CounterTable | None) -> Callable[[Any], Key]:
    """An answer's key as the texts of its columns, by the table's declared key types."""
    if table is None:
        return lambda key: tuple(_text("string", v) for v in _columns(key))
    types = [parse_key_type(table.key_types.get(k, "string")) for k in table.keys]

    def texts(key: Any) -> Key:
        values = _columns(key)
        if len(values) != len(types):
            raise ValueError(
                f"Answer: key {key!r} of table {table.name!r} has {len(values)} column(s), "
                f"the table {len(types)} ({', '.join(table.keys)})"
            )
        return tuple(_text(sql, v) for sql, v in zip(types, values, strict=True))

    return texts


def _columns(key: Any) -> tuple[Any, ...]:
    return key if isinstance(key, tuple) else (key,)


def _text(sql: str, value: Any) -> str | None:
    """A key column's value as text: Redis's field text where Redis keys on the type
    (``committers.keys``), else a text of its own."""
    if value is None:
        return None
    if sql == "string":
        return str(value)
    if sql == "binary":
        return bytes(value).hex()
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if sql.startswith("decimal"):
        return str(Decimal(value))
    try:
        return key_text(sql)(value)
    except ValueError:
        return str(value)


def _order(key: Key) -> tuple[tuple[int, str], ...]:
    return tuple((0, "") if v is None else (1, v) for v in key)


def _shown(key: Key) -> str:
    return repr(key[0]) if len(key) == 1 else repr(key)


# -- reading the sinks ---------------------------------------------------------------


def read_redis(
    url: str,
    tables: Sequence[CounterTable],
    *,
    key_prefix: str = "",
    dead_letters_key: str = DEAD_LETTERS,
    cluster: bool = False,
    inputs: str | None = None,
) -> Image:
    """The counter tables' hashes behind ``key_prefix`` (as ``RedisCommitter`` was given
    them; a table never written is not in the image), its dead-letter list, and every other key behind the prefix, read with
    redis-py (``cluster``: its Redis Cluster client). A committer's bookkeeping keys
    (``<prefix>transactional:...``) are expected, a staging list of an unfinished commit
    is a leftover, any other key is strange unless it matches the glob ``inputs`` (the
    run's own input kept in the same Redis, say)."""
    import redis
    import redis.cluster

    client: Any = (
        redis.cluster.RedisCluster.from_url(url, decode_responses=True)
        if cluster
        else redis.Redis.from_url(url, decode_responses=True)
    )
    image = Image("redis")
    try:
        for table in tables:
            if not client.exists(key_prefix + table.name):
                continue  # never written (Redis keeps no empty hash)
            declared = ValueType.parse(table.value_type)
            image.tables[table.name] = {
                decode_key(k, len(table.keys)): parse_text(v, declared)
                for k, v in client.hgetall(key_prefix + table.name).items()
            }
        letters = client.lrange(key_prefix + dead_letters_key, 0, -1)
        image.dead_letters = [json.loads(v)["raw"] for v in letters]
        known = {key_prefix + t.name for t in tables} | {key_prefix + dead_letters_key}
        pattern = _glob_escaped(key_prefix) + "*"
        for key in sorted(set(client.scan_iter(match=pattern, count=1000))):
            if key in known or (inputs is not None and fnmatch.fnmatchcase(key, inputs)):
                continue
            rest = key[len(key_prefix) :]
            if not rest.startswith("transactional:"):
                image.strange.append(f"key {key!r}")
            elif ":stage:" in rest:
                image.leftovers.append(f"staging key {key!r}")
        return image
    finally:
        client.close()


def _glob_escaped(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def read_delta(
    root: str | os.PathLike[str],
    tables: Sequence[CounterTable],
    *,
    dead_letters: str = DEAD_LETTERS,
    committed: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> Image:
    """The counter tables under ``root`` (a directory or an ``s3://`` URL, as
    ``DeltaCommitter`` was given it; a table not created is not in the image) and its
    dead-letter table, read with ``deltalake``: every row, a zero count too. Any other entry under ``root`` is strange.
    ``committed``: the last txid the run committed, past which an opaque table's row is
    a leftover. ``storage_options``: delta-rs's (by default it reads the standard AWS
    settings from the environment, as the committers do)."""
    import pyarrow.fs as pa_fs
    from deltalake import DeltaTable

    base = str(root).rstrip("/")
    options = dict(storage_options or {})
    image = Image("delta")

    def rows(name: str) -> list[dict[str, Any]]:
        table = DeltaTable(f"{base}/{name}", storage_options=options or None)
        return list(table.to_pyarrow_table().to_pylist())

    for table in tables:
        if not DeltaTable.is_deltatable(f"{base}/{table.name}", storage_options=options or None):
            continue
        types = [parse_key_type(table.key_types.get(k, "string")) for k in table.keys]
        got: dict[Key, Number] = {}
        for row in rows(table.name):
            key = tuple(_text(sql, row[k]) for sql, k in zip(types, table.keys, strict=True))
            what = f"{table.name} {_shown(key)}"
            if key in got:
                image.strange.append(f"{what}: two rows")
            got[key] = got.get(key, 0) + row[table.column]
            txid = row.get("txid")
            if committed is not None and txid is not None and txid > committed:
                image.leftovers.append(f"{what} marked txid {txid}, past the committed {committed}")
        image.tables[table.name] = got
    if DeltaTable.is_deltatable(f"{base}/{dead_letters}", storage_options=options or None):
        image.dead_letters = [r["raw"] for r in rows(dead_letters)]
    known = {t.name for t in tables} | {dead_letters}
    fs, where = delta_root(base)
    names = sorted(i.base_name for i in fs.get_file_info(pa_fs.FileSelector(where)))
    image.strange += [f"table {n!r}" for n in names if n not in known]
    for name in sorted(known & set(names)):
        log = delta_log(fs, f"{where}/{name}/_delta_log")
        image.strange += [
            f"{name} version {c.version}: rows changed in a commit with no txid marker"
            for c in log
            if c.changes and not c.marked
        ]
        image.strange += [
            f"{name} version {c.version}: rows changed under fence {c.fence} after version "
            f"{above.version} was written under fence {above.fence} (a deposed leader's write)"
            for c, above in deposed(log)
        ]
    return image


@dataclass(frozen=True)
class DeltaCommit:
    """One commit of a Delta table's log, as the checker reads it."""

    version: int
    #: The writer's fence token: the ``{"fence": N}`` of its ``userMetadata``, which the
    #: ready-made Delta committer writes in each commit, or the token a claim commit
    #: puts in the table (a ``txn`` whose app id ends ``:fence``); None: neither.
    fence: int | None
    #: It changes rows (an ``add`` or a ``remove`` with ``dataChange``); compaction,
    #: which only rewrites files, does not.
    changes: bool
    #: It carries a txid marker: a ``txn`` action of a committer's, not of its fence.
    marked: bool


def delta_root(root: str) -> tuple[Any, str]:
    """The ``pyarrow`` file system of ``root`` (a directory or an ``s3://`` URL, as
    ``DeltaCommitter`` was given it) and the path of ``root`` on it."""
    import pyarrow.fs as pa_fs

    base = str(root).rstrip("/")
    fs, where = pa_fs.FileSystem.from_uri(base if "://" in base else os.path.abspath(base))
    return fs, str(where)


def delta_log(fs: Any, log: str) -> list[DeltaCommit]:
    """The commits of the Delta log at ``log`` (the ``_delta_log`` directory, on the
    ``pyarrow`` file system ``fs``), in version order: the order Delta serialised them
    in. The ready-made committers put the txid marker in the commit of the rows it marks
    (so no crash leaves one without the other), and the writer's fence token in each
    commit: a commit that changes rows under a token below one an earlier commit
    carried was written by a leader deposed before it (``read_delta`` names both)."""
    import pyarrow.fs as pa_fs

    found = []
    for info in fs.get_file_info(pa_fs.FileSelector(log)):
        stem, _, suffix = info.base_name.partition(".")
        if suffix != "json" or not stem.isdigit():
            continue
        with fs.open_input_stream(info.path) as stream:
            actions = [json.loads(line) for line in stream.read().decode().splitlines() if line]
        changes = any(
            a[kind].get("dataChange") for a in actions for kind in ("add", "remove") if kind in a
        )
        apps = [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a]
        fences = [version for app, version in apps if app.endswith(":fence")]
        noted = [
            noted_fence(a["commitInfo"].get("userMetadata")) for a in actions if "commitInfo" in a
        ]
        fence = next((f for f in [*noted, *fences] if f is not None), None)
        marked = any(not app.endswith(":fence") for app, _ in apps)
        found.append(DeltaCommit(int(stem), fence, changes, marked))
    return sorted(found, key=lambda commit: commit.version)


def deposed(log: Sequence[DeltaCommit]) -> list[tuple[DeltaCommit, DeltaCommit]]:
    """Each commit of ``log`` (``delta_log``) that changed rows under a fence token below
    one an earlier commit carried, with the first commit that carried the highest token
    before it: a write of a leader deposed by then."""
    found = []
    highest: tuple[int, DeltaCommit] | None = None
    for commit in log:
        if commit.fence is None:
            continue
        if highest is None or commit.fence > highest[0]:
            highest = (commit.fence, commit)
        elif commit.changes and commit.fence < highest[0]:
            found.append((commit, highest[1]))
    return found
