"""``at_most_once`` after a start or a leadership taken back: the txids the store holds
as started and not committed are never replayed. Each was consumed when its metadata
was stored (the source's position moved past it before it was processed), so the store
moves past each instead, one fenced write a txid, in order. The sinks say which of them
they hold (``Committer.committed_txid``: a crash after the sink write and before the
store's advance): those are committed, and said so at INFO; the others are dropped, each
reported at WARNING with its batch's metadata, and counted (``Opened.dropped``).

A committer that cannot say what its sink holds (``committed_txid`` None) makes every
such txid count as dropped, though its sink may hold some: the run says so at start.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from transactional.runtime.drivers import SpoutDriver
from transactional.runtime.messages import Opened
from transactional.store import StoredState
from transactional.topology import CommitterNode
from transactional.types import Guarantee

log = logging.getLogger("transactional.runner")


def opened(
    driver: SpoutDriver,
    committers: Sequence[CommitterNode],
    state: StoredState,
    stored: frozenset[int],
    guarantee: Guarantee,
) -> Opened:
    """The ``Opened`` event for ``state`` (whose stored txids the driver mirrors):
    as read under ``exactly_once`` and ``at_least_once``; under ``at_most_once``, once the
    store has moved past every started txid."""
    pending = sorted(t for t in stored if t >= state.currtx)
    if guarantee is not Guarantee.AT_MOST_ONCE or not pending:
        return Opened(state.currtx, stored, state.group)
    held = _held(committers)
    dropped = []
    for txid in pending:
        meta = driver.stored_meta(txid)
        public = driver.skip(txid)
        if held is not None and txid <= held:
            log.info("txid in every sink before the restart, store moved past it txid=%d", txid)
        else:
            dropped.append(txid)
            log.warning(
                "txid dropped guarantee=at_most_once txid=%d: it was in flight when the last "
                "run stopped, and is never replayed; its batch: %s",
                txid,
                meta,
            )
        try:
            driver.acknowledge_skipped(txid, public)
        except Exception as exc:  # the store moved past it; hooks are best-effort
            log.warning("post-drop hook failed txid=%d error=%r", txid, exc)
    return Opened(pending[-1] + 1, frozenset(), None, tuple(dropped))


def _held(committers: Sequence[CommitterNode]) -> int | None:
    """The last txid every sink holds; None if a sink holds none or cannot say."""
    held: list[int | None] = []
    for node in committers:
        try:
            held.append(node.committer.committed_txid())
        except Exception as exc:  # unreadable: every pending txid counts as dropped
            log.warning("sink not readable committer=%s error=%r", node.name, exc)
            held.append(None)
    known: list[Any] = [h for h in held if h is not None]
    return min(known) if known and len(known) == len(held) else None
