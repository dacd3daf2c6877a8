"""Redis Cluster for the Redis committer: every key of a commit in one hash slot, and a
connection to the master that holds that slot, found again after a failover.

A Redis script runs atomically only on one node, over keys of one slot: so a commit's
hashes, dead-letter list and bookkeeping keys (its txid marker among them) must share a
hash tag (the part of a key between the first ``{`` and the next ``}``, which alone
decides the slot). ``one_slot`` checks that when the committer opens and refuses any
other layout. ``SlotOwner`` then talks to the slot's master directly (not through
redis-py's ``RedisCluster``), so that the commit script and the ``WAIT`` for replicas
after it go over one connection: ``WAIT`` counts the replicas that acknowledged *this
connection's* writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from transactional.errors import ConfigurationError
from transactional.secrets import redact_url

if TYPE_CHECKING:
    import redis

__all__ = ["SlotOwner", "connect", "is_cluster", "one_slot", "slot_of"]


def connect(url: str, socket_timeout: float, host: str | None = None, port: int = 0) -> redis.Redis:
    """A client of the server at ``url`` (or at ``host``:``port`` with the URL's
    credentials, database and TLS), with no retry inside redis-py: the runner retries a
    whole commit, and the txid check makes that exact; a hidden retry would only
    stretch timeouts."""
    import redis
    from redis.backoff import NoBackoff
    from redis.connection import parse_url
    from redis.retry import Retry

    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_timeout,
        **parse_url(url),  # its ?socket_timeout= and ?socket_connect_timeout= win
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": True,
    }
    if host is not None:
        options.update(host=host, port=port)
    pool = redis.ConnectionPool(**options)
    return redis.Redis(connection_pool=pool)


def is_cluster(client: redis.Redis) -> bool:
    """Whether the server is a node of a Redis Cluster."""
    info: dict[str, Any] = client.info("cluster")
    return bool(info.get("cluster_enabled"))


def slot_of(key: str) -> int:
    """The hash slot of ``key`` (only its hash tag counts when it has one)."""
    from redis.crc import key_slot

    return int(key_slot(key.encode()))


def one_slot(keys: Mapping[str, str], who: str, url: str) -> int:
    """The one slot of ``keys`` (what each key is -> the key), or a
    ``ConfigurationError`` listing them by slot and saying how to name them."""
    slots = {what: slot_of(key) for what, key in keys.items()}
    if len(set(slots.values())) == 1:
        return next(iter(slots.values()))
    listed = "; ".join(f"{what} {keys[what]!r} in slot {slot}" for what, slot in slots.items())
    raise ConfigurationError(
        f"{who} cannot commit atomically on the Redis Cluster at {redact_url(url)}: a "
        f"commit's keys must all be in one hash slot, and these are not: {listed}. Give "
        "them one hash tag: key_prefix='{myapp}:' names every key the committer writes "
        "'{myapp}:...' (the hashes, the dead-letter list and the default namespace); an "
        "explicit namespace= needs the same tag"
    )


class SlotOwner:
    """A connection to the master that holds ``slot``. The slot map is read with
    ``CLUSTER SLOTS`` from the first node that answers: the URL's node, then every node
    seen in an earlier map (the URL's node may be the one that died). ``failed`` after an
    error forgets the connection, or follows a ``MOVED`` reply at once, so the next
    ``client()`` reaches the slot's new master after a failover."""

    def __init__(self, url: str, slot: int, socket_timeout: float) -> None:
        self.url = url
        self.slot = slot
        self.socket_timeout = socket_timeout
        self._client: redis.Redis | None = None
        self._known: list[tuple[str, int]] = []
        self._moved_to: tuple[str, int] | None = None

    def client(self) -> redis.Redis:
        if self._client is None:
            host, port = self._moved_to or self._find()
            self._moved_to = None
            self._client = connect(self.url, self.socket_timeout, host, port)
        return self._client

    def failed(self, error: BaseException) -> None:
        """Forget the connection after ``error``; a ``MOVED`` names the new owner."""
        text = str(error)
        if text.startswith("MOVED "):
            host, _, port = text.split()[-1].rpartition(":")
            self._moved_to = (host, int(port))
        self.close()

    def close(self) -> None:
        if self._client is not None:
            with suppress(Exception):
                self._client.close()
            self._client = None

    def _find(self) -> tuple[str, int]:
        import redis

        errors = []
        candidates: list[tuple[str | None, int]] = [(None, 0), *self._known]
        for host, port in candidates:
            client = connect(self.url, self.socket_timeout, host, port)
            try:
                ranges: Any = client.execute_command("CLUSTER SLOTS")
            except redis.RedisError as exc:
                errors.append(f"{host or 'the URL'}:{port or ''} {exc}")
                continue
            finally:
                client.close()
            nodes = [(str(n[0]), int(n[1])) for r in ranges for n in r[2:]]
            self._known = list(dict.fromkeys([*nodes, *self._known]))
            for start, end, master, *_ in ranges:
                if int(start) <= self.slot <= int(end):
                    return str(master[0]), int(master[1])
            errors.append(f"{host or 'the URL'}: no master holds slot {self.slot}")
        raise redis.ConnectionError(
            f"no node of the Redis Cluster at {redact_url(self.url)} names the master of "
            f"slot {self.slot}: {'; '.join(errors)}"
        )
