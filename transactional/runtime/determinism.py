"""The determinism check of transactional and partitioned spouts.

The first emit of a txid stores a record count and an order-independent checksum per
partition (``StateStore.record_digest``; ``SparkEngine.materialise`` computes them in
the job that reads the batch). A replay must hold the same, or the sinks would mix two
versions of one batch: one that differs stops the run with
``NondeterministicSpoutError`` before any sink sees it. Opaque spouts are exempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from transactional.engine import Digest
from transactional.errors import NondeterministicSpoutError

if TYPE_CHECKING:
    from transactional.runtime.drivers import SpoutDriver


def first_emit_check(driver: SpoutDriver, txid: int, digests: Mapping[int, Digest]) -> None:
    """Record ``digests`` as the first emit of ``txid``, or compare them with it."""
    now = {str(p): [n, h] for p, (n, h) in sorted(digests.items())}
    first = driver.first_digests.get(txid)
    if first is None:
        driver.store.record_digest(txid, now)
        driver.first_digests[txid] = now
        return
    changed = sorted(int(p) for p in set(first) | set(now) if first.get(p) != now.get(p))
    if changed:
        raise NondeterministicSpoutError(_message(driver, txid, first, now, changed))


def _message(
    driver: SpoutDriver,
    txid: int,
    first: Mapping[str, Any],
    now: Mapping[str, Any],
    changed: list[int],
) -> str:
    lines = []
    for p in changed:
        before, after = first.get(str(p), [0, "0"]), now.get(str(p), [0, "0"])
        lines.append(
            f"{driver.where(p)}first emit {before[0]} records (checksum {before[1]}), this "
            f"replay {after[0]} records (checksum {after[1]})"
        )
    return (
        f"{driver.name} is not deterministic: the replay of txid {txid} (metadata "
        f"{driver.stored_meta(txid)!r}) differs from its first emit; "
        + "; ".join(lines)
        + ". Nothing of this replay reached a sink. Make emit_* return the same records "
        "for the same metadata, or, if the source cannot, make it an "
        "OpaquePartitionedTransactionalSpout with opaque-mode committers. (The check can "
        "be switched off with RunnerConfig(check_determinism=False).)"
    )
