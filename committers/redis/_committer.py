"""Counters and dead letters in Redis, each commit one atomic Lua script
(``committers/redis/_commit.lua``, registered with redis-py's ``register_script``), on a
single server or a Redis Cluster (``committers.redis._cluster``)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from contextlib import suppress
from functools import partial
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from committers.counters import CounterCommitter, key_sums
from committers.keys import decode_key, encode_key
from committers.redis._batch import ABSENT, RedisBatch, combined, script_payload
from committers.redis._cluster import connect
from committers.redis._connection import RedisConnection
from committers.redis._fields import collected_fields
from committers.redis._names import RedisKeys
from committers.redis._read import RedisReader, RedisSnapshot
from committers.redis._reply import ReplyContext, held_text, script_outcome
from committers.redis._send import run_script, stage, too_large
from committers.tables import CounterTable, Number
from transactional._logfmt import kv
from transactional.committer import CommitterContext, Rollback
from transactional.errors import CommitError, ConfigurationError, ContractError
from transactional.lineage import Dataset, in_redis
from transactional.preflight import SECONDS, check_redis
from transactional.secrets import redact_url
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

if TYPE_CHECKING:
    import pyarrow as pa
    import redis
    from pyspark.sql import DataFrame

__all__ = ["ABSENT", "RedisBatch", "RedisCommitter", "RedisSnapshot", "decode_key", "encode_key"]

log = logging.getLogger("committers.redis")

#: The dead letters' frame in a collect plan (hash names cannot hold a space).
_DEAD = "dead letters"

#: A batch of more fields than this (all its hashes together) commits alone, never in a
#: group: the script's work is per field, grouped or not, so a group saves only each
#: commit's fixed cost (a round trip and the runner's store write, about a millisecond),
#: which adding the batches' fields on the driver costs from about this size on
#: (``benchmarks/redis_commit.py``: four txids of 1,000 fields as one group take what
#: they take one by one; of 125,000 tweets each, a group of three took 1.07 s against
#: 0.29 s for one alone, and held the driver's main thread meanwhile).
GROUP_FIELDS = 1_000

#: The commit script: see its header for what it checks and writes.
COMMIT_SCRIPT = files("committers.redis").joinpath("_commit.lua").read_text(encoding="utf-8")


class RedisCommitter(CounterCommitter):
    """Adds counter increments into Redis hashes and appends dead letters to a list.

    Layout: hash ``CounterTable.name``; field = the key, encoded by
    ``committers.keys.encode_key`` (a single-column key is its plain value, a null is
    ``\\N``; columns of a multi-column key are escaped and joined with ``:``;
    ``decode_key`` reverses it); value = the plain current value in both modes, so
    readers need not know the mode: an integer (``long``), the shortest text that reads
    back as the double (``double``), or plain decimal text with exactly ``scale``
    decimals (``decimal(p,s)``). Dead letters are JSON strings ``{"raw", "reason",
    "txid"}`` in the list ``dead_letters_key``. Bookkeeping lives under ``namespace``
    (default ``transactional:<topology id>:<committer name>``): ``:txid`` (last
    committed txid), ``:mode``, ``:value_types`` (hash -> the value type it holds),
    ``:fence`` (the highest fence token that committed, see ``CommitterContext``), and
    in opaque mode ``:undo`` and ``:undo_dl``. ``key_prefix`` goes before every key the
    committer writes: the hashes (``<key_prefix><table name>``), the dead-letter list
    and the default namespace.

    Redis Cluster (found at ``open``, from any node's URL): a commit is one script, and
    a script runs on one node over keys of one hash slot, so every key above must share
    a hash tag, as ``key_prefix="{myapp}:"`` gives them; any other layout is refused at
    ``open``, naming each key's slot. The committer then talks to the slot's master and
    finds it again when a failover moves the slot.

    Replicas: Redis replicates asynchronously, so a commit the master acknowledged can
    be lost when a replica takes over. After each commit the committer sends ``WAIT``
    for ``wait_replicas`` replicas (default: 1 when the master has a replica at
    ``open``, else 0), on the script's connection; fewer within ``wait_timeout_s`` make
    the commit fail and be retried (safe: the script sees its txid). Together with
    ``appendonly yes`` and ``appendfsync always`` on every node, a commit reported done
    survives the loss of its master.

    Timeouts: ``socket_timeout`` bounds each connect and each reply (a reply that never
    comes fails the commit, whose outcome the runner then reads from the sink's txid);
    the URL's own ``?socket_timeout=`` and ``?socket_connect_timeout=`` win over it, so
    a URL-only setting such as the demo's ``--redis-url`` can set them.

    Key types: string, tinyint/smallint/int/bigint, boolean (``true``/``false``) and
    date (``YYYY-MM-DD``); others are refused (declared in ``CounterTable.key_types``:
    at construction; otherwise on the first batch).

    Opaque mode keeps one undo log instead of ``(curr, prev, txid)`` per field. The two
    are equivalent here because commits are serial and in txid order: only the last
    committed txid can ever be committed again, so only its previous values are ever
    needed. The log maps ``"<hash>\\0<field>"`` to the value before the last txid (or
    ``ABSENT``) for every field that txid touched, and ``:undo_dl`` counts the dead
    letters it pushed, which are the list's tail. Re-committing that txid restores every
    such field, including ones the new attempt no longer has (a replay that dropped
    records stays exact), trims the tail, then applies and records a new log.
    """

    sink = "redis"
    #: ``collect_plan`` depends only on its inputs' schemas (``Committer.plan_once``).
    plan_once = True

    def __init__(
        self,
        url: str,
        counters: Mapping[str, CounterTable],
        dead_letters: str | None = None,
        mode: CommitMode = CommitMode.TRANSACTIONAL,
        namespace: str | None = None,
        socket_timeout: float = 30,
        dead_letters_key: str = "dead_letters",
        key_prefix: str = "",
        wait_replicas: int | None = None,
        wait_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(counters, dead_letters, mode)
        if wait_replicas is not None and wait_replicas < 0:
            raise ConfigurationError(f"wait_replicas={wait_replicas}: give 0 or more replicas")
        self.url = url
        self.socket_timeout = socket_timeout
        self.wait_replicas = wait_replicas
        self.wait_timeout_s = wait_timeout_s
        self._names = RedisKeys(key_prefix, key_prefix + dead_letters_key, namespace)
        self._connection = RedisConnection(url, socket_timeout)
        self._script: Any = None
        self._tables = {table.name: table for table in self.counters.values()}
        self._by_key = {self._names.hash(name): table for name, table in self._tables.items()}
        dead = dead_letters is not None
        self._reader = RedisReader(
            self._connection, self._names, self._tables, dead, wait_timeout_s
        )

    @property
    def namespace(self) -> str | None:
        """The bookkeeping keys' namespace (None until ``open`` unless given)."""
        return self._names.namespace

    @namespace.setter
    def namespace(self, namespace: str | None) -> None:
        self._names.namespace = namespace

    @property
    def key_prefix(self) -> str:
        """What goes before every key the committer writes."""
        return self._names.prefix

    @property
    def dead_letters_key(self) -> str:
        """The dead-letter list's key, ``key_prefix`` included."""
        return self._names.dead_letters

    def default_namespace(self, topology_id: str, name: str) -> str:
        """``<key_prefix>transactional:<topology id>:<committer name>``."""
        return self._names.default_namespace(topology_id, name)

    def lineage_datasets(self) -> Sequence[Dataset]:
        """Each counter table's hash, and the dead letters' list when there are any."""
        keys = [self._names.hash(t.name) for t in self.counters.values()]
        keys += [self._names.dead_letters] if self.dead_letters is not None else []
        return tuple(in_redis(self.url, key) for key in keys)

    def preflight(self) -> None:
        """One PING, with a few seconds to connect (a cluster answers it on any node)."""
        check_redis(connect(self.url, min(self.socket_timeout, SECONDS)), self.url)

    def open(self, context: CommitterContext) -> None:
        """Connect and check the namespace was written in this mode (an opaque replay
        needs the undo log that only opaque commits keep) and with these value types
        (a hash of doubles summed as integers would fail at the first commit)."""
        import redis

        self.context = context
        if self.namespace is None:
            self.namespace = self.default_namespace(context.topology_id, context.name)
        where = redact_url(self.url)
        names = self._names
        try:
            client = self._connection.open(names.of_commit(self._tables), self.who())
            stored_mode: str | None = client.get(names.key("mode"))  # type: ignore[assignment]
            held_types: dict[str, str] = client.hgetall(names.key("value_types"))  # type: ignore[assignment]
            committed = client.exists(names.key("txid"))
            replicas = int(client.info("replication").get("connected_slaves", 0))
        except (redis.RedisError, ValueError) as exc:
            self.close()
            raise ConfigurationError(
                f"{self.who()} cannot use Redis at {where}: {exc}. Check that "
                "redis-server is running there and that the URL's host, port, database "
                "and password are right."
            ) from exc
        wanted = min(replicas, 1) if self.wait_replicas is None else self.wait_replicas
        self._connection.replicas = wanted
        if stored_mode is not None and stored_mode != self.mode.value:
            self.close()
            raise ConfigurationError(
                f"Redis namespace {self.namespace!r} was committed in {stored_mode} mode, "
                f"but {self.who()} is in {self.mode.value} mode; switching would lose "
                "exactly-once. Use a new namespace (or topology id)."
            )
        for table in self.counters.values():
            # Namespaces committed before value types were recorded held integers only.
            held = held_types.get(names.hash(table.name), "long" if committed else None)
            if held is not None and held != table.stored_type:
                self.close()
                raise ConfigurationError(
                    f"Redis hash {names.hash(table.name)!r} holds {held_text(held)} (namespace "
                    f"{self.namespace!r}), but {self.who()} declares "
                    f"{held_text(table.stored_type)}: declare what it holds, or use a new "
                    "hash name and namespace (values are never converted in place)"
                )
        self._script = client.register_script(COMMIT_SCRIPT)
        if wanted:
            log.info(kv("redis_wait_replicas", committer=self.who(), replicas=wanted))

    def close(self) -> None:
        self._connection.close()

    def collect_plan(
        self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]
    ) -> dict[str, DataFrame]:
        """Per hash, the batch summed per key by Spark (``committers.counters.key_sums``);
        and the dead letters. The script needs every value on the driver anyway."""
        self.check_inputs(inputs)
        plan = {table.name: key_sums(inputs[name], table) for name, table in self.counters.items()}
        if self.dead_letters is not None:
            plan[_DEAD] = inputs[self.dead_letters].select("raw", "reason")
        return plan

    def prepare_collected(
        self,
        attempt: TransactionAttempt,
        inputs: Mapping[str, DataFrame],
        collected: Mapping[str, pa.Table],
    ) -> RedisBatch:
        """The sums as the script's fields, exact in the declared type (see
        ``committers.values.exact_sum``). A sum that cannot be stored is a
        ``ContractError`` here, before anything is committed."""
        batch = RedisBatch(attempt.txid)
        for input_name, table in self.counters.items():
            frame = partial(inputs.__getitem__, input_name)
            sums, refused = collected_fields(collected[table.name], frame, table)
            if refused:
                raise ContractError(
                    f"{self.who()}: txid {attempt.txid}, input {input_name!r}: Redis hash "
                    f"{table.name!r} (value_type={table.value_type!r}) cannot store the "
                    f"batch: key {'; key '.join(refused[:5])}. Nothing was committed; "
                    "filter or fix those records in a bolt (or send them to dead letters), "
                    "or use a wider value_type for a new hash"
                )
            batch.counters[table.name] = sums
        if self.dead_letters is not None:
            frame = collected[_DEAD]
            for raw, reason in zip(
                frame.column("raw").to_pylist(), frame.column("reason").to_pylist(), strict=True
            ):
                item = {"raw": raw, "reason": reason, "txid": attempt.txid}
                batch.dead_letters.append(json.dumps(item, ensure_ascii=False))
        return batch

    def overlapping_commits(self) -> bool:
        """Transactional mode with no last values and no double sums: the script keeps
        the marker at the end of the unbroken run of txids held, commits that land
        before one below them waiting in a sorted set (``ahead``). Dead letters of
        overlapping commits may be listed out of txid order; each keeps its own txid."""
        return self.mode is CommitMode.TRANSACTIONAL and not any(
            table.aggregate == "last"
            or (table.aggregate == "sum" and table.declared.kind == "double")
            for table in self._tables.values()
        )

    def groupable(self, prepared: RedisBatch) -> bool:
        """A batch of at most ``GROUP_FIELDS`` fields: a group's sums are added on the
        driver, exactly, which pays only for small batches."""
        fields: int = sum(table.num_rows for table in prepared.counters.values())
        return fields <= GROUP_FIELDS

    def commit(self, attempt: TransactionAttempt, prepared: RedisBatch) -> CommitOutcome:
        """One script call: check the txid, check every new value, undo (opaque replay),
        apply, record the txid. A lost reply is safe to retry: the script sees its own
        txid and skips or redoes."""
        self.check_prepared([attempt], [prepared])
        return self._commit(attempt.txid, attempt.txid, prepared)

    def commit_group(
        self, attempts: Sequence[TransactionAttempt], prepared: Sequence[RedisBatch | None]
    ) -> CommitOutcome:
        """The group's sums added per field on the driver (exactly: Python ints,
        decimals, ``math.fsum`` of the doubles), then one script call marked with the
        last txid; each dead letter keeps its own txid."""
        self.check_prepared(attempts, prepared)
        first, last = attempts[0].txid, attempts[-1].txid
        return self._commit(first, last, combined(last, prepared, self._tables, self.who()))

    def _commit(self, first: int, last: int, prepared: RedisBatch) -> CommitOutcome:
        import redis

        if self._script is None:
            raise CommitError("RedisCommitter.commit before open(): the runner must open it")
        names, replicas = self._names, self._connection.replicas
        hashes = [names.hash(name) for name in prepared.counters]
        keys = [names.key(s) for s in ("txid", "undo", "undo_dl", "mode")]
        keys += [names.dead_letters, names.key("fence"), names.key("value_types"), *hashes]
        # Read at each commit: the runner raises it when it takes leadership back.
        token = None if self.context is None else self.context.fence_token
        dead = self.dead_letters is not None
        payload = script_payload(first, last, prepared, self._tables, self.mode, dead, token)
        payload["sync"] = bool(replicas)
        payload["unchecked"] = self.context is not None and not self.context.checked
        what = f"txid {last}" if first == last else f"txids {first}..{last}"
        staged: list[str] = []
        client = self._connection.server()
        try:
            for counter in payload["counters"]:
                if too_large(counter["f"]):
                    staged.append(self._stage(client, counter.pop("f")))
                    keys.append(staged[-1])
                    counter["st"] = len(keys)
            settled = None if self.context is None else self.context.settled
            if settled is not None and payload["unchecked"]:
                keys.append(names.key("ahead"))
                payload["ahead"], payload["settled"] = len(keys), settled()
            (status, detail), acked = run_script(
                client, self._script, keys, json.dumps(payload), replicas, self.wait_timeout_s
            )
        except redis.RedisError as exc:
            self._connection.lost(exc)
            raise CommitError(
                f"Redis commit of {what} at {redact_url(self.url)} failed: "
                f"{type(exc).__name__}: {exc}. Retrying the commit is safe."
            ) from exc
        finally:
            if staged:
                with suppress(redis.RedisError):  # else they expire
                    client.delete(*staged)
        outcome = self._outcome(last, status, detail, token)
        if acked is not None and acked < replicas:
            raise CommitError(
                f"Redis commit of {what} at {redact_url(self.url)} is on the master, but "
                f"{acked} of the {replicas} replica(s) it waits for acknowledged it "
                f"within {self.wait_timeout_s}s (wait_replicas, wait_timeout_s): it could "
                "still be lost if the master failed now, so it is not reported done. "
                "Retrying the commit is safe (the script sees its own txid)."
            )
        return outcome

    def _stage(self, client: redis.Redis, fields: list[str]) -> str:
        """Stage one counter's ``[field, increment, ...]`` in a list of its own
        (``committers.redis._send.stage``); its key."""
        key = self._names.key(f"stage:{uuid.uuid4().hex}")
        stage(client, key, fields)
        return key

    def _outcome(self, txid: int, status: str, detail: str, token: int | None) -> CommitOutcome:
        """What the script's reply means: an outcome, or the error it reports."""
        assert self.namespace is not None
        where = ReplyContext(self.who(), self.namespace, self.mode, self._by_key)
        return script_outcome(where, txid, status, detail, token)

    def rollback(self, topology_id: str, name: str, txid: int) -> Rollback:
        """Refused: Redis keeps no earlier versions of its hashes."""
        raise ConfigurationError(
            f"committer {name!r} ({type(self).__name__}) cannot roll Redis back to txid "
            f"{txid}: Redis keeps no earlier versions of its hashes, so nothing was "
            "changed. To process a range again into Redis, run the topology under a new "
            "topology id and namespace (with new hash names), from --start-from"
        )

    # -- reading back (``RedisReader``) ------------------------------------------------

    def committed_txid(self) -> int | None:
        """The txid the namespace holds. With replicas to wait for, only once they
        acknowledged it (else a ``CommitError``): the runner reads this when a commit's
        outcome is unknown, and must not take for done a txid a failover could lose."""
        return self._reader.committed_txid()

    def sink_marker(self, topology_id: str, name: str) -> int | None:
        return self._reader.sink_marker(topology_id, name)

    def read(self, table: str) -> dict[tuple[str | None, ...], Number]:
        """The current values of counter table ``table`` (its name), keyed by the key
        columns' texts (None: null), each value as Python's exact type (int, float,
        Decimal). One HGETALL: a consistent view of that hash. Needs no ``open``."""
        return self._reader.read(table)

    def lookup(self, table: CounterTable, keys: list[tuple[Any, ...]]) -> list[Number | None]:
        """One HMGET of the keys' fields (``committers.states.key_texts``)."""
        return self._reader.lookup(table, keys)

    def read_all(self) -> RedisSnapshot:
        """Every counter table, the dead letters and the committed txid, in one
        MULTI/EXEC: all as of one committed txid. Needs ``open`` or a ``namespace``."""
        return self._reader.read_all()

    def dead_letter_count(self) -> int:
        """How many dead letters the list holds (one LLEN). Needs no ``open``."""
        return self._reader.dead_letter_count()
