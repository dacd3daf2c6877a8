"""The ZooKeeper state store: several runners on several machines, one leader.

Layout under ``/transactional/<topology-id>/``: ``identity``, ``leader`` (ephemeral,
holds the leader's runner id), ``coordinator/currtx``, ``coordinator/meta/<txid>``,
``coordinator/digest/<txid>`` (what a txid's first emit held, for the determinism check)
and ``partition/<p>/<txid>``, txids zero-padded so that names sort. Values are JSON.

The fence is the version of ``currtx``: a new leader rewrites ``currtx`` to bump its
version, and every write of ours is a multi-op that checks the version we last saw.
So an old leader whose session expired (and that has not noticed yet) cannot write
anything once a new leader took over, whatever its clock or network says. The version
a leader took is also its fence token for the sinks (``fence_token``): versions only
grow, so every new leader's token is above all earlier ones.

After a lost session (kazoo opens a new one by itself) or a server restart, the same
store can lead again: ``acquire_leadership`` waits for the connection, finds the leader
node gone (it went with the session) or still its own (the session survived), and takes
the fence anew. No call blocks on a lost connection for longer than the session timeout:
a write whose reply does not come is reported as ``LostLeadershipError``, its outcome
unknown, and the caller re-reads the state once it leads again.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from transactional.errors import (
    ConfigurationError,
    CoordinatorError,
    FencedError,
    LostLeadershipError,
    StoreUnavailableError,
    UnknownTopologyError,
)
from transactional.store import JsonValue, StateStore, StoredState, TopologyIdentity

_ROOT = "/transactional"
# Re-check the leader node this often while waiting, in case a watch is lost with a session.
_WAIT_SLICE_SECONDS = 1.0


def _encode(value: JsonValue, what: str) -> bytes:
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CoordinatorError(
            f"{what} is not JSON-serialisable ({exc}); metadata must be plain JSON values"
        ) from exc
    return text.encode()


def _decode(data: bytes) -> JsonValue:
    return json.loads(data.decode())


def _node(txid: int) -> str:
    return f"{txid:020d}"


class ZooKeeperStateStore(StateStore):
    """State of one topology in ZooKeeper, written only by the elected runner."""

    def __init__(
        self, hosts: str, session_timeout: float = 10.0, connect_timeout: float = 15.0
    ) -> None:
        self.hosts = hosts
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        #: Stored in the ``leader`` node, so that an operator can tell runners apart.
        self.runner_id = uuid.uuid4().hex
        self._client: Any = None
        self._topology_id: str | None = None
        # Set by kazoo's connection thread, read by the runner's thread.
        self._flags = threading.Lock()
        self._session_lost = False
        self._fence: int | None = None  # version of currtx after our last write
        self._token: int | None = None  # version of currtx when we took the fence
        self._session_id: int | None = None  # the session that owns our leader node
        self._currtx = 1  # the value of currtx at version self._fence
        # txid nodes that exist, so that advance knows what to delete without listing.
        self._metas: set[int] | None = None
        self._partitions: dict[int, set[int]] = {}
        self._digests: set[int] = set()

    def _path(self, *parts: str) -> str:
        if self._topology_id is None:
            raise CoordinatorError("the state store is not open: call open(topology_id) first")
        return "/".join((_ROOT, self._topology_id, *parts))

    @property
    def _zk(self) -> Any:
        if self._client is None:
            raise CoordinatorError("the state store is not open: call open(topology_id) first")
        return self._client

    def open(self, topology_id: str, read_only: bool = False) -> None:
        if not topology_id or "/" in topology_id or topology_id in (".", ".."):
            raise ConfigurationError(
                f"topology id {topology_id!r} cannot name a ZooKeeper node: use a non-empty "
                "name without '/'"
            )
        if self._client is not None:
            raise CoordinatorError("the state store is already open")
        client = self._connect(self._on_state)
        self._client = client
        self._topology_id = topology_id
        if read_only:
            try:
                known = self._children(client, _ROOT)
            except BaseException:
                self.close()
                raise
            if topology_id not in known:
                self.close()
                raise UnknownTopologyError(topology_id, f"ZooKeeper at {self.hosts}", known)
            return
        try:
            client.ensure_path(self._path("coordinator", "meta"))
            client.ensure_path(self._path("coordinator", "digest"))
            client.ensure_path(self._path("partition"))
        except KazooException as exc:
            self.close()
            raise StoreUnavailableError(
                f"cannot create {_ROOT}/{topology_id} in ZooKeeper at {self.hosts}: {exc!r}; "
                "check that the chroot exists and that this client may create nodes"
            ) from exc

    def _connect(self, listener: Any = None) -> Any:
        try:
            client = KazooClient(hosts=self.hosts, timeout=self.session_timeout)
        except ValueError as exc:
            raise ConfigurationError(
                f"bad ZooKeeper connection string {self.hosts!r}: {exc}; "
                "expected host:port[,host:port...][/chroot]"
            ) from exc
        if listener is not None:
            client.add_listener(listener)
        try:
            client.start(timeout=self.connect_timeout)
        except KazooTimeoutError as exc:
            client.close()
            raise StoreUnavailableError(
                f"cannot connect to ZooKeeper at {self.hosts} within {self.connect_timeout}s; "
                "check that the servers are running and reachable from this machine, and "
                "the connection string (host:port[,host:port...][/chroot])"
            ) from exc
        return client

    def topology_ids(self) -> list[str]:
        if self._client is not None:
            return self._children(self._client, _ROOT)
        client = self._connect()
        try:
            return self._children(client, _ROOT)
        finally:
            client.stop()
            client.close()

    def _children(self, client: Any, path: str) -> list[str]:
        try:
            return sorted(client.get_children(path))
        except NoNodeError:
            return []
        except KazooException as exc:
            raise StoreUnavailableError(
                f"cannot list {path} in ZooKeeper at {self.hosts}: {exc!r}"
            ) from exc

    def close(self) -> None:
        client = self._client
        if client is None:
            return
        if self._fence is not None and self._session_id is not None:
            self._give_up_leader_node()
        self._client = None
        self._fence = None
        client.remove_listener(self._on_state)
        client.stop()
        client.close()

    def _on_state(self, state: str) -> None:
        """Kazoo's listener; it must not block, so it only records what happened."""
        with self._flags:
            if state == KazooState.LOST:
                self._session_lost = True

    def register(self, identity: TopologyIdentity) -> None:
        value = _encode({"spout": identity.spout, "kind": identity.kind}, "the identity")
        try:
            self._zk.create(self._path("identity"), value)
            return
        except NodeExistsError:
            pass
        except KazooException as exc:
            raise CoordinatorError(f"cannot store the topology identity: {exc!r}") from exc
        try:
            data, _ = self._zk.get(self._path("identity"))
        except KazooException as exc:
            raise CoordinatorError(f"cannot read the topology identity: {exc!r}") from exc
        stored = TopologyIdentity(**_decode(data))
        if stored != identity:
            raise ConfigurationError(
                f"topology id {self._topology_id!r} is registered for spout {stored.spout!r} "
                f"({stored.kind}), not {identity.spout!r} ({identity.kind}); use another "
                f"--topology-id, or delete {self._path()} in ZooKeeper to start over"
            )

    def acquire_leadership(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        leader = self._path("leader")
        self._wait_connected(deadline)
        changed = threading.Event()

        def on_change(_event: object) -> None:
            changed.set()

        try:
            while True:
                try:
                    self._zk.create(leader, self.runner_id.encode(), ephemeral=True)
                    break
                except NodeExistsError:
                    pass
                except (ConnectionLoss, SessionExpiredError):
                    self._ride_out(deadline)  # a create that did apply is found below
                    continue
                changed.clear()
                try:
                    holder, stat = self._zk.get(leader, watch=on_change)
                except NoNodeError:
                    continue
                except (ConnectionLoss, SessionExpiredError):
                    self._ride_out(deadline)
                    continue
                if stat.ephemeralOwner == self._current_session():
                    break  # ours already, from an earlier call on this session
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LostLeadershipError(
                        f"another runner holds topology {self._topology_id!r} (node {leader} "
                        f"holds runner {holder.decode(errors='replace')}); stop it or wait for "
                        "it to finish, or use another --topology-id"
                    )
                changed.wait(min(_WAIT_SLICE_SECONDS, remaining or _WAIT_SLICE_SECONDS))
            self._session_id = self._current_session()
            with self._flags:
                self._session_lost = False
        except KazooException as exc:
            raise CoordinatorError(f"cannot acquire leadership of {leader}: {exc!r}") from exc
        try:
            self._take_fence()
        except KazooException as exc:
            self._give_up_leader_node()
            raise CoordinatorError(f"cannot take the fence of {leader}: {exc!r}") from exc

    def _ride_out(self, deadline: float | None) -> None:
        """A standby waits through a connection blip (or a new session) rather than
        fail: leadership may come up meanwhile."""
        time.sleep(0.05)
        self._wait_connected(deadline)

    def _wait_connected(self, deadline: float | None) -> None:
        """Requests made while disconnected wait in kazoo's queue with no time limit."""
        while self._zk.state != KazooState.CONNECTED:
            if deadline is not None and time.monotonic() >= deadline:
                raise StoreUnavailableError(
                    f"not connected to ZooKeeper at {self.hosts} (state {self._zk.state}); "
                    "check that the servers are running and reachable"
                )
            time.sleep(0.05)

    def fence_token(self) -> int | None:
        return self._token if self._fence is not None else None

    def _current_session(self) -> int | None:
        client_id = self._zk.client_id
        return None if client_id is None else int(client_id[0])

    def _give_up_leader_node(self) -> None:
        """Delete our leader node now rather than when the session ends, so that a
        standby need not wait for the session timeout."""
        leader = self._path("leader")
        try:
            if self._zk.state != KazooState.CONNECTED:
                return  # closing must not wait for a server that is gone
            stat = self._zk.exists_async(leader).get(timeout=self.session_timeout)
            if stat is not None and stat.ephemeralOwner == self._session_id:
                self._zk.delete_async(leader, version=stat.version).get(
                    timeout=self.session_timeout
                )
        except (KazooException, KazooTimeoutError):
            pass  # the node is ephemeral: it goes with the session anyway

    def _take_fence(self) -> None:
        """Rewrite currtx to bump its version: any write prepared against the version
        an earlier leader saw is refused from now on."""
        currtx = self._path("coordinator", "currtx")
        while True:
            try:
                data, stat = self._zk.get(currtx)
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    self._zk.create(currtx, _encode(1, "currtx"))
                continue
            try:
                stat = self._zk.set(currtx, data, version=stat.version)
            except BadVersionError:
                continue
            self._fence = self._token = stat.version
            self._currtx = int(_decode(data))
            self._metas = None  # an earlier leader may have written since we last looked
            return

    def check_leadership(self) -> None:
        """Kazoo's listener records a lost session; a suspended connection shows in the
        client's state; after a reconnection the leader node and the fence are read back,
        so a session that ended, or a runner that took over, is seen on the next call."""
        client = self._client
        if client is None or self._fence is None:
            raise LostLeadershipError(
                f"this runner does not lead topology {self._topology_id!r}: it never acquired "
                "leadership or has closed the store"
            )
        with self._flags:
            lost = self._session_lost
        if lost or client.state != KazooState.CONNECTED:
            raise LostLeadershipError(
                f"the ZooKeeper session of this runner is {'lost' if lost else 'interrupted'}, "
                f"so another runner may lead topology {self._topology_id!r}; stop this runner"
            )
        # Both reads in flight at once: one round trip, not two.
        leader = client.exists_async(self._path("leader"))
        currtx = client.exists_async(self._path("coordinator", "currtx"))
        try:
            leader_stat = leader.get(timeout=self.session_timeout)
            currtx_stat = currtx.get(timeout=self.session_timeout)
        except (KazooException, KazooTimeoutError) as exc:
            raise LostLeadershipError(f"cannot verify leadership in ZooKeeper: {exc!r}") from exc
        if leader_stat is None or leader_stat.ephemeralOwner != self._session_id:
            raise LostLeadershipError(
                f"the leader node {self._path('leader')} is no longer this runner's; "
                "stop this runner"
            )
        if currtx_stat is None or currtx_stat.version != self._fence:
            raise LostLeadershipError(
                f"another runner took over topology {self._topology_id!r}; stop this runner"
            )

    def _require_fence(self) -> int:
        if self._fence is None:
            raise LostLeadershipError(
                f"this runner does not lead topology {self._topology_id!r}: call "
                "acquire_leadership first"
            )
        return self._fence

    def read_state(self) -> StoredState:
        zk = self._zk
        try:
            try:
                data, _ = zk.get(self._path("coordinator", "currtx"))
                currtx = int(_decode(data))
            except NoNodeError:
                currtx = 1
            meta_ids = sorted(int(n) for n in zk.get_children(self._path("coordinator", "meta")))
            part_ids = sorted(int(n) for n in zk.get_children(self._path("partition")))
            listings = {p: zk.get_children_async(self._path("partition", str(p))) for p in part_ids}
            index = {p: {int(n) for n in listing.get()} for p, listing in listings.items()}
            # Fetch every value concurrently, then wait: round trips overlap.
            meta_gets = {
                t: zk.get_async(self._path("coordinator", "meta", _node(t))) for t in meta_ids
            }
            part_gets = {
                (t, p): zk.get_async(self._path("partition", str(p), _node(t)))
                for p, txids in index.items()
                for t in txids
            }
            try:  # absent from a topology stored before digests existed
                digest_ids = zk.get_children(self._path("coordinator", "digest"))
            except NoNodeError:
                digest_ids = []
            digest_gets = {
                t: zk.get_async(self._path("coordinator", "digest", _node(t)))
                for t in sorted(int(n) for n in digest_ids)
            }
            metas = {t: _decode(get.get()[0]) for t, get in meta_gets.items()}
            digests = {t: _decode(get.get()[0]) for t, get in digest_gets.items()}
            partitions: dict[int, dict[int, JsonValue]] = {}
            for (t, p), get in sorted(part_gets.items()):
                partitions.setdefault(t, {})[p] = _decode(get.get()[0])
        except (KazooException, ValueError) as exc:
            raise CoordinatorError(
                f"cannot read the state of {self._path()} from ZooKeeper: {exc!r}"
            ) from exc
        self._metas = set(metas)
        self._partitions = index
        self._digests = set(digests)
        return StoredState(currtx=currtx, metas=metas, partitions=partitions, digests=digests)

    def _index(self) -> tuple[set[int], dict[int, set[int]]]:
        if self._metas is None:
            self.read_state()
        assert self._metas is not None
        return self._metas, self._partitions

    def _commit(self, tx: Any, what: str, on_exists: str = "") -> list[Any]:
        """Commit a multi-op whose first operation checks the fence. Kazoo reports a
        failed multi-op as results: the failing operation's error, rollbacks elsewhere."""
        if self._zk.state != KazooState.CONNECTED:  # else kazoo would queue it, unbounded
            raise LostLeadershipError(
                f"the ZooKeeper connection is {self._zk.state} while {what}; nothing was "
                "written: take leadership again once it is back"
            )
        try:
            results: list[Any] = tx.commit_async().get(timeout=self.session_timeout)
        except (ConnectionLoss, SessionExpiredError, KazooTimeoutError) as exc:
            self._metas = None  # the write may or may not have applied
            raise LostLeadershipError(
                f"lost the ZooKeeper connection while {what}; the write may or may not have "
                "applied: the state is read again once this runner leads again"
            ) from exc
        except KazooException as exc:
            self._metas = None
            raise CoordinatorError(f"ZooKeeper refused {what}: {exc!r}") from exc
        for i, error in enumerate(results):
            if not isinstance(error, Exception) or isinstance(
                error, RolledBackError | RuntimeInconsistency
            ):
                continue
            self._metas = None  # our index disagrees with ZooKeeper: reload it
            if i == 0:
                raise FencedError(
                    f"another runner took over topology {self._topology_id!r}; "
                    "this runner must stop without writing"
                ) from error
            if on_exists and isinstance(error, NodeExistsError):
                raise CoordinatorError(on_exists) from error
            raise CoordinatorError(
                f"ZooKeeper refused {what} (operation {i}: {error!r}); "
                "restart the runner to reload the state"
            ) from error
        return results

    def start_transaction(
        self, txid: int, meta: JsonValue, partitions: Mapping[int, JsonValue]
    ) -> None:
        fence = self._require_fence()
        if txid < self._currtx:
            raise CoordinatorError(
                f"txid {txid} is already committed (currtx is {self._currtx}); "
                "it cannot start again"
            )
        metas, index = self._index()
        tx = self._zk.transaction()
        tx.check(self._path("coordinator", "currtx"), fence)
        tx.create(self._path("coordinator", "meta", _node(txid)), _encode(meta, f"txid {txid}"))
        for p, value in sorted(partitions.items()):
            if p not in index:
                tx.create(self._path("partition", str(p)))
            tx.create(
                self._path("partition", str(p), _node(txid)),
                _encode(value, f"partition {p} of txid {txid}"),
            )
        exists = f"metadata of txid {txid} already stored; it never changes"
        self._commit(tx, f"starting txid {txid}", on_exists=exists)
        metas.add(txid)
        for p in partitions:
            index.setdefault(p, set()).add(txid)

    def advance(self, txid: int, partitions: Mapping[int, JsonValue] | None = None) -> None:
        fence = self._require_fence()
        if txid != self._currtx:
            raise FencedError(
                f"cannot advance topology {self._topology_id!r} past txid {txid}: "
                f"currtx is {self._currtx}"
            )
        metas, index = self._index()
        partitions = partitions or {}
        tx = self._zk.transaction()
        # Checks the fence and moves currtx in one operation.
        tx.set_data(self._path("coordinator", "currtx"), _encode(txid + 1, "currtx"), fence)
        for p, value in sorted(partitions.items()):
            data = _encode(value, f"partition {p} of txid {txid}")
            node = self._path("partition", str(p), _node(txid))
            if p not in index:
                tx.create(self._path("partition", str(p)))
            if txid in index.get(p, ()):
                tx.set_data(node, data)
            else:
                tx.create(node, data)
        for t in sorted(t for t in metas if t < txid):
            tx.delete(self._path("coordinator", "meta", _node(t)))
        for p, txids in sorted(index.items()):
            for t in sorted(t for t in txids if t < txid):
                tx.delete(self._path("partition", str(p), _node(t)))
        done = {t for t in self._digests if t <= txid}
        for t in sorted(done):
            tx.delete(self._path("coordinator", "digest", _node(t)))
        results = self._commit(tx, f"advancing past txid {txid}")
        self._fence = results[0].version
        self._currtx = txid + 1
        self._digests -= done
        metas.difference_update({t for t in metas if t < txid})
        for p in partitions:
            index.setdefault(p, set()).add(txid)
        for txids in index.values():
            txids.difference_update({t for t in txids if t < txid})

    def record_digest(self, txid: int, digest: JsonValue) -> None:
        fence = self._require_fence()
        metas, _ = self._index()
        if txid < self._currtx or txid not in metas:
            raise CoordinatorError(
                f"cannot record the digest of txid {txid}: it is not started and uncommitted "
                f"(currtx is {self._currtx})"
            )
        tx = self._zk.transaction()
        tx.check(self._path("coordinator", "currtx"), fence)
        tx.create(
            self._path("coordinator", "digest", _node(txid)),
            _encode(digest, f"the digest of txid {txid}"),
        )
        exists = f"the digest of txid {txid} is already stored; it never changes"
        self._commit(tx, f"recording the digest of txid {txid}", on_exists=exists)
        self._digests.add(txid)

    def retract(self, txid: int) -> None:
        fence = self._require_fence()
        if txid < self._currtx:
            raise FencedError(
                f"cannot retract txid {txid} of topology {self._topology_id!r}: currtx is "
                f"{self._currtx}"
            )
        metas, index = self._index()
        tx = self._zk.transaction()
        tx.check(self._path("coordinator", "currtx"), fence)
        for t in sorted(t for t in metas if t >= txid):
            tx.delete(self._path("coordinator", "meta", _node(t)))
        for p, txids in sorted(index.items()):
            for t in sorted(t for t in txids if t >= txid):
                tx.delete(self._path("partition", str(p), _node(t)))
        for t in sorted(t for t in self._digests if t >= txid):
            tx.delete(self._path("coordinator", "digest", _node(t)))
        self._commit(tx, f"retracting txids from {txid}")
        metas.difference_update({t for t in metas if t >= txid})
        for txids in index.values():
            txids.difference_update({t for t in txids if t >= txid})
        self._digests = {t for t in self._digests if t < txid}
