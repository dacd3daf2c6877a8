"""The ZooKeeper state store: several runners on several machines, one leader.

Layout under ``/transactional/<topology-id>/``: ``identity``, ``leader`` (ephemeral,
holds the leader's runner id), ``coordinator/currtx``, ``coordinator/meta/<txid>``,
``coordinator/digest/<txid>`` (what a txid's first emit held, for the determinism check),
``coordinator/group`` (the commit group last recorded, ``{"first", "last"}``, empty when
none; kept after its advance, when it no longer binds), ``coordinator/rewind`` (the txid of
an unfinished rewind, empty when none) and ``partition/<p>/<txid>``, txids zero-padded so
that names sort. Values are JSON. The metadata of the last ``history`` committed txids
is kept for rewinds.

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

A leader SIGKILLed on this machine leaves its session to time out, and the leader node
with it; the next store to ask for leadership here closes that session at once
instead (``_zk_handover``): it never waits for a dead runner's timeout on the machine
the runner died on.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

from kazoo.exceptions import (
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import KazooState

from coordinators import _zk, _zk_handover, _zk_leader
from coordinators._fenced import FencedStore, checked_history, decode, encode, encode_group
from coordinators._zk import node
from coordinators._zk_nodes import TxidNodes
from transactional.errors import (
    ConfigurationError,
    CoordinatorError,
    LostLeadershipError,
    StoreUnavailableError,
    UnknownTopologyError,
)
from transactional.store import (
    JsonValue,
    Leadership,
    StoredHistory,
    StoredState,
    TopologyIdentity,
)

log = logging.getLogger("coordinators.zookeeper")
_ROOT = "/transactional"


def _data(value: JsonValue, what: str) -> bytes:
    return encode(value, what).encode()


class ZooKeeperStateStore(FencedStore):
    """State of one topology in ZooKeeper, written only by the elected runner."""

    def __init__(
        self,
        hosts: str,
        session_timeout: float = 10.0,
        connect_timeout: float = 15.0,
        history: int = FencedStore.history,
        credentials: str | None = None,
    ) -> None:
        self.hosts = hosts
        #: Digest credentials (``user:password``): every node of the topology gets the
        #: ACL "this user may do anything, nobody else anything" (``_zk.guard``).
        self._credentials = (
            None
            if credentials is None
            else _zk.Credentials(credentials, "ZooKeeperStateStore credentials")
        )
        self.history = checked_history(history)
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        #: Stored in the ``leader`` node, so that an operator can tell runners apart.
        self.runner_id = uuid.uuid4().hex
        self._client: Any = None
        self._topology_id: str | None = None
        # Set by kazoo's connection thread, read by the runner's thread.
        self._flags = threading.Lock()
        self._session_lost = False
        #: Kazoo's last state (None: not connected yet).
        self._state: str | None = None
        self._fence: int | None = None  # version of currtx after our last write
        self._token: int | None = None  # version of currtx when we took the fence
        self._session_id: int | None = None  # the session that owns our leader node
        self._handover: _zk_handover.SessionFile | None = None  # recorded our session
        self._currtx = 1  # the value of currtx at version self._fence
        # The txid nodes that exist (None: to be read from the tree before a write).
        self._nodes: TxidNodes | None = None
        self._group: tuple[int, int] | None = None  # valid while self._nodes is not None
        self._rewinding: int | None = None  # likewise

    def _path(self, *parts: str) -> str:
        if self._topology_id is None:
            raise self._not_open()
        return "/".join((_ROOT, self._topology_id, *parts))

    @property
    def _zk(self) -> Any:
        if self._client is None:
            raise self._not_open()
        return self._client

    def open(self, topology_id: str, read_only: bool = False) -> None:
        if not topology_id or "/" in topology_id or topology_id in (".", ".."):
            raise ConfigurationError(
                f"topology id {topology_id!r} cannot name a ZooKeeper node: use a non-empty "
                "name without '/'"
            )
        if self._client is not None:
            raise CoordinatorError("the state store is already open")
        client = _zk.connect(
            self.hosts,
            self.session_timeout,
            self.connect_timeout,
            self._on_state,
            self._credentials,
        )
        self._client = client
        self._topology_id = topology_id
        where = f"ZooKeeper at {self.hosts}"
        if read_only:
            try:
                known = _zk.list_children(client, _ROOT, self.hosts)
                if topology_id not in known:
                    raise UnknownTopologyError(topology_id, where, known)
                _zk.guard(client, _ROOT, self._path(), self._credentials, where, protect=False)
            except BaseException:
                self.close()
                raise
            return
        try:
            _zk.guard(client, _ROOT, self._path(), self._credentials, where, protect=True)
        except BaseException:
            self.close()
            raise
        try:
            client.ensure_path(self._path("coordinator", "meta"))
            client.ensure_path(self._path("coordinator", "digest"))
            client.ensure_path(self._path("coordinator", "group"))
            client.ensure_path(self._path("coordinator", "rewind"))
            client.ensure_path(self._path("partition"))
        except KazooException as exc:
            self.close()
            raise StoreUnavailableError(
                f"cannot create {_ROOT}/{topology_id} in ZooKeeper at {self.hosts}: {exc!r}; "
                "check that the chroot exists and that this client may create nodes"
            ) from exc

    def preflight(self) -> None:
        _zk.probe(self.hosts)

    def topology_ids(self) -> list[str]:
        if self._client is not None:
            return _zk.list_children(self._client, _ROOT, self.hosts)
        client = _zk.connect(
            self.hosts, self.session_timeout, self.connect_timeout, credentials=self._credentials
        )
        try:
            return _zk.list_children(client, _ROOT, self.hosts)
        finally:
            client.stop()
            client.close()

    def close(self) -> None:
        client = self._client
        if client is None:
            return
        if self._handover is not None:  # first: a later leader may record its own
            self._handover.forget(self._session_id)
            self._handover = None
        if self._fence is not None and self._session_id is not None:
            self._give_up_leader_node()
        self._client = None
        self._fence = None
        client.remove_listener(self._on_state)
        client.stop()
        client.close()

    def _on_state(self, state: str) -> None:
        """Kazoo's listener; it must not block, so it records what happened and says so:
        the connection lost (the session may outlive it, ``session_timeout``), the session
        expired (this runner no longer leads), the connection back."""
        with self._flags:
            if state == KazooState.LOST:
                self._session_lost = True
            before, self._state = self._state, state
        client = self._client
        live = client.client_id if client is not None else None  # None unless connected
        session = live[0] if live else self._session_id  # else the one our leader node had
        where = f"topology={self._topology_id} hosts={self.hosts} session={_hex(session)}"
        if state == KazooState.SUSPENDED:
            log.warning(
                "zookeeper connection lost %s: the session lasts %ss without it",
                where,
                self.session_timeout,
            )
        elif state == KazooState.LOST and before is not None:
            log.warning("zookeeper session expired %s: this runner no longer leads", where)
        elif state == KazooState.CONNECTED and before in (KazooState.SUSPENDED, KazooState.LOST):
            log.warning("zookeeper connection back %s", where)

    def publish_status(self, document: JsonValue) -> None:
        """Best effort, and never a wait on ZooKeeper: refused at once without a
        connection, and given at most the session timeout (kazoo would otherwise hold
        the call, and the runner's thread with it, until the connection came back,
        which without a quorum may be never)."""
        client = self._zk
        _zk.wait_connected(client, self.hosts, deadline=time.monotonic())  # no wait at all
        value, path = json.dumps(document).encode(), self._path("status")
        try:
            try:
                client.set_async(path, value).get(timeout=self.session_timeout)
            except NoNodeError:
                client.create_async(path, value).get(timeout=self.session_timeout)
        except client.handler.timeout_exception as exc:
            raise StoreUnavailableError(
                f"ZooKeeper at {self.hosts} did not take the status document within "
                f"{self.session_timeout}s"
            ) from exc

    def read_status(self) -> JsonValue | None:
        try:
            data, _ = self._zk.get(self._path("status"))
        except NoNodeError:
            return None
        return json.loads(data)

    def read_leadership(self) -> Leadership:
        """A runner leads while its session holds the ephemeral ``leader`` node, which
        ZooKeeper deletes once the session ends; a node created after the status node's
        last write (zxids order every change) belongs to a later leadership than the
        report's."""
        leader = self._path("leader")
        try:
            node, status = _zk_leader.stats(
                self._zk, [leader, self._path("status")], self.session_timeout
            )
        except _zk_leader.ERRORS as exc:
            raise CoordinatorError(f"cannot read {leader} from ZooKeeper: {exc!r}") from exc
        return Leadership(
            held=node is not None,
            after_report=node is not None and status is not None and node.czxid > status.mzxid,
            gone=f"its ZooKeeper session ended: no session holds {leader}",
        )

    def register(self, identity: TopologyIdentity) -> None:
        value = _data({"spout": identity.spout, "kind": identity.kind}, "the identity")
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
        stored = TopologyIdentity(**decode(data))
        self._check_identity(stored, identity, f"delete {self._path()} in ZooKeeper")

    def acquire_leadership(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        leader = self._path("leader")
        handover = _zk_handover.SessionFile(self.hosts, str(self._topology_id))
        connect = self.connect_timeout if timeout is None else min(timeout, self.connect_timeout)
        handover.hand_back(connect)  # a dead runner's session here: closed, not waited for
        try:
            self._session_id = _zk_leader.elect(
                self._zk, self.hosts, leader, self.runner_id, deadline, str(self._topology_id)
            )
            with self._flags:
                self._session_lost = False
        except KazooException as exc:
            raise CoordinatorError(f"cannot acquire leadership of {leader}: {exc!r}") from exc
        try:
            self._take_fence()
        except KazooException as exc:
            self._give_up_leader_node()
            raise CoordinatorError(f"cannot take the fence of {leader}: {exc!r}") from exc
        handover.record(self._zk, self._session_id, self.runner_id)
        self._handover = handover

    def fence_token(self) -> int | None:
        return self._token if self._fence is not None else None

    def _give_up_leader_node(self) -> None:
        """Delete our leader node now rather than when the session ends, so that a
        standby need not wait for the session timeout."""
        _zk.delete_own(self._zk, self._path("leader"), self._session_id, self.session_timeout)

    def _take_fence(self) -> None:
        """Bump the version of currtx (``_zk_leader.take_fence``) and take it as ours."""
        currtx = self._path("coordinator", "currtx")
        version, data = _zk_leader.take_fence(self._zk, currtx, _data(1, "currtx"))
        self._fence = self._token = version
        self._currtx = int(decode(data))
        self._nodes = None  # an earlier leader may have written since we last looked

    def check_leadership(self) -> None:
        """Kazoo's listener records a lost session; a suspended connection shows in the
        client's state; after a reconnection the leader node and the fence are read back,
        so a session that ended, or a runner that took over, is seen on the next call."""
        client = self._client
        if client is None or self._fence is None:
            raise self._not_leading()
        with self._flags:
            lost = self._session_lost
        if lost or client.state != KazooState.CONNECTED:
            raise LostLeadershipError(
                f"the ZooKeeper session of this runner is {'lost' if lost else 'interrupted'}, "
                f"so another runner may lead topology {self._topology_id!r}; stop this runner"
            )
        paths = [self._path("leader"), self._path("coordinator", "currtx")]
        try:
            leader_stat, currtx_stat = _zk_leader.stats(client, paths, self.session_timeout)
        except _zk_leader.ERRORS as exc:
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

    def read_state(self) -> StoredState:
        try:
            state, index = _zk.read_tree(self._zk, self._path())
        except (KazooException, ValueError) as exc:
            raise CoordinatorError(
                f"cannot read the state of {self._path()} from ZooKeeper: {exc!r}"
            ) from exc
        self._nodes = TxidNodes(set(state.metas) | set(state.kept), index, set(state.digests))
        self._group = state.group
        self._rewinding = state.rewinding
        return state

    def read_history(self) -> StoredHistory:
        """The kept txids' nodes below ``currtx - 1`` (``_zk.read_history``); it leaves
        what this store knows of its nodes for its writes as it was."""
        try:
            return _zk.read_history(self._zk, self._path())
        except (KazooException, ValueError) as exc:
            raise CoordinatorError(
                f"cannot read the kept metadata of {self._path()} from ZooKeeper: {exc!r}"
            ) from exc

    def _txid_nodes(self) -> TxidNodes:
        if self._nodes is None:
            self.read_state()
        assert self._nodes is not None
        return self._nodes

    def _commit(self, tx: Any, what: str, on_exists: str = "") -> list[Any]:
        try:
            return _zk.commit(self._zk, tx, what, self.session_timeout, self._taken_over, on_exists)
        except BaseException:
            self._nodes = None  # the write may have applied, or the nodes disagree: reload
            raise

    def _write_start(self, fence: int, txid: int, meta: str, parts: dict[int, str]) -> None:
        self._check_start(txid, self._currtx)
        nodes = self._txid_nodes()
        tx = self._zk.transaction()
        tx.check(self._path("coordinator", "currtx"), fence)
        tx.create(self._path("coordinator", "meta", node(txid)), meta.encode())
        for p, value in parts.items():
            if p not in nodes.partitions:
                tx.create(self._path("partition", str(p)))
            tx.create(self._path("partition", str(p), node(txid)), value.encode())
        exists = self._already_stored(f"metadata of txid {txid}")
        self._commit(tx, f"starting txid {txid}", on_exists=exists)
        nodes.metas.add(txid)
        nodes.add_parts(txid, parts)

    def _write_advance(self, fence: int, txid: int, parts: dict[int, str], first: int) -> None:
        nodes = self._txid_nodes()
        self._check_advance(txid, self._currtx, first, self._group)
        tx = self._zk.transaction()
        # Checks the fence and moves currtx in one operation.
        tx.set_data(self._path("coordinator", "currtx"), _data(txid + 1, "currtx"), fence)
        for p, value in parts.items():
            path = self._path("partition", str(p), node(txid))
            if p not in nodes.partitions:
                tx.create(self._path("partition", str(p)))
            if txid in nodes.partitions.get(p, ()):
                tx.set_data(path, value.encode())
            else:
                tx.create(path, value.encode())
        below = self._kept_below(txid)
        old_metas, done_digests = (lambda t: t < below), (lambda t: t <= txid)
        nodes.delete(tx, self._path, old_metas, done_digests)
        results = self._commit(tx, f"advancing past txid {txid}")
        self._fence = results[0].version
        self._currtx = txid + 1
        nodes.add_parts(txid, parts)
        nodes.forget(old_metas, done_digests)

    def _write_digest(self, fence: int, txid: int, digest: str) -> None:
        nodes = self._txid_nodes()
        self._check_digest(txid, self._currtx, txid in nodes.metas)
        tx = self._zk.transaction()
        tx.check(self._path("coordinator", "currtx"), fence)
        tx.create(self._path("coordinator", "digest", node(txid)), digest.encode())
        exists = self._already_stored(f"the digest of txid {txid}")
        self._commit(tx, f"recording the digest of txid {txid}", on_exists=exists)
        nodes.digests.add(txid)

    def _write_group(self, fence: int, first: int, last: int) -> None:
        metas = self._txid_nodes().metas
        started = all(t in metas for t in range(first, last + 1))
        self._check_group(first, last, self._currtx, started, self._group)
        tx = self._zk.transaction()
        tx.check(self._path("coordinator", "currtx"), fence)
        tx.set_data(self._path("coordinator", "group"), encode_group(first, last).encode())
        self._commit(tx, f"recording the commit group {first}..{last}")
        self._group = (first, last)

    def _write_retract(self, fence: int, txid: int) -> None:
        nodes = self._txid_nodes()
        self._check_retract(txid, self._currtx, self._group)
        tx = self._zk.transaction()
        tx.check(self._path("coordinator", "currtx"), fence)

        def retracted(t: int) -> bool:
            return t >= txid

        nodes.delete(tx, self._path, retracted)
        self._commit(tx, f"retracting txids from {txid}")
        nodes.forget(retracted)

    def _write_rewind(self, fence: int, txid: int, finish: bool) -> None:
        nodes = self._txid_nodes()
        kept = {t for t in nodes.metas if t < self._currtx}
        self._check_rewind(txid, self._currtx, kept, self._rewinding, finish)
        tx = self._zk.transaction()
        if not finish:
            tx.check(self._path("coordinator", "currtx"), fence)
            tx.set_data(self._path("coordinator", "rewind"), _data(txid, "a rewind"))
            self._commit(tx, f"recording a rewind to txid {txid}")
            self._rewinding = txid
            return
        tx.set_data(self._path("coordinator", "currtx"), _data(txid + 1, "currtx"), fence)

        def undone(t: int) -> bool:
            return t > txid

        nodes.delete(tx, self._path, undone)
        tx.set_data(self._path("coordinator", "group"), b"")
        tx.set_data(self._path("coordinator", "rewind"), b"")
        results = self._commit(tx, f"rewinding to txid {txid}")
        self._fence = results[0].version
        self._currtx = txid + 1
        nodes.forget(undone)
        self._group = None
        self._rewinding = None


def _hex(session: int | None) -> str:
    return "none" if session is None else f"0x{session:x}"
