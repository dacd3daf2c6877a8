"""Talking to ZooKeeper through kazoo: connecting, listing, fenced multi-ops, and reading
a topology's state tree in overlapping round trips. No rule of the bookkeeping lives
here (see ``coordinators._fenced``); only what ZooKeeper and kazoo make of a request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from coordinators._fenced import decode, decode_group
from transactional.errors import (
    ConfigurationError,
    CoordinatorError,
    LostLeadershipError,
    StoreUnavailableError,
)
from transactional.preflight import other_servers
from transactional.secrets import mask_in_logs
from transactional.store import JsonValue, StoredHistory, StoredState

__all__ = [
    "Credentials",
    "commit",
    "connect",
    "delete_own",
    "guard",
    "list_children",
    "node",
    "probe",
    "read_history",
    "read_tree",
    "wait_connected",
]


def node(txid: int) -> str:
    """A txid's node name, zero-padded so that names sort as numbers."""
    return f"{txid:020d}"


class Credentials:
    """ZooKeeper digest credentials, ``user:password``. The password shows nowhere: not
    in ``repr``, not in any message (only the user name is ever named)."""

    def __init__(self, text: str, what: str) -> None:
        user, colon, password = text.partition(":")
        if not colon or not user or not password:
            raise ConfigurationError(
                f"{what} must be 'user:password' (a ZooKeeper digest user and its "
                "password); the value given has no user or no password"
            )
        self.user = user
        self._password = password
        # Kazoo logs its Auth request, password and all, at DEBUG.
        mask_in_logs(password, "kazoo.client")

    def __repr__(self) -> str:
        return f"Credentials(user={self.user!r}, password=***)"

    @property
    def digest(self) -> str:
        """The ACL id ZooKeeper checks them against: ``user:base64(sha1(user:password))``."""
        from kazoo.security import make_digest_acl_credential

        return str(make_digest_acl_credential(self.user, self._password))

    def client_options(self) -> dict[str, Any]:
        """Kazoo's: authenticate each session, and give every node created the ACL
        "this user may do anything, nobody else anything"."""
        from kazoo.security import make_digest_acl

        return {
            "auth_data": [("digest", f"{self.user}:{self._password}")],
            "default_acl": [make_digest_acl(self.user, self._password, all=True)],
        }


#: The longest pause between two attempts to reach ZooKeeper again (give or take kazoo's
#: jitter of 40%). kazoo's own policy doubles the pause up to an hour, so a runner cut
#: off for a few minutes went on waiting a minute or more once the servers were back.
RECONNECT_MAX_S = 2.0


def _reconnecting() -> KazooRetry:
    """The policy by which a client reaches ZooKeeper again after losing it: forever,
    from 0.1 s apart, doubling up to ``RECONNECT_MAX_S``."""
    return KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_jitter=0.4, max_delay=RECONNECT_MAX_S)


def connect(
    hosts: str,
    session_timeout: float,
    connect_timeout: float,
    listener: Any = None,
    credentials: Credentials | None = None,
) -> Any:
    """A started client, or ``StoreUnavailableError`` naming what to check."""
    options = {} if credentials is None else credentials.client_options()
    try:
        client = KazooClient(
            hosts=hosts, timeout=session_timeout, connection_retry=_reconnecting(), **options
        )
    except ValueError as exc:
        raise ConfigurationError(
            f"bad ZooKeeper connection string {hosts!r}: {exc}; "
            "expected host:port[,host:port...][/chroot]"
        ) from exc
    if listener is not None:
        client.add_listener(listener)
    began = time.monotonic()
    try:
        client.start(timeout=connect_timeout)
    except KazooTimeoutError as exc:
        client.close()
        # Kazoo gives up after the timeout, then waits for its attempt in progress.
        raise StoreUnavailableError(
            f"cannot connect to ZooKeeper at {hosts}: no session after "
            f"{time.monotonic() - began:.0f}s (connect timeout {connect_timeout:g}s); "
            "check that the servers are running and reachable from this machine, and "
            "the connection string (host:port[,host:port...][/chroot])"
        ) from exc
    return client


def probe(hosts: str, timeout: float = 3.0) -> None:
    """Fail at once when no server of ``hosts`` may be a ZooKeeper server, rather than
    after kazoo's connect timeout and a warning per retry (kazoo retries a server that
    answers in another protocol as it retries one that refuses the connection):
    ``ConfigurationError`` when another protocol answers where a connection is accepted
    (a Redis port given for ZooKeeper's; ``preflight.other_servers``),
    ``StoreUnavailableError`` when none is accepted; each naming every server and why. A
    server that accepts the connection and answers as ZooKeeper, or says nothing (one
    still starting may close it), is left to kazoo."""
    from kazoo.hosts import collect_hosts

    try:
        servers, _chroot = collect_hosts(hosts)
    except ValueError as exc:
        raise ConfigurationError(
            f"--zookeeper {hosts!r} is not host:port[,host:port...][/chroot]: {exc}"
        ) from None
    found = other_servers(servers, "ZooKeeper", timeout)
    if found is None:
        return
    others, problems = found
    if others:
        raise ConfigurationError(
            f"no ZooKeeper server at {hosts} ({'; '.join(others + problems)}): fix "
            "--zookeeper (host:port[,host:port...][/chroot] of the ZooKeeper servers)"
        )
    raise StoreUnavailableError(
        f"cannot reach ZooKeeper at {hosts} ({'; '.join(problems) or 'no servers given'}): "
        "start the ZooKeeper servers there or fix --zookeeper"
    )


def guard(
    client: Any, root: str, path: str, credentials: Credentials | None, where: str, protect: bool
) -> None:
    """Check that this client may use the topology at ``path`` (a child of ``root``),
    before anything else touches it: a ``ConfigurationError`` when its nodes carry a
    digest ACL these credentials (or none) do not match. With credentials, ``root`` is
    made if missing with an ACL that lets anyone list it and add a topology (only each
    topology's own nodes are protected); and with ``protect``, a topology whose nodes
    are open to everyone (made before credentials were configured) gets the ACL on every
    node, so from now on only these credentials can read or change it."""
    from kazoo.security import ACL, Id, Permissions

    try:
        if credentials is not None:
            listable = ACL(Permissions.READ | Permissions.CREATE, Id("world", "anyone"))
            client.ensure_path(root, acl=[listable])
        # ZooKeeper shows a node's ACL only to a client that may read the node.
        acls, _ = client.get_acls(path)
    except NoNodeError:
        return  # a new topology: each of its nodes is made with the ACL
    except NoAuthError:
        given = (
            "no credentials were given"
            if credentials is None
            else (f"the credentials given (user {credentials.user!r}) do not match it")
        )
        raise ConfigurationError(
            f"the nodes of {path} in {where} are protected by a ZooKeeper ACL, and "
            f"{given}: set TRANSACTIONAL_ZOOKEEPER_AUTH=user:password (the user the "
            "topology was made with, and its password) in the environment; in code, "
            "ZooKeeperStateStore(hosts, credentials='user:password')"
        ) from None
    except KazooException as exc:
        raise StoreUnavailableError(f"cannot read the ACL of {path} in {where}: {exc!r}") from exc
    digests = {acl.id.id for acl in acls if acl.id.scheme == "digest"}
    if credentials is not None and not digests and protect:
        _protect(client, path, credentials.client_options()["default_acl"], where)


def _protect(client: Any, path: str, acl: list[Any], where: str) -> None:
    """Give ``path`` and every node under it ``acl``, children first (so a node is
    never open below a protected one for longer than this walk)."""
    try:
        for child in client.get_children(path):
            _protect(client, f"{path}/{child}", acl, where)
        client.set_acls(path, acl)
    except NoNodeError:
        pass  # deleted meanwhile (only a deposed runner could): nothing to protect
    except KazooException as exc:
        raise StoreUnavailableError(f"cannot set the ACL of {path} in {where}: {exc!r}") from exc


def wait_connected(client: Any, hosts: str, deadline: float | None) -> None:
    """Wait for the connection (until ``deadline``, a ``time.monotonic()`` value):
    requests made while disconnected wait in kazoo's queue with no time limit."""
    while client.state != KazooState.CONNECTED:
        if deadline is not None and time.monotonic() >= deadline:
            raise StoreUnavailableError(
                f"not connected to ZooKeeper at {hosts} (state {client.state}); "
                "check that the servers are running and reachable"
            )
        time.sleep(0.05)


def delete_own(client: Any, path: str, session_id: int | None, timeout: float) -> None:
    """Delete the ephemeral node ``path`` if the session ``session_id`` owns it; never
    wait for a server that is gone (the node goes with its session anyway)."""
    try:
        if client.state != KazooState.CONNECTED:
            return
        stat = client.exists_async(path).get(timeout=timeout)
        if stat is not None and stat.ephemeralOwner == session_id:
            client.delete_async(path, version=stat.version).get(timeout=timeout)
    except (KazooException, KazooTimeoutError):
        pass


def list_children(client: Any, path: str, hosts: str) -> list[str]:
    """The children of ``path``, sorted; none when it does not exist."""
    try:
        return sorted(client.get_children(path))
    except NoNodeError:
        return []
    except KazooException as exc:
        raise StoreUnavailableError(f"cannot list {path} in ZooKeeper at {hosts}: {exc!r}") from exc


def commit(
    client: Any,
    tx: Any,
    what: str,
    timeout: float,
    taken_over: Callable[[], Exception],
    on_exists: str = "",
) -> list[Any]:
    """Commit a multi-op whose first operation checks the fence; raise
    ``taken_over()`` when that check fails. Kazoo reports a failed multi-op as results:
    the failing operation's error, rollbacks elsewhere."""
    if client.state != KazooState.CONNECTED:  # else kazoo would queue it, unbounded
        raise LostLeadershipError(
            f"the ZooKeeper connection is {client.state} while {what}; nothing was "
            "written: take leadership again once it is back"
        )
    try:
        results: list[Any] = tx.commit_async().get(timeout=timeout)
    except (ConnectionLoss, SessionExpiredError, KazooTimeoutError) as exc:
        raise LostLeadershipError(
            f"lost the ZooKeeper connection while {what}; the write may or may not have "
            "applied: the state is read again once this runner leads again"
        ) from exc
    except KazooException as exc:
        raise CoordinatorError(f"ZooKeeper refused {what}: {exc!r}") from exc
    for i, error in enumerate(results):
        if not isinstance(error, Exception) or isinstance(
            error, RolledBackError | RuntimeInconsistency
        ):
            continue
        if i == 0:
            raise taken_over() from error
        if on_exists and isinstance(error, NodeExistsError):
            raise CoordinatorError(on_exists) from error
        raise CoordinatorError(
            f"ZooKeeper refused {what} (operation {i}: {error!r}); "
            "restart the runner to reload the state"
        ) from error
    return results


def read_tree(client: Any, root: str) -> tuple[StoredState, dict[int, set[int]]]:
    """The state under ``root`` (``coordinator/currtx``, ``coordinator/meta/<txid>``,
    ``coordinator/digest/<txid>``, ``coordinator/group``, ``coordinator/rewind``,
    ``partition/<p>/<txid>``) and the partition index
    (partition -> txids). Every value is fetched concurrently, then waited for, so
    round trips overlap."""
    try:
        data, _ = client.get(f"{root}/coordinator/currtx")
        currtx = int(decode(data))
    except NoNodeError:
        currtx = 1
    meta_ids = sorted(int(n) for n in client.get_children(f"{root}/coordinator/meta"))
    part_ids = sorted(int(n) for n in client.get_children(f"{root}/partition"))
    listings = {p: client.get_children_async(f"{root}/partition/{p}") for p in part_ids}
    index = {p: {int(n) for n in listing.get()} for p, listing in listings.items()}
    # Metadata below currtx - 1 is kept for rewinds only: the runner sees neither its
    # txids nor its values, so only its names are read.
    seen = currtx - 1
    meta_gets = {
        t: client.get_async(f"{root}/coordinator/meta/{node(t)}") for t in meta_ids if t >= seen
    }
    part_gets = {
        (t, p): client.get_async(f"{root}/partition/{p}/{node(t)}")
        for p, txids in index.items()
        for t in txids
        if t >= seen
    }
    try:  # absent from a topology stored before digests existed
        digest_ids = client.get_children(f"{root}/coordinator/digest")
    except NoNodeError:
        digest_ids = []
    digest_gets = {
        t: client.get_async(f"{root}/coordinator/digest/{node(t)}")
        for t in sorted(int(n) for n in digest_ids)
    }
    metas = {t: decode(get.get()[0]) for t, get in meta_gets.items()}
    digests = {t: decode(get.get()[0]) for t, get in digest_gets.items()}
    partitions: dict[int, dict[int, JsonValue]] = {}
    for (t, p), get in sorted(part_gets.items()):
        partitions.setdefault(t, {})[p] = decode(get.get()[0])
    try:  # absent from a topology stored before commit groups
        group = decode_group(client.get(f"{root}/coordinator/group")[0])
    except NoNodeError:
        group = None
    try:  # absent from a topology stored before rewinds
        data = client.get(f"{root}/coordinator/rewind")[0]
    except NoNodeError:
        data = b""
    state = StoredState(
        currtx,
        metas,
        partitions,
        digests,
        group,
        kept=tuple(t for t in meta_ids if t < seen),
        rewinding=int(decode(data)) if data else None,
    )
    return state, index


def read_history(client: Any, root: str) -> StoredHistory:
    """The metadata and partition metadata kept under ``root`` for rewinds: of every
    txid below ``currtx - 1`` (``read_tree`` reads only their names). Reads only. The
    listings are fetched together, then every value, so round trips overlap. ZooKeeper
    answers a session's requests in order, and the partition listings are sent before
    the metadata gets: so a txid that a runner's advance deleted meanwhile misses its
    metadata or a partition value, and is left out whole."""
    currtx_get = client.get_async(f"{root}/coordinator/currtx")
    meta_list = client.get_children_async(f"{root}/coordinator/meta")
    part_list = client.get_children_async(f"{root}/partition")
    try:
        below = int(decode(currtx_get.get()[0])) - 1
    except NoNodeError:
        below = 0  # nothing committed yet
    meta_ids = sorted(t for t in (int(n) for n in _names(meta_list)) if t < below)
    listings = {
        int(p): client.get_children_async(f"{root}/partition/{p}") for p in _names(part_list)
    }
    meta_gets = {t: client.get_async(f"{root}/coordinator/meta/{node(t)}") for t in meta_ids}
    part_gets = {
        (t, p): client.get_async(f"{root}/partition/{p}/{node(t)}")
        for p, listing in sorted(listings.items())
        for t in sorted(int(n) for n in listing.get())
        if t in meta_gets
    }
    metas: dict[int, JsonValue] = {}
    gone: set[int] = set()
    for t, get in meta_gets.items():
        try:
            metas[t] = decode(get.get()[0])
        except NoNodeError:
            gone.add(t)
    partitions: dict[int, dict[int, JsonValue]] = {}
    for (t, p), get in sorted(part_gets.items()):
        try:
            partitions.setdefault(t, {})[p] = decode(get.get()[0])
        except NoNodeError:
            gone.add(t)
    return StoredHistory(
        metas={t: m for t, m in metas.items() if t not in gone},
        partitions={t: ps for t, ps in partitions.items() if t not in gone},
    )


def _names(listing: Any) -> list[str]:
    """An asynchronous listing's children; none when the node does not exist."""
    try:
        return list(listing.get())
    except NoNodeError:
        return []
