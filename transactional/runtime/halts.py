"""The error a halted run raises to its caller, from the machine's ``Halt``: the
deposing error itself, a ``LostLeadershipError`` after too many re-elections, or the
txid that cannot succeed (``BatchConfigurationError``, ``PoisonBatchError``) with the
metadata it was stored with, so that the user can find its records."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from transactional.errors import BatchConfigurationError, LostLeadershipError, PoisonBatchError
from transactional.runtime.messages import Halt, HaltReason

log = logging.getLogger("transactional.runner")


def halt_error(
    halt: Halt,
    topology_id: str,
    reelections: int,
    max_reelections: int,
    stored_meta: Callable[[int], Any],
) -> BaseException:
    """``reelections``: how many times this run took the leadership back;
    ``stored_meta``: a txid's stored metadata (``SpoutDriver.stored_meta``)."""
    error = halt.error
    if halt.reason is HaltReason.DEPOSED:
        log.error(
            "deposed: another runner leads topology=%s; a write of this runner was "
            "refused and it stops without writing anything more: %s",
            topology_id,
            error,
        )
        return error
    if halt.reason is HaltReason.REELECTIONS:
        lost = LostLeadershipError(
            f"lost the leadership of topology {topology_id!r} {reelections} times in this "
            f"run (max_reelections={max_reelections}); last: {error}. Check the state "
            "store's health"
        )
        lost.__cause__ = error
        return lost
    assert halt.txid is not None and halt.phase is not None
    assert isinstance(error, Exception)
    meta = stored_meta(halt.txid)
    if halt.reason is HaltReason.CONFIGURATION:
        stop: BaseException = BatchConfigurationError(halt.txid, meta, error, halt.phase)
    else:
        stop = PoisonBatchError(halt.txid, meta, error, halt.failures)
    stop.__cause__ = error
    return stop
