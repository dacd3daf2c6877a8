"""The Redis committer: counters and dead letters, each commit one atomic Lua script,
on a single server or a Redis Cluster; and ``RedisSnapshot``, which reads what it holds.

The modules behind it are private: ``_committer`` (the committer), ``_batch`` and
``_fields`` (a commit's fields and increments, built before the script runs), ``_send``
(calling the script), ``_commit.lua`` (the script), ``_reply`` (what it replied),
``_read`` (the reading side), ``_names`` (the keys it writes), ``_connection`` (the
server holding them, shared by writes and reads) and ``_cluster`` (Redis Cluster
connections)."""

from committers.redis._committer import RedisCommitter
from committers.redis._read import RedisSnapshot

__all__ = ["RedisCommitter", "RedisSnapshot"]
