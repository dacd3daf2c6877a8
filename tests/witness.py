"""Observations that a fault took effect, made apart from the code under test: by the
operating system (a process's exit status), by the servers themselves (ZooKeeper's
ephemeral nodes, a Redis node's ``INFO``), or by Spark's own REST API. A fault the tests
or the chaos campaign inject is counted only once its witness has seen it; a planned
fault that no witness sees within its deadline is a ``NotFired`` failure naming it.

Each wait polls with a deadline, never a fixed sleep: it ends as soon as the event is
seen.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from transactional.testing.servers import session_processes

T = TypeVar("T")

#: A ZooKeeper node's ``ephemeralOwner`` when it has none.
NO_OWNER = 0


class NotFired(AssertionError):
    """A planned fault that did not take effect (its witness did not see it in time)."""


class Moot(Exception):
    """A planned fault that met no run: the run it was aimed at finished its work and
    exited 0 before the fault could reach it (neither fired nor failed)."""


def waited(what: str, probe: Callable[[], T | None], timeout: float, every: float = 0.1) -> T:
    """``probe()``'s first result that is not None, polled until ``timeout``; else
    ``NotFired`` saying ``what`` was not seen."""
    deadline = time.monotonic() + timeout
    while True:
        seen = probe()
        if seen is not None:
            return seen
        if time.monotonic() >= deadline:
            raise NotFired(f"{what}: not seen within {timeout:.0f}s")
        time.sleep(every)


def process_state(pid: int) -> str:
    """The state letter the kernel gives ``pid`` (``/proc/<pid>/stat``: ``T`` stopped by
    a signal, ``Z`` a zombie)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def clock_past(instant: datetime) -> datetime:
    """Wait until the wall clock reads a later millisecond than ``instant`` (Kafka's
    timestamps and Delta's commit times keep milliseconds); the time it reads then.
    What is written after it is stamped later than ``instant``, and what was written
    before ``instant`` earlier than the time returned."""
    while (now := datetime.now(UTC)) < instant + timedelta(milliseconds=1):
        time.sleep(0.001)
    return now


# -- processes ---------------------------------------------------------------------


def killed_by_sigkill(returncode: int, what: str) -> None:
    """A ``subprocess`` return code that says the process died of SIGKILL."""
    if returncode != -signal.SIGKILL:
        raise NotFired(f"{what}: the process exited with {returncode}, not by SIGKILL")


# -- ZooKeeper ---------------------------------------------------------------------


def zk_sessions(hosts: str, root: str = "/transactional") -> set[int]:
    """The sessions that own an ephemeral node under ``root`` (a runner's leader node,
    a standby's election entry), read with a client of our own."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=15)
    try:
        return {s.ephemeralOwner for s in zk_nodes(client, root) if s.ephemeralOwner != NO_OWNER}
    finally:
        client.stop()
        client.close()


def zk_nodes(client: Any, root: str) -> Iterator[Any]:
    """The stat of ``root`` and of every node under it, through a started kazoo
    ``client`` (none: no ``root``); a node deleted meanwhile is left out."""
    from kazoo.exceptions import NoNodeError

    stack = [root]
    while stack:
        path = stack.pop()
        try:
            children = client.get_children(path)
            _, stat = client.get(path)
        except NoNodeError:
            continue
        yield stat
        stack.extend(f"{path.rstrip('/')}/{child}" for child in children)


def zk_owner(hosts: str, path: str) -> int | None:
    """The session that owns the ephemeral node ``path`` (None: there is none), read
    with a client of our own."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=15)
    try:
        stat = client.exists(path)
        return None if stat is None else int(stat.ephemeralOwner)
    finally:
        client.stop()
        client.close()


def wait_sessions_expired(hosts: str, sessions: Iterable[int], timeout: float) -> set[int]:
    """Wait until ZooKeeper has expired every one of ``sessions`` (none owns a node);
    returns the sessions that own nodes now."""
    gone = set(sessions)
    if not gone:
        raise NotFired("zk session expiry: the run owned no ephemeral node to expire")

    def expired() -> set[int] | None:
        now = zk_sessions(hosts)
        return now if not now & gone else None

    return waited(f"zk session expiry of {sorted(hex(s) for s in gone)}", expired, timeout, 0.25)


# -- Redis -------------------------------------------------------------------------


def redis_info(port: int, section: str) -> dict[str, str]:
    """``INFO section`` of the node on ``port`` ({} if it does not answer)."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)
    try:
        return {k: str(v) for k, v in client.info(section).items()}
    except redis.RedisError:
        return {}
    finally:
        client.close()


def replicas_of(ports: Iterable[int], master_port: int) -> list[int]:
    """The nodes among ``ports`` that replicate the master on ``master_port``."""
    return [
        port
        for port in ports
        if (info := redis_info(port, "replication")).get("role") == "slave"
        and info.get("master_port") == str(master_port)
    ]


def wait_promoted(replicas: list[int], timeout: float) -> int:
    """Wait until one of ``replicas`` reports itself a master (``INFO replication``):
    the cluster's failover happened. Returns its port."""
    if not replicas:
        raise NotFired("redis failover: the master had no replica to promote")

    def promoted() -> int | None:
        return next(
            (p for p in replicas if redis_info(p, "replication").get("role") == "master"), None
        )

    return waited(f"redis failover: a replica of {replicas} promoted", promoted, timeout, 0.2)


def run_id(port: int) -> str | None:
    """The node's ``run_id``: new at every start of the server process."""
    return redis_info(port, "server").get("run_id")


# -- Spark -------------------------------------------------------------------------


def spark_settled(spark: Any) -> Any:
    """``spark`` once its status store has heard every event posted so far. Spark's
    listener bus delivers job and stage events on a thread of its own, so a job that has
    returned may not yet be in ``statusTracker`` or the status store; this waits until the
    bus is empty (Spark's own test suites do the same)."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    return spark


#: How long a driver's REST API may take to answer: its first request starts the API's
#: servlet, which took over 5 s on a Connect server while CI's other lane ran.
REST_TIMEOUT_S = 60


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=REST_TIMEOUT_S) as reply:
        return json.load(reply)


def executors(ui_port: int) -> list[dict[str, Any]] | None:
    """Every executor the driver on ``ui_port`` has had, removed ones too (Spark's REST
    API, ``/api/v1/applications/<app>/allexecutors``); None if it does not answer."""
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    try:
        apps = _get(base)
        found: list[dict[str, Any]] = _get(f"{base}/{apps[0]['id']}/allexecutors")
        return found
    except (OSError, ValueError, IndexError, KeyError):
        return None


def active_executors(ui_port: int) -> set[str]:
    return {e["id"] for e in executors(ui_port) or [] if e["id"] != "driver" and e["isActive"]}


def app_id(ui_port: int) -> str | None:
    """The Spark application id of the driver on ``ui_port`` (None: it does not answer)."""
    try:
        apps = _get(f"http://127.0.0.1:{ui_port}/api/v1/applications")
        return str(apps[0]["id"])
    except (OSError, ValueError, IndexError, KeyError):
        return None


def server_persisted(ui_port: int) -> set[int]:
    """The ids of the RDDs the driver on ``ui_port`` holds persisted (blocks cached),
    from its REST API (``/api/v1/applications/<app>/storage/rdd``): a Spark Connect
    server's, which its clients cannot ask through py4j."""
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    app = _get(base)[0]["id"]
    return {int(r["id"]) for r in _get(f"{base}/{app}/storage/rdd")}


def executors_in_session(sid: int, app: str) -> set[str]:
    """The ids of ``app``'s executors whose JVMs run in session ``sid`` (a Spark worker
    started in a session of its own launches its executors there), read from the
    processes' command lines in ``/proc``, not from Spark."""
    found = set()
    for entry in session_processes(sid):
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "--executor-id" not in words or "--app-id" not in words:
            continue
        if words[words.index("--app-id") + 1] == app:
            found.add(words[words.index("--executor-id") + 1])
    return found


def wait_executor_lost(ui_port: int, among: set[str], timeout: float) -> dict[str, Any]:
    """Wait until the driver counts one of the executors ``among`` as removed; returns
    its entry (``removeReason`` says why)."""
    if not among:
        raise NotFired("worker kill: the run had no executor to lose")

    last: list[Any] = [None]

    def lost() -> dict[str, Any] | None:
        listed = last[0] = executors(ui_port)
        return next(
            (e for e in listed or [] if e["id"] in among and not e["isActive"]),
            None,
        )

    try:
        return waited(f"worker kill: an executor of {sorted(among)} lost", lost, timeout, 0.25)
    except NotFired as e:
        said = "no answer" if last[0] is None else [(x["id"], x["isActive"]) for x in last[0]]
        raise NotFired(f"{e} (the driver's REST API last said: {said})") from None


def master_apps(ui_port: int) -> list[dict[str, Any]]:
    """The applications a standalone master on ``ui_port`` lists, running and finished
    (its ``/json/`` page): each with its ``id``, ``name`` and ``state``."""
    status = _get(f"http://127.0.0.1:{ui_port}/json/")
    return [*status.get("activeapps", []), *status.get("completedapps", [])]
