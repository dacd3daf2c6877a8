"""The state-store plug-in interface (ZooKeeper, SQLite): where ``currtx`` and the
metadata of started transactions live."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from transactional.errors import ConfigurationError

JsonValue = Any


@dataclass(frozen=True)
class StoredHistory:
    """What a store keeps of the committed txids below ``currtx - 1`` for rewinds
    (``StoredState.kept``), as ``StateStore.read_history`` reads it: ``metas`` maps each
    such txid to its coordinator metadata, ``partitions`` txid -> partition -> metadata
    (a txid without partition metadata has no entry)."""

    metas: Mapping[int, JsonValue] = field(default_factory=dict)
    partitions: Mapping[int, Mapping[int, JsonValue]] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredState:
    """Everything a runner needs to resume: ``currtx`` is the next txid to commit,
    ``metas`` maps started-and-not-cleaned txids to their coordinator metadata,
    ``partitions`` maps txid -> partition -> metadata and ``digests`` txid -> what its
    first emit held (see ``StateStore.record_digest``)."""

    currtx: int = 1
    metas: Mapping[int, JsonValue] = field(default_factory=dict)
    partitions: Mapping[int, Mapping[int, JsonValue]] = field(default_factory=dict)
    #: txid -> the digest of its first emit (``record_digest``), for uncommitted txids.
    digests: Mapping[int, JsonValue] = field(default_factory=dict)
    #: The last commit group recorded (``record_group``) as ``(first, last)``: while
    #: ``first == currtx`` it may have reached a sink, and is committed again exactly;
    #: once advanced past it is kept, and binds nothing.
    group: tuple[int, int] | None = None
    #: Committed txids below ``currtx - 1`` whose metadata the store still keeps (its
    #: ``history``; their metadata is not in ``metas``): with ``currtx - 1`` and 0
    #: ("before the first"), the txids a rewind can go back to.
    kept: tuple[int, ...] = ()
    #: The txid of a rewind begun and not finished (``begin_rewind``): no run may start.
    rewinding: int | None = None
    #: The metadata of the ``kept`` txids, for a person or a script to see
    #: (``transactional status``): ``read_state`` leaves it None (the runner never needs
    #: it, and its read at start stays as fast); ``StateStore.read_history`` reads it.
    history: StoredHistory | None = None

    @property
    def rewind_targets(self) -> list[int]:
        """The txids a rewind can go back to: 0, the kept ones, the last committed."""
        return [0, *self.kept, self.currtx - 1] if self.currtx > 1 else [0]


@dataclass(frozen=True)
class Leadership:
    """Who leads a topology now, as its store can tell reading only
    (``StateStore.read_leadership``): what ``transactional status`` judges the runner's
    last report by (``transactional.runtime.status.liveness``), since a killed runner
    leaves a report that still says it runs."""

    #: True: a live runner holds the leadership; False: none does; None: the store
    #: cannot tell.
    held: bool | None = None
    #: The leadership held now was taken after the runner's last report was written:
    #: whoever wrote it no longer leads (another run, or a rewind, took over).
    after_report: bool = False
    #: The fence token of the latest leadership taken (None: not known): a report
    #: whose leader's token is below it was written under an earlier one.
    token: int | None = None
    #: How the store knows that no runner leads, for a person: the sign of life that is
    #: gone.
    gone: str = "no runner holds the leadership"


@dataclass(frozen=True)
class TopologyIdentity:
    """Stored with the state on first start; a different spout on the same topology id is
    refused, since it would misread the stored metadata."""

    spout: str
    kind: str


class StateStore(ABC):
    """One topology's transaction state. All writes are atomic; ``advance`` is fenced.

    The runner calls every method from one thread, except ``check_leadership``, which
    a committer may also call from the commit thread (``CommitterContext``): it must be
    safe to call concurrently with the others.

    Leadership can be lost without the runner's doing (a ZooKeeper session that
    expired, a lock file deleted). Every method that finds so raises
    ``LostLeadershipError``; ``FencedError`` (a subclass) when it has proof that another
    runner took over. After a plain ``LostLeadershipError`` the runner may call
    ``acquire_leadership`` again on the same open store, then ``read_state``: the store
    must support that (reconnecting, or starting a new session, as needed).
    """

    @abstractmethod
    def open(self, topology_id: str, read_only: bool = False) -> None:
        """Connect. Raise ``StoreUnavailableError`` (with the address to fix) if the store
        cannot be reached. ``read_only``: for looking at a topology's state (``transactional
        status``): write nothing (create no file, table or node), and raise
        ``UnknownTopologyError`` if the store holds no state for ``topology_id``."""

    def preflight(self) -> None:  # noqa: B027 - optional hook
        """Check, within a few seconds and changing nothing, that the store can be reached,
        before anything slow starts (the commands call it before Spark's JVM): raise
        ``StoreUnavailableError`` or ``ConfigurationError`` naming what to fix. Default:
        nothing to check."""

    @abstractmethod
    def topology_ids(self) -> list[str]:
        """The topology ids this store holds state for, sorted; reads only, and needs no
        ``open`` (a store that does not exist yet holds none)."""

    @abstractmethod
    def close(self) -> None:
        """Release leadership and connections. Idempotent."""

    @abstractmethod
    def register(self, identity: TopologyIdentity) -> None:
        """Store ``identity`` on first use, or raise ``ConfigurationError`` if the topology
        id already holds a different one. Changes nothing in the latter case."""

    @abstractmethod
    def acquire_leadership(self, timeout: float | None = None) -> None:
        """Block until this runner is the only one coordinating the topology id, then
        take the fence: from here on, writes by any earlier leader are refused.
        Raise ``LostLeadershipError`` on timeout while another runner leads, and
        ``StoreUnavailableError`` (or another ``CoordinatorError``) if the store cannot be
        reached in time: the runner tells "someone else leads" from "try again"."""

    @abstractmethod
    def check_leadership(self) -> None:
        """Raise ``LostLeadershipError`` unless this runner still provably leads."""

    def fence_token(self) -> int | None:
        """The fencing token of this runner's current leadership: taken by
        ``acquire_leadership`` and greater than the token of every earlier leadership of
        the topology id. Sinks store it with each commit and refuse a lower one, so a
        leader deposed without knowing it (paused past its session, say) cannot write
        once its successor has. None: this store has no token (sinks do not fence)."""
        return None

    @abstractmethod
    def read_state(self) -> StoredState:
        """Read ``currtx`` and all stored metadata."""

    def read_history(self) -> StoredHistory:
        """The metadata, and partition metadata, of every committed txid the store keeps
        below ``currtx - 1`` for rewinds (``StoredState.kept``, at most ``history`` of
        them), as the values ``start_transaction`` and ``advance`` stored. For people and
        scripts (``transactional status``), never for the runner: it reads only, works on
        a store opened ``read_only``, and may be slow for a long history. It is a read of
        its own: if a runner advances meanwhile, it may hold txids ``read_state`` saw as
        ``currtx - 1`` or no longer hold the oldest ones. Default: nothing (a store that
        keeps no history; one that keeps some must override this)."""
        return StoredHistory()

    @abstractmethod
    def start_transaction(
        self, txid: int, meta: JsonValue, partitions: Mapping[int, JsonValue]
    ) -> None:
        """Store the metadata of a new txid (and its partitions) in one atomic write.
        Refuse (``CoordinatorError``) if ``txid`` already has metadata: it never changes."""

    @abstractmethod
    def advance(
        self, txid: int, partitions: Mapping[int, JsonValue] | None = None, first: int | None = None
    ) -> None:
        """``txid`` committed, and with it every txid from ``first`` (a commit group;
        default: ``txid`` alone): in one atomic, fenced write, store ``partitions``
        (opaque spouts) for ``txid``, set ``currtx = txid + 1`` and delete all metadata
        below ``txid`` (its own is kept as the previous metadata of ``txid + 1``). Raise
        ``FencedError`` if ``currtx`` is not ``first`` or another runner took the fence,
        and ``CoordinatorError`` if a group is not the one ``record_group`` stored."""

    @abstractmethod
    def record_group(self, first: int, last: int) -> None:
        """Before txids ``first..last`` (``first == currtx``, all started) are committed
        as one sink write: store the group, in one atomic, fenced write, so that a
        replay after a crash commits exactly this group again (a sink that holds the
        group's last txid holds all of it). Refuse (``CoordinatorError``) a different
        group from the same ``first``: like metadata, it never changes. Recording the
        same group again changes nothing."""

    @abstractmethod
    def record_digest(self, txid: int, digest: JsonValue) -> None:
        """Store what the first emit of the started, uncommitted ``txid`` held (a record
        count and a content checksum per partition), in one atomic, fenced write, so that
        a replay can be checked against it. Refuse (``CoordinatorError``) if ``txid`` has
        no metadata or already has a digest: like metadata, it never changes. ``advance``
        deletes the digests of every txid up to the one it commits."""

    def publish_status(self, document: JsonValue) -> None:  # noqa: B027 - optional
        """Store the runner's status document (``transactional.runtime.status``), for
        ``transactional status``: a report, written without the fence and read by
        nothing that decides. Default: not kept."""

    def read_status(self) -> JsonValue | None:
        """The last status document published for the open topology id (None: none, or
        this store keeps none). Works on a store opened ``read_only``."""
        return None

    def read_leadership(self) -> Leadership:
        """Whether a live runner leads the open topology id now, and whether its
        leadership began after the status document ``read_status`` returns was written:
        reads only, works on a store opened ``read_only``. Default: cannot tell."""
        return Leadership()

    def begin_rewind(self, txid: int) -> None:
        """Record, in one atomic, fenced write, that the topology is being rewound to the
        committed ``txid`` (0: to before its first txid), before any sink is rolled back:
        until ``finish_rewind`` no run starts (``StoredState.rewinding``). Refuse
        (``ConfigurationError``) a txid not committed, or whose metadata is no longer
        kept, or another rewind unfinished. Default: the store cannot rewind."""
        raise ConfigurationError(f"{type(self).__name__} cannot rewind a topology")

    def finish_rewind(self, txid: int) -> None:
        """Once every sink holds ``txid`` again: in one atomic, fenced write, make
        ``currtx = txid + 1``, forget every txid after ``txid`` (metadata, digests, the
        commit group) and the rewind record, so that a run starts again from there."""
        raise ConfigurationError(f"{type(self).__name__} cannot rewind a topology")

    @abstractmethod
    def retract(self, txid: int) -> None:
        """Forget the started, uncommitted txids from ``txid`` up: delete their metadata,
        partition metadata and digests in one atomic, fenced write. The runner does this
        when a started batch turned out empty: nothing of it reached a sink, and an idle
        source must not leave a txid per poll behind. Raise ``FencedError`` if ``txid`` is
        below ``currtx`` or another runner took the fence, and ``CoordinatorError`` if it
        is inside the recorded commit group (which may have reached a sink)."""


def open_store(
    zookeeper: str | None,
    state_dir: str,
    zookeeper_auth: str | None = None,
    zk_session_timeout: float = 10.0,
) -> StateStore:
    """The ZooKeeper store if hosts are given (with digest credentials
    ``zookeeper_auth``, ``user:password``, if given, and the session timeout
    ``zk_session_timeout``), else the embedded SQLite store in
    ``state_dir`` (found through the ``transactional.stores`` entry points, so this
    package never imports the stores themselves)."""
    name = "zookeeper" if zookeeper else "sqlite"
    found = {ep.name: ep for ep in entry_points(group="transactional.stores")}
    if name not in found:
        raise ConfigurationError(
            f"no state store named {name!r} is installed; install the project with "
            "`pip install -e .` so its entry points are registered"
        )
    store_cls = found[name].load()
    if zookeeper:
        return store_cls(  # type: ignore[no-any-return]
            zookeeper, session_timeout=zk_session_timeout, credentials=zookeeper_auth
        )
    return store_cls(Path(state_dir) / "state.db")  # type: ignore[no-any-return]
