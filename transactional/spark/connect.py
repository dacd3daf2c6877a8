"""Spark Connect sessions: a thin client of a remote Spark server (``sc://host:port``),
as Spark 4's serverless and shared platforms offer it. The runner's engine on such a
session is ``transactional.spark.engine.ConnectEngine``; this module makes the session and
answers what a classic session answers through its ``SparkContext``.

What a Connect client cannot do, the server must have been given when it started:
jars (Delta's, Kafka's, the ``s3a`` connector), SQL extensions and catalogs, Hadoop
settings, and this project installed for its Python workers (the spouts' readers and
the bolts' functions run there). ``connect_session`` sets the settings a session may
set (SQL settings) and leaves the others to the server; each component checks at open
that the server has what it needs and says what to start it with."""

from __future__ import annotations

import atexit
import functools
import logging
import socket
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from transactional.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "CLIENT_PACKAGES",
    "client_only",
    "connect_session",
    "default_parallelism",
    "is_connect",
    "reopen_if_lost",
    "server_has",
]

log = logging.getLogger("transactional.spark.connect")

#: What PySpark's Connect client imports beyond PySpark (its ``connect`` extra).
CLIENT_PACKAGES = ("grpc", "grpc_status", "google.rpc", "zstandard", "pandas")

#: How long the server may take to answer the first connection before the run is
#: refused (the client itself would retry for minutes).
REACH_TIMEOUT_S = 10.0


def connect_session(
    remote: str, app_name: str = "transactional", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A Spark Connect session on ``remote`` (``sc://host:port``, with any parameters
    Spark accepts after it, ``/;token=...``). Of ``conf`` (``create_spark_session``
    adds its defaults), the settings a session may change are set on it; the others
    (jars, extensions, the master, memory) are the server's own.

    Refused at once (``ConfigurationError``), before any retry: a URL that is not
    ``sc://``, a client without Connect's packages, a server that does not answer."""
    host, port = _address(remote)
    _check_client()
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigurationError(
            f"Spark Connect server {remote} does not answer ({e.strerror or e}): start "
            "it, or give the address it listens on (--remote sc://host:port)"
        ) from None
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
    settings = dict(conf or {})
    session_id: str = spark.session_id  # type: ignore[attr-defined]  # Connect's
    _SETTINGS[session_id] = {
        key: value for key, value in settings.items() if spark.conf.isModifiable(key)
    }
    _apply(spark)
    _OPEN.add(spark)
    return spark


#: The settings each session set on its server session (by client session id): set
#: again on the new server session after a server restart (``reopen_if_lost``).
_SETTINGS: dict[str, dict[str, str]] = {}
_REOPEN = threading.Lock()


def _apply(spark: Any) -> None:
    for key, value in _SETTINGS.get(spark.session_id, {}).items():
        spark.conf.set(key, value)


def reopen_if_lost(spark: Any) -> bool:
    """If the server behind ``spark`` was restarted (PySpark then closes the client for
    good: its server session is gone, and with it every cached relation and setting),
    open a session on the new server with the same client, settings set again, and
    say so; True if it did. Frames built before hold relations the new server lacks:
    the attempts using them fail and are replayed, as after any lost work. Reaches
    into PySpark's client (``_closed``, ``_server_session_id``): PySpark has no public
    call that reconnects a session in place, and the topology's components hold this
    session."""
    client = spark.client
    if not client.is_closed:
        return False
    with _REOPEN:
        if not client.is_closed:  # another thread reopened it meanwhile
            return False
        client._closed = False
        client._server_session_id = None
        try:
            _apply(spark)
        except BaseException:  # closed again: the next call tries again, settings and all
            client._closed = True
            raise
    log.warning("spark connect server session lost (server restarted?): reopened")
    return True


def clone_session(spark: Any, settings: Mapping[str, str]) -> Any:
    """A clone of the Connect session ``spark`` (a server session of its own, with
    ``spark``'s settings, and a client of its own), ``settings`` set on it. Both are
    set again if ``reopen_if_lost`` reopens it, as ``connect_session``'s are. Stop it
    with ``stop_session`` before the interpreter exits."""
    clone = spark.cloneSession()
    # PySpark's cloneSession skips the session's constructor, and with it the attribute
    # that its stop() reads.
    clone.release_session_on_close = True
    _SETTINGS[clone.session_id] = {**_SETTINGS.get(spark.session_id, {}), **settings}
    _apply(clone)
    _OPEN.add(clone)
    return clone


def stop_session(spark: Any) -> None:
    """Release ``spark``'s server session (one try; none if the server was lost) and
    close its client now. A client left open closes its gRPC channel when it is collected, and
    during the interpreter's final collection that can wait forever (seen after a
    server restart: a reopened session's channel); every session ``connect_session``
    or ``clone_session`` opened and nobody stopped is stopped at the process's exit."""
    _OPEN.discard(spark)
    _SETTINGS.pop(spark.session_id, None)
    # One try at releasing it: PySpark retries a call for ten minutes or more against a
    # server that is gone, and a stop must not wait for one.
    spark.client.set_retry_policies([])
    spark.stop()


#: The sessions this process opened and has not stopped.
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _stop_open() -> None:
    for spark in list(_OPEN):
        try:
            stop_session(spark)
        except Exception as exc:  # leaving anyway: a session not stopped is the server's
            log.debug("spark connect session not stopped at exit: %s", exc)


def _address(remote: str) -> tuple[str, int]:
    parts = urlsplit(remote)
    if parts.scheme != "sc" or not parts.hostname:
        raise ConfigurationError(
            f"{remote!r} is not a Spark Connect address: give sc://host:port "
            "(port 15002 if left out)"
        )
    try:
        port = parts.port or 15002
    except ValueError:
        raise ConfigurationError(f"{remote!r}: its port is not a number") from None
    return parts.hostname, port


def _check_client() -> None:
    import importlib.util

    missing = [p for p in CLIENT_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise ConfigurationError(
            f"the Spark Connect client needs {', '.join(missing)}: install the project "
            "with its connect extra (pip install 'transactional-spark[connect]'), or "
            "PySpark's own (pip install 'pyspark[connect]')"
        )


@functools.cache
def client_only() -> bool:
    """Whether PySpark is installed as its Spark Connect client alone (``pyspark-client``,
    the ``connect`` extra): no JVM in this process, so no session but a Connect one,
    and no jar to resolve (they are the server's)."""
    from pyspark.util import is_remote_only

    return bool(is_remote_only())


def is_connect(spark: object) -> bool:
    """Whether ``spark`` is a Spark Connect session (a client of a remote server)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: Any) -> int:
    """How many tasks the session runs at once: the ``SparkContext``'s on a classic
    session; on Connect, the partitions of a range the server splits by its default
    (one small job, asked once per session)."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    return _server_parallelism(spark)


@functools.lru_cache(maxsize=16)
def _server_parallelism(spark: Any) -> int:
    from pyspark.sql import functions as F

    parts = spark.range(1 << 16).select(F.spark_partition_id().alias("p"))
    row = parts.agg(F.max("p").alias("p")).first()
    return int(row["p"]) + 1


def server_has(spark: Any, setting: str, part: str) -> bool:
    """Whether the session's ``setting`` (a comma-separated list, such as
    ``spark.sql.extensions``) holds ``part``."""
    value = spark.conf.get(setting, "") or ""
    return part in [v.strip() for v in value.split(",")]
