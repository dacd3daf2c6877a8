"""A Redis committer's connection, shared by its writes and its reads: the client of a
single server, or on a Redis Cluster the master of the slot its keys share
(``committers.redis._cluster.SlotOwner``), found again after a failover; and the
replicas each commit waits for."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from committers.redis._cluster import SlotOwner, connect, is_cluster, one_slot, slot_of
from transactional.errors import CommitError

if TYPE_CHECKING:
    import redis

__all__ = ["RedisConnection"]


class RedisConnection:
    """The server that holds a committer's keys, from ``open`` to ``close``; before
    ``open`` (or after ``close``), ``reader`` still reaches it with a client of its own."""

    def __init__(self, url: str, socket_timeout: float) -> None:
        self.url = url
        self.socket_timeout = socket_timeout
        self._client: redis.Redis | None = None
        #: The slot's master on a Redis Cluster (None: a single server).
        self._owner: SlotOwner | None = None
        #: Replicas each commit waits for (the committer decides at open).
        self.replicas = 0

    def connect(self) -> redis.Redis:
        """A new client of the URL's server (the caller closes it)."""
        return connect(self.url, self.socket_timeout)

    def open(self, keys: Mapping[str, str], who: str) -> redis.Redis:
        """Connect (one PING) and keep the client of the server that holds ``keys`` (what
        each is -> the key): on a Redis Cluster, the master of the one slot they must
        share (``one_slot``, a ``ConfigurationError`` naming ``who`` otherwise)."""
        client = self.connect()
        client.ping()
        if is_cluster(client):
            client.close()
            self._owner = SlotOwner(self.url, one_slot(keys, who, self.url), self.socket_timeout)
            client = self._owner.client()
        else:
            self._client = client
        return client

    def server(self) -> redis.Redis:
        """The client of the server that holds the committer's keys: on a Redis
        Cluster, the slot's master now (found again after a failure)."""
        if self._owner is not None:
            return self._owner.client()
        if self._client is None:
            raise CommitError("RedisCommitter used before open(): the runner must open it")
        return self._client

    def lost(self, exc: BaseException) -> None:
        """After a Redis error: on a cluster, look for the slot's master again."""
        if self._owner is not None:
            self._owner.failed(exc)

    @contextmanager
    def reader(self, key: str) -> Iterator[redis.Redis]:
        """The open connection's server, else a client of the server holding ``key``
        (on a Redis Cluster, its slot's master), closed after."""
        if self._client is not None or self._owner is not None:
            yield self.server()
            return
        client = self.connect()
        owner = None
        try:
            if is_cluster(client):
                owner = SlotOwner(self.url, slot_of(key), self.socket_timeout)
                yield owner.client()
            else:
                yield client
        finally:
            client.close()
            if owner is not None:
                owner.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._owner is not None:
            self._owner.close()
            self._owner = None
