"""What every state store shares: the rules of fenced, versioned bookkeeping.

A store keeps, per topology id, ``currtx``, the metadata of each started txid (and of
its partitions) and the digest of its first emit. What may be written when is the same
on every backend, so it is decided here, once:

- metadata and digests are written once and never change;
- a txid below ``currtx`` is committed: it cannot start, be retracted or get a digest;
- ``advance`` moves ``currtx`` from exactly ``txid`` to ``txid + 1``, or, for a commit
  group, from its first txid past its last, and only for the group recorded;
- a commit group, once recorded, never changes while it may have reached a sink (its
  first txid is ``currtx``), and no txid of it is retracted;
- every write is refused unless this runner still holds the fence it took when it
  became leader (``FencedError``);
- ``advance`` keeps the metadata of the last ``history`` committed txids before the
  one it commits, so that a rewind can go back to them; a rewind is recorded before
  any sink rolls back, and finished (``currtx`` moved back, later txids forgotten) only
  for the txid recorded.

A backend supplies the atomic, fenced write on its server (``_write_start``,
``_write_advance``, ``_write_digest``, ``_write_retract``, ``_write_group``) and calls the matching
``_check_*`` rule with what it read inside that write (or, when its server checks the
fence itself, what it last wrote). Values are stored as canonical JSON (``encode``).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping

from transactional.errors import (
    ConfigurationError,
    CoordinatorError,
    FencedError,
    LostLeadershipError,
)
from transactional.store import JsonValue, StateStore, TopologyIdentity

__all__ = ["FencedStore", "checked_history", "decode", "decode_group", "encode", "encode_group"]


def encode(value: JsonValue, what: str) -> str:
    """``value`` as canonical JSON (sorted keys, no NaN): the same value, the same text."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CoordinatorError(
            f"{what} is not JSON-serialisable ({exc}); metadata must be plain JSON values"
        ) from exc


def decode(data: str | bytes) -> JsonValue:
    return json.loads(data)


class FencedStore(StateStore):
    """A ``StateStore`` whose writes follow the shared rules above."""

    _topology_id: str | None = None
    #: The fence this runner holds while it leads (None: it does not lead).
    _fence: int | None = None
    #: Committed txids whose metadata ``advance`` keeps besides the last (for rewinds).
    history: int = 100

    # -- the four writes: encode, require the fence, then the backend's atomic write --

    def start_transaction(
        self, txid: int, meta: JsonValue, partitions: Mapping[int, JsonValue]
    ) -> None:
        meta_text = encode(meta, f"the metadata of txid {txid}")
        parts = _encoded_partitions(txid, partitions)
        self._write_start(self._require_fence(), txid, meta_text, parts)

    def advance(
        self, txid: int, partitions: Mapping[int, JsonValue] | None = None, first: int | None = None
    ) -> None:
        parts = _encoded_partitions(txid, partitions or {})
        self._write_advance(self._require_fence(), txid, parts, txid if first is None else first)

    def record_group(self, first: int, last: int) -> None:
        if not first < last:
            raise CoordinatorError(f"a commit group needs first < last, got {first}..{last}")
        self._write_group(self._require_fence(), first, last)

    def record_digest(self, txid: int, digest: JsonValue) -> None:
        text = encode(digest, f"the digest of txid {txid}")
        self._write_digest(self._require_fence(), txid, text)

    def retract(self, txid: int) -> None:
        self._write_retract(self._require_fence(), txid)

    def begin_rewind(self, txid: int) -> None:
        self._write_rewind(self._require_fence(), txid, finish=False)

    def finish_rewind(self, txid: int) -> None:
        self._write_rewind(self._require_fence(), txid, finish=True)

    def _kept_below(self, txid: int) -> int:
        """The lowest txid whose metadata ``advance(txid)`` keeps."""
        return max(0, txid - self.history)

    @abstractmethod
    def _write_start(self, fence: int, txid: int, meta: str, parts: dict[int, str]) -> None:
        """Store a new txid's metadata and its partitions' (``_check_start``)."""

    @abstractmethod
    def _write_advance(self, fence: int, txid: int, parts: dict[int, str], first: int) -> None:
        """Store ``parts`` for ``txid``, move currtx from ``first`` past ``txid``, delete
        what is below it (``_check_advance``)."""

    @abstractmethod
    def _write_group(self, fence: int, first: int, last: int) -> None:
        """Store the commit group ``first..last`` (``_check_group``)."""

    @abstractmethod
    def _write_digest(self, fence: int, txid: int, digest: str) -> None:
        """Store the digest of a started, uncommitted txid (``_check_digest``)."""

    @abstractmethod
    def _write_retract(self, fence: int, txid: int) -> None:
        """Delete every started txid from ``txid`` up (``_check_retract``)."""

    @abstractmethod
    def _write_rewind(self, fence: int, txid: int, finish: bool) -> None:
        """Record a rewind to ``txid``, or finish it (``_check_rewind``)."""

    # -- the rules ------------------------------------------------------------------

    def _check_start(self, txid: int, currtx: int, exists: bool = False) -> None:
        if txid < currtx:
            raise CoordinatorError(
                f"txid {txid} is already committed (currtx is {currtx}); it cannot start again"
            )
        if exists:
            raise CoordinatorError(self._already_stored(f"metadata of txid {txid}"))

    def _check_advance(
        self, txid: int, currtx: int, first: int, group: tuple[int, int] | None
    ) -> None:
        if currtx != first:
            since = "" if first == txid else f" from txid {first}"
            raise FencedError(
                f"cannot advance topology {self._topology_id!r} past txid {txid}{since}: "
                f"currtx is {currtx}"
            )
        if first != txid and group != (first, txid):
            raise CoordinatorError(
                f"cannot advance topology {self._topology_id!r} past txids {first}..{txid} "
                f"as one group: the recorded group is {_group_text(group)}"
            )

    def _check_group(
        self, first: int, last: int, currtx: int, started: bool, group: tuple[int, int] | None
    ) -> None:
        if first != currtx or not started:
            raise CoordinatorError(
                f"cannot record the commit group {first}..{last}: it must start at currtx "
                f"({currtx}) and every txid of it must be started"
            )
        if group is not None and group[0] == currtx and group != (first, last):
            raise CoordinatorError(
                self._already_stored(f"the commit group from txid {first} ({_group_text(group)})")
            )

    def _check_digest(self, txid: int, currtx: int, started: bool) -> None:
        if txid < currtx or not started:
            raise CoordinatorError(
                f"cannot record the digest of txid {txid}: it is not started and uncommitted "
                f"(currtx is {currtx})"
            )

    def _check_retract(self, txid: int, currtx: int, group: tuple[int, int] | None) -> None:
        if txid < currtx:
            raise FencedError(
                f"cannot retract txid {txid} of topology {self._topology_id!r}: currtx is {currtx}"
            )
        if group is not None and group[0] == currtx and txid <= group[1]:
            raise CoordinatorError(
                f"cannot retract txid {txid}: it is in the recorded commit group "
                f"{_group_text(group)}, which may have reached a sink"
            )

    def _check_rewind(
        self, txid: int, currtx: int, kept: set[int], rewinding: int | None, finish: bool
    ) -> None:
        where = f"topology {self._topology_id!r}"
        if finish:
            if rewinding != txid:
                raise CoordinatorError(
                    f"cannot finish a rewind of {where} to txid {txid}: the store records "
                    + ("none" if rewinding is None else f"one to txid {rewinding}")
                )
            return
        if rewinding is not None and rewinding != txid:
            raise ConfigurationError(
                f"{where} is being rewound to txid {rewinding}: finish that rewind first "
                f"(`transactional rewind ... --to {rewinding}`)"
            )
        if not 0 <= txid < currtx:
            raise ConfigurationError(
                f"cannot rewind {where} to txid {txid}: the last committed txid is {currtx - 1}"
            )
        if txid != 0 and txid not in kept:
            oldest = min(kept, default=None)
            raise ConfigurationError(
                f"cannot rewind {where} to txid {txid}: the store no longer keeps its "
                f"metadata (it keeps txids {oldest}..{currtx - 1}, the last `history` "
                "committed ones); rewind to one of those, or to 0 (the beginning)"
            )

    def _check_identity(
        self, stored: TopologyIdentity, identity: TopologyIdentity, start_over: str
    ) -> None:
        """Refuse a topology id registered for another spout; ``start_over`` says what
        to delete to reuse the id."""
        if stored != identity:
            raise ConfigurationError(
                f"topology id {self._topology_id!r} is registered for spout {stored.spout!r} "
                f"({stored.kind}), not {identity.spout!r} ({identity.kind}); use another "
                f"--topology-id, or {start_over} to start over (the same spout class, "
                "moved to another module? set its stored_name to the name stored)"
            )

    @staticmethod
    def _already_stored(what: str) -> str:
        return f"{what} is already stored; it never changes"

    def _taken_over(self, fence: object = None, ours: object = None) -> FencedError:
        held = "" if fence is None else f" (fence {fence}, ours {ours})"
        return FencedError(
            f"another runner took over topology {self._topology_id!r}{held}; this runner "
            "must stop without writing"
        )

    def _require_fence(self) -> int:
        if self._fence is None:
            raise LostLeadershipError(
                f"this runner does not lead topology {self._topology_id!r}: call "
                "acquire_leadership first"
            )
        return self._fence

    def _not_leading(self) -> LostLeadershipError:
        return LostLeadershipError(
            f"this runner does not lead topology {self._topology_id!r}: it never acquired "
            "leadership or has closed the store"
        )

    @staticmethod
    def _not_open() -> CoordinatorError:
        return CoordinatorError("the state store is not open: call open(topology_id) first")


def _group_text(group: tuple[int, int] | None) -> str:
    return "none" if group is None else f"{group[0]}..{group[1]}"


def encode_group(first: int, last: int) -> str:
    return encode({"first": first, "last": last}, "a commit group")


def decode_group(data: str | bytes | None) -> tuple[int, int] | None:
    """A stored group (None: none stored, or cleared)."""
    if not data:
        return None
    value = decode(data)
    return None if value is None else (int(value["first"]), int(value["last"]))


def _encoded_partitions(txid: int, partitions: Mapping[int, JsonValue]) -> dict[int, str]:
    return {
        p: encode(m, f"the metadata of partition {p} of txid {txid}")
        for p, m in sorted(partitions.items())
    }


def checked_history(history: int) -> int:
    """A store's ``history`` setting, checked."""
    if isinstance(history, bool) or not isinstance(history, int) or history < 0:
        raise ConfigurationError(
            f"history must be a whole number of committed txids >= 0, got {history!r}"
        )
    return history
