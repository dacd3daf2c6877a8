"""A Redis database's history as the server tells it: every command it runs, from
``MONITOR``, and who ran it: a client, or a script (``lua``). Read with redis-py's
``monitor`` in a thread of the test, apart from the code under test.

The ready-made Redis committer writes its sink in one script a commit: the txid
marker, the counters and the dead letters change together, atomically, so that no
crash can leave one without the others. Its only writes from the client are the
staging lists a large commit fills before its script (``...:stage:<id>``). A write of
any other key by a client is a write outside the commit: ``outside`` names each. And
each script carries its leader's fence token, which a script refuses, writing nothing,
when a higher one has written: ``deposed`` names each script that wrote under a token
below one that wrote before it.
"""

from __future__ import annotations

import re
import threading
import uuid
from pathlib import Path
from types import TracebackType
from urllib.parse import urlparse

#: The commands that change a key (those the committer or a careless change would use).
WRITES = frozenset((
    "SET", "SETNX", "SETEX", "GETSET", "INCR", "INCRBY", "DECR", "DECRBY", "APPEND", "DEL",
    "UNLINK", "EXPIRE", "PERSIST", "RENAME", "HSET", "HSETNX", "HMSET", "HDEL", "HINCRBY",
    "HINCRBYFLOAT", "RPUSH", "LPUSH", "LPOP", "RPOP", "LTRIM", "LSET", "LREM", "SADD", "SREM",
    "ZADD", "ZREM", "ZREMRANGEBYSCORE", "ZINCRBY",
))  # fmt: skip
#: ``1765024511.123456 [3 127.0.0.1:41236] "SET" "key" "2"`` (or ``[3 lua]``).
_LINE = re.compile(r'^\d+\.\d+ \[(\d+) ([^\]]+)\] "([A-Za-z]+)"(?: "((?:[^"\\]|\\.)*)")?')
_STAGING = re.compile(r":stage:[0-9a-f]{32}$")
#: The commands that run a commit script.
_SCRIPTS = ("EVALSHA", "EVAL")
#: The fence token in a commit script's argument, as MONITOR quotes it.
_FENCE = re.compile(r'\\"fence\\":\s?\\"(\d+)\\"')


class ScriptWrites:
    """``MONITOR`` of the Redis server at ``url`` while the block runs (a thread of its
    own reading the server's lines, each written to ``log`` as it comes); ``outside()``
    then lists the writes to the URL's database made by a client rather than a script
    (staging lists aside). The block ends once the server has shown an ``ECHO`` sent as
    it ends: every command before it has been read."""

    def __init__(self, url: str, log: Path) -> None:
        import redis

        self.db = int((urlparse(url).path or "/0").lstrip("/") or 0)
        self.log = log
        # No reply timeout (redis-py's default is 5 s): a chain's runs leave the server
        # silent longer than that while their JVMs start.
        self._client = redis.Redis.from_url(url, socket_timeout=None)
        self._end = f"monitor-end-{uuid.uuid4().hex}"
        self._thread = threading.Thread(target=self._read, name="redis-monitor", daemon=True)
        self._started = threading.Event()
        self._failed: BaseException | None = None

    def _read(self) -> None:
        try:
            with self._client.monitor() as monitor, self.log.open("w") as out:
                self._started.set()
                while True:
                    line = monitor.connection.read_response()
                    text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
                    out.write(text + "\n")
                    out.flush()
                    if self._end in text:
                        return
        except BaseException as exc:  # seen by the test at the block's end
            self._failed = exc
            self._started.set()

    def __enter__(self) -> ScriptWrites:
        self._thread.start()
        assert self._started.wait(30) and self._failed is None, self._failed
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._client.echo(self._end)
        self._thread.join(60)
        self._client.close()
        assert not self._thread.is_alive(), "MONITOR never showed the block's end"
        assert self._failed is None, self._failed

    def _lines(self) -> list[tuple[str, str, str | None, str]]:
        """(source, command, key, line) of each line about the URL's database."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            match = _LINE.match(line)
            if match is not None and int(match.group(1)) == self.db:
                out.append((match.group(2), match.group(3).upper(), match.group(4), line))
        return out

    def fences(self) -> list[int]:
        """The fence token of each commit script sent to the database, in the order the
        server ran them (a refused one too)."""
        return [
            int(fence.group(1))
            for source, command, _, line in self._lines()
            if source != "lua" and command in _SCRIPTS and (fence := _FENCE.search(line))
        ]

    def deposed(self) -> list[str]:
        """Each commit script that wrote with a fence token below the highest one an
        earlier script wrote with: a deposed leader's write that got through. (A script's
        commands follow the ``EVALSHA`` that ran it; a refused one writes nothing.)"""
        highest, found = 0, []
        token: int | None = None
        wrote = False
        for source, command, key, line in self._lines():
            if source != "lua":
                token, wrote = None, False
                if command in _SCRIPTS and (fence := _FENCE.search(line)):
                    token = int(fence.group(1))
                continue
            if token is None or wrote or command not in WRITES:
                continue
            wrote = True
            if token < highest:
                found.append(f"fence {token} wrote {command} {key} after fence {highest} had")
            highest = max(highest, token)
        return found

    def outside(self) -> list[str]:
        """Each write to the database by a client, not a script, except to a staging
        list: ``COMMAND key (from ADDRESS)``."""
        return [
            f"{command} {key} (from {source})"
            for source, command, key, _ in self._lines()
            if source != "lua" and command in WRITES and not (key and _STAGING.search(key))
        ]
