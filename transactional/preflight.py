"""Checks made before anything starts (``StateStore.preflight``, ``Spout.preflight``,
``Committer.preflight``): a local directory that can never be written, a Redis server
that does not answer, is one line at once, not an error after Spark's start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transactional.errors import ConfigurationError
from transactional.secrets import redact_url

__all__ = ["SECONDS", "check_redis", "check_writable_dir"]

#: How long a check waits for a server to answer.
SECONDS = 3.0


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
    a ``ConfigurationError`` naming ``url`` (its password hidden) when it gets no answer."""
    import redis

    try:
        client.ping()
    except (redis.RedisError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot reach Redis at {redact_url(url)} ({exc}): start redis-server there or "
            "fix the URL (host, port, database, password)"
        ) from None
    finally:
        client.close()
