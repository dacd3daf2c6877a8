"""What every state store shares: the rules of fenced, versioned bookkeeping.

A store keeps, per topology id, ``currtx``, the metadata of each started txid (and of
its partitions) and the digest of its first emit. What may be written when is the same
on every backend, so it is decided here, once:

- metadata and digests are written once and never change;
- a txid below ``currtx`` is committed: it cannot start, be retracted or get a digest;
- ``advance`` moves ``currtx`` from exactly ``txid`` to ``txid + 1``;
- every write is refused unless this runner still holds the fence it took when it
  became leader (``FencedError``).

A backend supplies the atomic, fenced write on its server (``_write_start``,
``_write_advance``, ``_write_digest``, ``_write_retract``) and calls the matching
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

__all__ = ["FencedStore", "decode", "encode"]


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

    # -- the four writes: encode, require the fence, then the backend's atomic write --

    def start_transaction(
        self, txid: int, meta: JsonValue, partitions: Mapping[int, JsonValue]
    ) -> None:
        meta_text = encode(meta, f"the metadata of txid {txid}")
        parts = _encoded_partitions(txid, partitions)
        self._write_start(self._require_fence(), txid, meta_text, parts)

    def advance(self, txid: int, partitions: Mapping[int, JsonValue] | None = None) -> None:
        parts = _encoded_partitions(txid, partitions or {})
        self._write_advance(self._require_fence(), txid, parts)

    def record_digest(self, txid: int, digest: JsonValue) -> None:
        text = encode(digest, f"the digest of txid {txid}")
        self._write_digest(self._require_fence(), txid, text)

    def retract(self, txid: int) -> None:
        self._write_retract(self._require_fence(), txid)

    @abstractmethod
    def _write_start(self, fence: int, txid: int, meta: str, parts: dict[int, str]) -> None:
        """Store a new txid's metadata and its partitions' (``_check_start``)."""

    @abstractmethod
    def _write_advance(self, fence: int, txid: int, parts: dict[int, str]) -> None:
        """Store ``parts`` for ``txid``, move currtx past it, delete what is below it
        (``_check_advance``)."""

    @abstractmethod
    def _write_digest(self, fence: int, txid: int, digest: str) -> None:
        """Store the digest of a started, uncommitted txid (``_check_digest``)."""

    @abstractmethod
    def _write_retract(self, fence: int, txid: int) -> None:
        """Delete every started txid from ``txid`` up (``_check_retract``)."""

    # -- the rules ------------------------------------------------------------------

    def _check_start(self, txid: int, currtx: int, exists: bool = False) -> None:
        if txid < currtx:
            raise CoordinatorError(
                f"txid {txid} is already committed (currtx is {currtx}); it cannot start again"
            )
        if exists:
            raise CoordinatorError(self._already_stored(f"metadata of txid {txid}"))

    def _check_advance(self, txid: int, currtx: int) -> None:
        if currtx != txid:
            raise FencedError(
                f"cannot advance topology {self._topology_id!r} past txid {txid}: "
                f"currtx is {currtx}"
            )

    def _check_digest(self, txid: int, currtx: int, started: bool) -> None:
        if txid < currtx or not started:
            raise CoordinatorError(
                f"cannot record the digest of txid {txid}: it is not started and uncommitted "
                f"(currtx is {currtx})"
            )

    def _check_retract(self, txid: int, currtx: int) -> None:
        if txid < currtx:
            raise FencedError(
                f"cannot retract txid {txid} of topology {self._topology_id!r}: currtx is {currtx}"
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
                f"--topology-id, or {start_over} to start over"
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


def _encoded_partitions(txid: int, partitions: Mapping[int, JsonValue]) -> dict[int, str]:
    return {
        p: encode(m, f"the metadata of partition {p} of txid {txid}")
        for p, m in sorted(partitions.items())
    }
