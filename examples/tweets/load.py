"""Put JSON Lines files into Redis as replayable queues, the layout the Redis spouts read.

Per partition file ``p`` (a single file is partition 0; a directory's files in sorted
name order, as the file spouts number them): messages ``<prefix>:<p>:<i>`` holding the
raw line bytes (without the newline), and the counter ``<prefix>:<p>:next_write``, the
number of messages written so far.

Loading into queues that already hold messages is refused (``AlreadyLoaded``): a second
load would queue every line again, silently doubling the input. ``append=True``
(``load --append``) appends anyway, under new indexes, as a producer that sent the
data again would. Messages and the counter move together
in one MULTI/EXEC per chunk, with the counter WATCHed, so a reader never sees a counter
ahead of its messages and two concurrent loaders never take the same indexes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import redis

from examples.tweets.lines import counter_key, message_key
from transactional.errors import ConfigurationError
from transactional.sources.files import FilesPartitionedSpout

__all__ = ["AlreadyLoaded", "load", "queued"]

log = logging.getLogger(__name__)

#: Lines per MULTI/EXEC: a few MB per round trip, short enough not to block Redis.
CHUNK_LINES = 5000


def read_lines(path: Path) -> Iterator[bytes]:
    """Lines as the file spouts frame them; the ``\\r`` of a CRLF is kept here and
    stripped by the reader, as for files."""
    with open(path, "rb") as f:
        for line in f:  # binary iteration splits on b"\n" only
            yield line[:-1] if line.endswith(b"\n") else line


def _chunks(lines: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _append(client: redis.Redis, prefix: str, partition: int, chunk: list[bytes]) -> None:
    counter = counter_key(prefix, partition)
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(counter)
                first = int(pipe.get(counter) or 0)  # type: ignore[arg-type]
                pipe.multi()
                pipe.mset(
                    {message_key(prefix, partition, first + i): v for i, v in enumerate(chunk)}
                )
                pipe.set(counter, first + len(chunk))
                pipe.execute()
                return
            except redis.WatchError:
                continue


class AlreadyLoaded(ConfigurationError):
    """The queues hold messages already; loading again would count them twice."""


def queued(client: redis.Redis, prefix: str) -> dict[int, int]:
    """Messages written so far per queue of ``prefix`` (queues are numbered from 0)."""
    found: dict[int, int] = {}
    while (value := client.get(counter_key(prefix, len(found)))) is not None:
        found[len(found)] = int(value)  # type: ignore[arg-type]
    return found


def load(
    input_path: str | os.PathLike[str],
    redis_url: str,
    prefix: str = "tweets",
    append: bool = False,
) -> dict[int, int]:
    """Append every line of ``input_path`` to its partition's queue; returns lines per
    partition. Refuses (``AlreadyLoaded``) if the queues hold messages, unless ``append``."""
    files = FilesPartitionedSpout(input_path)
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=5)
    loaded: dict[int, int] = {}
    try:
        held = {p: n for p, n in queued(client, prefix).items() if n}
        if held and not append:
            raise AlreadyLoaded(
                f"the Redis queues {prefix}:* already hold {sum(held.values())} messages "
                f"({', '.join(f'{prefix}:{p}: {n}' for p, n in held.items())}); loading "
                "again would queue every line a second time. Pass --append to add them "
                "anyway, or load into another --prefix"
            )
        for partition, name in enumerate(files.names()):
            loaded[partition] = 0
            # An empty file still gets its counter: partitions are found by probing
            # counters 0, 1, ..., so a missing one would hide every later partition.
            client.set(counter_key(prefix, partition), 0, nx=True)
            for chunk in _chunks(read_lines(Path(files.resolve(name))), CHUNK_LINES):
                _append(client, prefix, partition, chunk)
                loaded[partition] += len(chunk)
            log.info("loaded partition=%d file=%s lines=%d", partition, name, loaded[partition])
    finally:
        client.close()
    return loaded
