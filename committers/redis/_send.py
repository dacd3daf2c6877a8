"""Sending a commit to Redis: the script call, with ``WAIT`` for replicas pipelined on
its connection, and the staging of a large hash's increments ahead of it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from transactional.errors import CommitError

if TYPE_CHECKING:
    import redis

__all__ = ["STAGE_CHUNK", "run_script", "stage", "too_large", "waited"]

#: A counter hash with more fields than this in one commit has them staged in Redis, in
#: a list of JSON chunks of this many fields each, pipelined (``stage``), rather than
#: in the script's argument: no request grows with the batch.
STAGE_CHUNK = 10_000

#: Seconds a staging list outlives a commit that died before deleting it.
STAGE_TTL = 24 * 3600


def too_large(fields: list[str]) -> bool:
    """Whether a hash's ``[field, increment, ...]`` is staged rather than sent in the
    script's argument."""
    return len(fields) > 2 * STAGE_CHUNK


def stage(client: redis.Redis, key: str, fields: list[str]) -> None:
    """Put one counter's ``[field, increment, ...]`` in the staging list ``key``, one
    JSON array of ``STAGE_CHUNK`` fields per element, pipelined. (A list of a few large
    strings costs Redis and redis-py far less than a hash of one entry per field.)"""
    pipe = client.pipeline(transaction=False)
    step = 2 * STAGE_CHUNK
    for i in range(0, len(fields), step):
        pipe.rpush(key, json.dumps(fields[i : i + step]))
    pipe.expire(key, STAGE_TTL)
    pipe.execute()


def waited(client: redis.Redis, replicas: int, timeout_s: float, *command: Any) -> tuple[Any, int]:
    """``command``'s reply and how many of ``replicas`` acknowledged it within
    ``timeout_s``: the command and ``WAIT`` pipelined on one connection, since ``WAIT``
    counts the replicas holding what *its* connection wrote."""
    pipe = client.pipeline(transaction=False)
    pipe.execute_command(*command)
    pipe.execute_command("WAIT", replicas, max(1, int(timeout_s * 1000)))
    reply, acked = pipe.execute()
    return reply, int(acked)


def run_script(
    client: redis.Redis,
    script: Any,
    keys: list[str],
    payload: str,
    replicas: int,
    timeout_s: float,
) -> tuple[Any, int | None]:
    """The reply of ``script`` (a registered ``redis.commands.core.Script``) on
    ``keys`` and ``payload``, and how many replicas acknowledged it (None: none
    asked). Loads the script again where the server lost it (a new master, ``SCRIPT
    FLUSH``)."""
    import redis

    if not replicas:
        return script(keys=keys, args=[payload], client=client), None
    for _ in range(2):
        try:
            return waited(
                client, replicas, timeout_s, "EVALSHA", script.sha, len(keys), *keys, payload
            )
        except redis.exceptions.NoScriptError:
            client.script_load(script.script)
    raise CommitError("the Redis server dropped the commit script as soon as it was loaded")
