"""Leadership in ZooKeeper through kazoo: the election (an ephemeral ``leader`` node,
waited for with a watch) and the fence (the version of ``currtx``, bumped by rewriting
it). What was won is kept by ``ZooKeeperStateStore``, not here."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from coordinators import _zk
from transactional.errors import LostLeadershipError

__all__ = ["ERRORS", "elect", "session_of", "stats", "take_fence"]

#: What ``stats`` raises, for callers to catch.
ERRORS = (KazooException, KazooTimeoutError)

#: Re-check the leader node this often while waiting, in case a watch is lost with a
#: session.
WAIT_SLICE_SECONDS = 1.0


def session_of(client: Any) -> int | None:
    """The id of the client's session (None: none yet)."""
    client_id = client.client_id
    return None if client_id is None else int(client_id[0])


def elect(
    client: Any, hosts: str, leader: str, runner_id: str, deadline: float | None, topology: str
) -> int | None:
    """Wait until this client's session owns the ephemeral node ``leader`` (created
    holding ``runner_id``), until ``deadline`` (a ``time.monotonic()`` value; None:
    forever); the session's id. A node the session already owns (an earlier call) is
    taken as it is. Raises ``LostLeadershipError`` naming the holder at the deadline."""
    _zk.wait_connected(client, hosts, deadline)
    changed = threading.Event()

    def on_change(_event: object) -> None:
        changed.set()

    while True:
        try:
            client.create(leader, runner_id.encode(), ephemeral=True)
            break
        except NodeExistsError:
            pass
        except (ConnectionLoss, SessionExpiredError):
            _ride_out(client, hosts, deadline)  # a create that did apply is found below
            continue
        changed.clear()
        try:
            holder, stat = client.get(leader, watch=on_change)
        except NoNodeError:
            continue
        except (ConnectionLoss, SessionExpiredError):
            _ride_out(client, hosts, deadline)
            continue
        if stat.ephemeralOwner == session_of(client):
            break  # ours already, from an earlier call on this session
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise LostLeadershipError(
                f"another runner holds topology {topology!r} (node {leader} holds runner "
                f"{holder.decode(errors='replace')}); stop it or wait for it to finish, or "
                "use another --topology-id"
            )
        changed.wait(min(WAIT_SLICE_SECONDS, remaining or WAIT_SLICE_SECONDS))
    return session_of(client)


def _ride_out(client: Any, hosts: str, deadline: float | None) -> None:
    """A standby waits through a connection blip (or a new session) rather than fail:
    leadership may come up meanwhile."""
    time.sleep(0.05)
    _zk.wait_connected(client, hosts, deadline)


def take_fence(client: Any, currtx: str, initial: bytes) -> tuple[int, bytes]:
    """Rewrite ``currtx`` as it is (made holding ``initial`` if missing) to bump its
    version: any write prepared against the version an earlier leader saw is refused
    from then on. The new version, and the value it holds."""
    while True:
        try:
            data, stat = client.get(currtx)
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):
                client.create(currtx, initial)
            continue
        try:
            stat = client.set(currtx, data, version=stat.version)
        except BadVersionError:
            continue
        return stat.version, data


def stats(client: Any, paths: list[str], timeout: float) -> list[Any]:
    """The stat of each of ``paths`` (None: no such node), the reads in flight at
    once: one round trip. Raises one of ``ERRORS``."""
    pending = [client.exists_async(path) for path in paths]
    return [p.get(timeout=timeout) for p in pending]
