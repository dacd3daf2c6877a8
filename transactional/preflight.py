"""Checks made before anything starts (``StateStore.preflight``, ``Spout.preflight``,
``Committer.preflight``): a local directory that can never be written, a Redis server
that does not answer, an address where a server of another protocol answers (a Redis
port given for ZooKeeper's), is one line at once, not an error after Spark's start or
a client's retries."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Any

from transactional.errors import ConfigurationError
from transactional.secrets import redact_url

__all__ = ["SECONDS", "check_redis", "check_writable_dir", "other_protocol", "other_servers"]

#: How long a check waits for a server to answer.
SECONDS = 3.0

#: How long ``other_protocol`` waits for each of its two answers.
PROBE_S = 1.0


def check_writable_dir(path: str | Path, what: str) -> None:
    """Refuse ``path`` (named ``what`` in the message) when it cannot be, or become, a
    directory this user writes: a file is in the way, or the nearest existing parent
    is not writable. A URI (``s3://...``) is the sink's own to check."""
    if "://" in str(path):
        return
    target = existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigurationError(
            f"{what} {path} cannot be a directory: {existing} is a file; pass the path of "
            "a directory (it is created if missing)"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        verb = "written" if existing == target else "created"
        raise ConfigurationError(
            f"{what} {path} cannot be {verb}: {existing} is not writable; pass a directory "
            "this user may write"
        )


def check_redis(client: Any, url: str) -> None:
    """One PING on ``client`` (made with a timeout of about ``SECONDS``; closed here):
    a ``ConfigurationError`` naming ``url`` (its password hidden) when it gets no answer,
    and what answers there instead, if another protocol does."""
    import redis

    try:
        client.ping()
    except (redis.RedisError, ValueError) as exc:
        where = redact_url(url)
        other = _other_than_redis(client, exc)
        if other is not None:
            raise ConfigurationError(
                f"no Redis server at {where} ({other}; {exc}): fix the URL (host, port, "
                "database, password)"
            ) from None
        raise ConfigurationError(
            f"cannot reach Redis at {where} ({exc}): start redis-server there or "
            "fix the URL (host, port, database, password)"
        ) from None
    finally:
        client.close()


def _other_than_redis(client: Any, error: Exception) -> str | None:
    """What answers at ``client``'s server instead of Redis, after ``error``: asked only
    when the server closed the connection or replied in another protocol (a timeout
    proves nothing, and Redis's own replies, a refused password, are Redis's)."""
    import redis
    from redis.exceptions import InvalidResponse

    closed = isinstance(error, redis.ConnectionError) and not isinstance(
        error, redis.AuthenticationError | redis.TimeoutError
    )
    if not (closed or isinstance(error, InvalidResponse)):
        return None
    options = client.connection_pool.connection_kwargs
    if "host" not in options:  # a Unix socket
        return None
    try:
        return other_protocol(str(options["host"]), int(options.get("port", 6379)), "Redis")
    except OSError:
        return None


def other_protocol(host: str, port: int, expected: str, timeout: float = PROBE_S) -> str | None:
    """``"host:port speaks Redis, not ZooKeeper"`` when a server of another protocol
    than ``expected`` ("ZooKeeper", "Kafka" or "Redis") answers at ``host:port``. None
    when ``expected`` answers, or when nothing tells: a connection closed or left
    silent proves nothing (a ZooKeeper server not yet serving closes it too), and is
    left to the client's own retries. ``OSError`` when no TCP connection is made within
    ``timeout`` (refused: nothing listens there yet).

    Two requests that harm none of the three: ZooKeeper's ``srvr`` command, a line of
    text that ZooKeeper answers in text and Redis with an error (a binary request, as
    ZooKeeper's and Kafka's handshakes are, gets no answer at all from Redis); and
    Kafka's ``ApiVersions``, which only Kafka answers. The expected server's own
    request goes first, so a right address never sees the other."""
    probes = (_api_versions, _srvr) if expected == "Kafka" else (_srvr, _api_versions)
    for n, probe in enumerate(probes):
        try:
            said = probe(host, port, timeout)
        except OSError:
            if n == 0:
                raise
            said = None
        if said == expected:
            return None
        if said is not None:
            return f"{host}:{port} speaks {said}, not {expected}"
    return None


def other_servers(
    servers: list[tuple[str, int]], expected: str, timeout: float = PROBE_S
) -> tuple[list[str], list[str]] | None:
    """``other_protocol`` of each of ``servers`` in turn: None as soon as one may be the
    ``expected`` server (it answers as one, or says nothing); else what answers at each
    that takes a connection, and why each other one does not (``host:port: why``)."""
    others, unreachable = [], []
    for host, port in servers:
        try:
            other = other_protocol(host, port, expected, timeout)
        except OSError as exc:
            unreachable.append(f"{host}:{port}: {exc.strerror or exc}")
            continue
        if other is None:
            return None
        others.append(other)
    return others, unreachable


def _exchange(host: str, port: int, request: bytes, timeout: float) -> bytes:
    """Send ``request`` and read the answer's first bytes (none if the server closes
    the connection or stays silent for ``PROBE_S``)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(PROBE_S)
        answer = b""
        try:
            sock.sendall(request)
            while len(answer) < 8:
                chunk = sock.recv(256)
                if not chunk:
                    break
                answer += chunk
        except OSError:  # silent, or reset
            pass
        return answer


def _srvr(host: str, port: int, timeout: float) -> str | None:
    answer = _exchange(host, port, b"srvr\r\n", timeout)
    if not answer:
        return None
    lowered = answer.lower()
    if b"zookeeper" in lowered or b"whitelist" in lowered or b"allowlist" in lowered:
        return "ZooKeeper"  # its version; or not serving yet; or srvr not allowed
    if answer[:1] in (b"-", b"+"):
        return "Redis"  # an error reply: no such command
    if answer.startswith(b"HTTP/"):
        return "HTTP"
    return f"another protocol (it answered {answer[:32]!r})"


#: The correlation id of ``_api_versions``'s request, which Kafka's answer repeats.
_CORRELATION = 0x7472_6E73


def _api_versions(host: str, port: int, timeout: float) -> str | None:
    client = b"transactional-preflight"
    body = struct.pack(">hhih", 18, 0, _CORRELATION, len(client)) + client  # ApiVersions v0
    answer = _exchange(host, port, struct.pack(">i", len(body)) + body, timeout)
    if len(answer) >= 8 and struct.unpack(">i", answer[4:8])[0] == _CORRELATION:
        return "Kafka"
    return None
