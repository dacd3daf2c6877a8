"""The determinism check of transactional and partitioned spouts.

The first emit of a txid stores a record count and an order-independent checksum per
partition (``StateStore.record_digest``; ``SparkEngine.materialise`` computes them in
the job that reads the batch). A replay must hold the same, or the sinks would mix two
versions of one batch: one that differs stops the run with
``NondeterministicSpoutError`` before any sink sees it. Opaque spouts are exempt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from transactional.errors import NondeterministicSpoutError
from transactional.spark.engine import Digest
from transactional.store import StateStore


class FirstEmits:
    """The digests of the first emit of each uncommitted txid, as the store holds them;
    a spout driver (``drivers.SpoutDriver``) owns one and tells it what the store
    forgot."""

    def __init__(self, store: StateStore, spout: str, where: Callable[[int], str]) -> None:
        self._store, self._spout, self._where = store, spout, where
        self._first: dict[int, Any] = {}

    def load(self, stored: Mapping[int, Any]) -> None:
        """The digests the store holds (on open, and after leadership is taken back)."""
        self._first = dict(stored)

    def check(self, txid: int, digests: Mapping[int, Digest], meta: Any) -> None:
        """Record ``digests`` as the first emit of ``txid``, or compare them with it;
        ``meta``: the txid's stored metadata, for the message."""
        now = {str(p): [n, h] for p, (n, h) in sorted(digests.items())}
        first = self._first.get(txid)
        if first is None:
            self._store.record_digest(txid, now)
            self._first[txid] = now
            return
        changed = sorted(int(p) for p in set(first) | set(now) if first.get(p) != now.get(p))
        if changed:
            raise NondeterministicSpoutError(self._message(txid, meta, first, now, changed))

    def forget_from(self, txid: int) -> None:
        """``txid`` and every txid above it were retracted."""
        for gone in [t for t in self._first if t >= txid]:
            del self._first[gone]

    def forget_through(self, txid: int) -> None:
        """The store moved past ``txid``: nothing up to it is replayed again."""
        for done in [t for t in self._first if t <= txid]:
            del self._first[done]

    def _message(
        self,
        txid: int,
        meta: Any,
        first: Mapping[str, Any],
        now: Mapping[str, Any],
        changed: list[int],
    ) -> str:
        lines = []
        for p in changed:
            before, after = first.get(str(p), [0, "0"]), now.get(str(p), [0, "0"])
            lines.append(
                f"{self._where(p)}first emit {before[0]} records (checksum {before[1]}), this "
                f"replay {after[0]} records (checksum {after[1]})"
            )
        return (
            f"{self._spout} is not deterministic: the replay of txid {txid} (metadata "
            f"{meta!r}) differs from its first emit; "
            + "; ".join(lines)
            + ". Nothing of this replay reached a sink. Make emit_* return the same records "
            "for the same metadata, or, if the source cannot, make it an "
            "OpaquePartitionedTransactionalSpout with opaque-mode committers. (The check can "
            "be switched off with RunnerConfig(check_determinism=False).)"
        )
