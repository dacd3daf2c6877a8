"""The driver's view of one Kafka topic: its partition count and offsets, asked of the
broker through confluent-kafka's admin client, one request per question for all the
partitions it concerns.

A txid's decision asks once: ``is_ready`` takes a ``Snapshot`` of every partition's
end (and the start of partitions never read), and the emits of the same attempt read
it instead of asking again. A snapshot serves one attempt: a replay asks afresh, so a
stale start never hides offsets retention deleted meanwhile.

An admin client that met an error is dropped and the next question builds a new one:
librdkafka's client keeps the leader epochs it knew before a broker restart and is then
refused (``FENCED_LEADER_EPOCH``) by the restarted broker for good.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

from transactional.errors import ConfigurationError, EmitError
from transactional.preflight import other_servers
from transactional.secrets import redact_url
from transactional.types import TransactionAttempt

log = logging.getLogger("transactional.sources.kafka")

Isolation = Literal["read_committed", "read_uncommitted"]


@dataclass
class Snapshot:
    """Offsets the broker gave for one txid: each partition's end, and the start of those
    asked. ``attempt`` is the attempt that uses it (None: not yet claimed)."""

    txid: int
    ends: dict[int, int]
    starts: dict[int, int] = field(default_factory=dict)
    attempt: TransactionAttempt | None = None


@dataclass(eq=False)
class KafkaOffsets:
    """The driver's view of ``topic``: its partition count and offsets, each asked once
    per question through one admin client (``who`` names the spout in errors)."""

    who: str
    bootstrap_servers: str
    topic: str
    isolation_level: Isolation
    #: Out of the repr: it may hold credentials (``sasl.password``).
    client_config: Mapping[str, str] = field(repr=False)
    timeout_s: float
    _admin: Any = field(init=False, default=None)
    #: From num_partitions, for the is_ready after it.
    _count: int | None = field(init=False, default=None)
    _snapshot: Snapshot | None = field(init=False, default=None)

    @property
    def admin(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            # librdkafka's lines (a broker restarting) through logging, not to stderr.
            config: dict[str, Any] = {
                **self.client_config,
                "bootstrap.servers": self.bootstrap_servers,
                "logger": log,
            }
            self._admin = AdminClient(config)
        return self._admin

    def close(self) -> None:
        self._admin = None
        self._snapshot = None

    def _failed(self, error: Exception) -> None:
        """Forget the client (and what it told) after an error: the next question
        starts from a new one."""
        log.info("kafka admin client dropped after an error", extra={"error": str(error)})
        self._admin = None
        self._snapshot = None

    # -- partitions -----------------------------------------------------------------

    def count(self, at_open: bool = False, timeout_s: float | None = None) -> int:
        """The topic's partition count. At ``open`` a broker that cannot be reached or a
        missing topic is bad configuration (``ConfigurationError``, the run stops);
        later it is a failure of the txid at hand (``EmitError``, retried), as when the
        broker restarts. ``timeout_s``: for this question only (default the spout's)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        from confluent_kafka import KafkaException

        error = ConfigurationError if at_open else EmitError
        where = redact_url(self.bootstrap_servers)
        if at_open:
            self._refuse_other_protocols(where)
        try:
            metadata = self.admin.list_topics(topic=self.topic, timeout=timeout)
            found = metadata.topics.get(self.topic)
            if found is not None and found.error is None:
                self._count = len(found.partitions)
                return self._count
            known = self.admin.list_topics(timeout=timeout).topics
        except KafkaException as e:
            self._failed(e)
            raise error(
                f"{self.who}: cannot reach Kafka at {where} ({e}): start the broker or fix "
                "bootstrap_servers"
            ) from e
        listed = ", ".join(sorted(t for t in known if not t.startswith("__"))) or "none"
        raise error(
            f"{self.who}: topic {self.topic!r} does not exist on {where} (topics there: "
            f"{listed}): create it or fix the topic name"
        )

    def _refuse_other_protocols(self, where: str) -> None:
        """A ``ConfigurationError`` at once when another protocol answers at every
        bootstrap server that takes a connection (a Redis port given for Kafka's:
        ``preflight.other_servers``), instead of librdkafka's timeout. Not over TLS,
        where a plain request proves nothing."""
        if "SSL" in str(self.client_config.get("security.protocol", "")).upper():
            return
        found = other_servers(_servers(self.bootstrap_servers), "Kafka")
        # None: a broker may answer there; unreachable servers are librdkafka's to name.
        others = [] if found is None else found[0]
        if others:
            raise ConfigurationError(
                f"{self.who}: no Kafka broker at {where} ({'; '.join(others)}): fix "
                "bootstrap_servers (host:port of the brokers)"
            )

    def counted(self) -> int:
        """The count the driver just asked for (it asks before ``is_ready``), else a new
        one. Used once: a later decision asks again."""
        count, self._count = self._count, None
        return count if count is not None else self.count()

    # -- offsets --------------------------------------------------------------------

    def offsets(self, specs: Mapping[int, Any]) -> dict[int, int]:
        """Each partition's offset for its ``OffsetSpec`` (-1: none, for a timestamp
        after the last record), in one request."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        if not specs:
            return {}
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self.isolation_level == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )
        try:
            futures = self.admin.list_offsets(
                {TopicPartition(self.topic, p): spec for p, spec in specs.items()},
                isolation_level=isolation,
                request_timeout=self.timeout_s,
            )
            # Bounded here too: after a broker restart a future may never complete, and
            # the driver would wait for it forever.
            deadline = time.monotonic() + 2 * self.timeout_s
            found = {
                tp.partition: int(f.result(timeout=max(0.0, deadline - time.monotonic())).offset)
                for tp, f in futures.items()
            }
        except KafkaException as e:
            self._failed(e)
            raise EmitError(f"{self.who}: offsets of {self.topic!r}: {e}") from e
        except FutureTimeout as e:
            self._failed(e)
            raise EmitError(
                f"{self.who}: offsets of {self.topic!r}: no answer from Kafka within "
                f"{2 * self.timeout_s:g}s; the txid is retried with a new client"
            ) from None
        # librdkafka answers a request its broker dropped (killed or stalled mid-request)
        # with no error and offset -1001 (OFFSET_INVALID): not an offset. Only a
        # timestamp's question has an answer below 0 (-1: no record at or after it).
        ends = (OffsetSpec.earliest(), OffsetSpec.latest())
        unanswered = {
            p: offset for p, offset in found.items() if offset < (0 if specs[p] in ends else -1)
        }
        if unanswered:
            error = EmitError(
                f"{self.who}: offsets of {self.topic!r}: no offset for partitions "
                f"{sorted(unanswered)} (librdkafka answered {unanswered}: the broker dropped "
                "the request); the txid is retried with a new client"
            )
            self._failed(error)
            raise error
        return found

    def earliest(self, partitions: Iterable[int]) -> dict[int, int]:
        from confluent_kafka.admin import OffsetSpec

        return self.offsets({p: OffsetSpec.earliest() for p in partitions})

    def latest(self, partitions: Iterable[int]) -> dict[int, int]:
        """The end of each partition: the last stable offset under ``read_committed``."""
        from confluent_kafka.admin import OffsetSpec

        return self.offsets({p: OffsetSpec.latest() for p in partitions})

    def at_time(self, partition: int, millis: int) -> int:
        """The first offset at or after ``millis`` (-1: none yet)."""
        from confluent_kafka.admin import OffsetSpec

        return self.offsets({partition: OffsetSpec.for_timestamp(millis)})[partition]

    # -- one txid's decision --------------------------------------------------------

    def snap(self, txid: int, partitions: int, unread: Iterable[int]) -> Snapshot:
        """A new snapshot for deciding ``txid``: every end, and the start of ``unread``."""
        snapshot = Snapshot(txid, self.latest(range(partitions)), self.earliest(unread))
        self._snapshot = snapshot
        return snapshot

    def for_attempt(self, attempt: TransactionAttempt, partition: int) -> Snapshot:
        """The snapshot ``attempt`` decides ``partition`` with: the one ``is_ready`` took
        for its txid if no other attempt used it, else a new one of every partition."""
        snapshot = self._snapshot
        if (
            snapshot is None
            or snapshot.txid != attempt.txid
            or snapshot.attempt not in (None, attempt)
            or partition not in snapshot.ends
        ):
            snapshot = self.snap(attempt.txid, self.count(), ())
        snapshot.attempt = attempt
        return snapshot

    def starts(self, snapshot: Snapshot, partitions: Iterable[int]) -> dict[int, int]:
        """The start of each of ``partitions``, asked once per snapshot."""
        wanted = [p for p in partitions if p not in snapshot.starts]
        snapshot.starts.update(self.earliest(wanted))
        return snapshot.starts


def _servers(bootstrap_servers: str) -> list[tuple[str, int]]:
    """``host:port`` of each bootstrap server (a ``PROTOCOL://`` prefix dropped, 9092
    by default); none when one of them is not in that form (librdkafka says why)."""
    servers = []
    for item in bootstrap_servers.split(","):
        address = item.strip().rpartition("://")[2]
        host, colon, port = address.rpartition(":")
        if not colon:
            host, port = address, "9092"
        if not host or not port.isdigit():
            return []
        servers.append((host.strip("[]"), int(port)))
    return servers
