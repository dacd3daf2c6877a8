"""Getting leadership back after losing it without another runner taking it.

A runner loses leadership when its store session ends (a ZooKeeper session that
expired while the process was paused or the network was cut) or when the store itself
goes away for a while (a ZooKeeper restart). Neither means another runner leads: the
runner may take leadership again on the same store, as long as nobody else holds it by
then. What it must never do is carry on with anything it started before the loss, since
another runner may have led in between; so the runner drops all of that and reloads the
state from the store after this returns (DESIGN.md section 7).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from transactional.errors import CoordinatorError, LostLeadershipError
from transactional.store import StateStore, StoredState

log = logging.getLogger("transactional.runner")

#: How long one attempt waits for the leadership: a runner that finds another one
#: holding it after its own loss was deposed, and stops rather than queue up behind it.
PROBE_S = 1.0
#: Pause between attempts while the store cannot be reached.
PAUSE_S = 0.2


def reacquire(
    store: StateStore,
    topology_id: str,
    timeout_s: float | None,
    stopping: threading.Event,
    clock: Callable[[], float] = time.monotonic,
) -> StoredState | None:
    """Take leadership of ``topology_id`` again on the open ``store`` and read the state
    as it is now; None if the runner was asked to stop meanwhile.

    Raises ``LostLeadershipError`` if another runner leads (it took over while this one
    was cut off), or if the store stayed unreachable for ``timeout_s`` (None: no limit).
    """
    deadline = None if timeout_s is None else clock() + timeout_s
    tries = 0
    while not stopping.is_set():
        tries += 1
        try:
            store.acquire_leadership(PROBE_S)
            return store.read_state()
        except LostLeadershipError as exc:
            raise LostLeadershipError(
                f"another runner leads topology {topology_id!r} now: it took over while "
                f"this runner was cut off from the store ({exc}). This runner stops; start "
                "it again to make it a standby"
            ) from exc
        except CoordinatorError as exc:
            if deadline is not None and clock() >= deadline:
                raise LostLeadershipError(
                    f"could not get the leadership of topology {topology_id!r} back within "
                    f"{timeout_s}s ({type(exc).__name__}: {exc}); check that the state "
                    "store is up, then start the runner again: it resumes from the store"
                ) from exc
            if tries == 1 or tries % 25 == 0:
                log.warning(
                    "store unreachable, still trying to lead topology=%s tries=%d error=%s",
                    topology_id,
                    tries,
                    exc,
                )
            stopping.wait(PAUSE_S)
    return None
