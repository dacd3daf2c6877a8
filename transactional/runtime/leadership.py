"""The one place that decides leadership: a ``LeaderSession`` acquires it on the store,
owns its fence token, hands the token to the committers, checks it before a commit, and
takes it back after a loss.

A runner loses leadership when its store session ends (a ZooKeeper session that
expired while the process was paused or the network was cut) or when the store itself
goes away for a while (a ZooKeeper restart). Neither means another runner leads: the
runner may take leadership again on the same store, as long as nobody else holds it by
then. What it must never do is carry on with anything it started before the loss, since
another runner may have led in between; so the runner drops all of that and reloads the
state from the store (docs/design.md section 7). A loss to another runner (``FencedError``,
or the leadership held by someone else when asked again) ends the run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transactional.committer import CommitterContext
from transactional.errors import CoordinatorError, LostLeadershipError
from transactional.store import StateStore, StoredState
from transactional.types import Guarantee

log = logging.getLogger("transactional.runner")

#: How long one attempt waits for the leadership: a runner that finds another one
#: holding it after its own loss was deposed, and stops rather than queue up behind it.
PROBE_S = 1.0
#: Pause between attempts while the store cannot be reached.
PAUSE_S = 0.2


@dataclass(eq=False)
class LeaderSession:
    """The leadership of one topology id on one open store."""

    store: StateStore
    topology_id: str
    timeout_s: float | None
    stopping: threading.Event
    clock: Callable[[], float] = time.monotonic
    _contexts: list[CommitterContext] = field(default_factory=list, init=False)

    @property
    def token(self) -> int | None:
        """The fence token of the current leadership (None: the store has none)."""
        return self.store.fence_token()

    def acquire(self) -> StoredState:
        """Wait for the leadership (a standby waits here), then read the state."""
        log.info("acquiring leadership topology=%s (a standby waits here)", self.topology_id)
        self.store.acquire_leadership(self.timeout_s)
        return self.store.read_state()

    def check(self) -> None:
        """Raise ``LostLeadershipError`` unless this runner still provably leads; safe
        from the commit thread."""
        self.store.check_leadership()

    def context(
        self,
        spark: Any,
        name: str,
        guarantee: Guarantee = Guarantee.EXACTLY_ONCE,
        settled: Callable[[], int] | None = None,
    ) -> CommitterContext:
        """A committer's context: it carries this session's token, raised in place when
        the leadership is taken back, this session's check, the run's guarantee and,
        when commits overlap, where the store stands."""
        context = CommitterContext(
            spark, self.topology_id, name, self.token, self.check, guarantee, settled
        )
        self._contexts.append(context)
        return context

    def reacquire(self) -> StoredState | None:
        """Take the leadership again on the open store and read the state as it is now;
        None if the runner was asked to stop meanwhile. Raises ``LostLeadershipError`` if
        another runner leads, or if the store stayed unreachable for ``timeout_s``."""
        deadline = None if self.timeout_s is None else self.clock() + self.timeout_s
        tries = 0
        while not self.stopping.is_set():
            tries += 1
            try:
                self.store.acquire_leadership(PROBE_S)
                state = self.store.read_state()
            except LostLeadershipError as exc:
                raise LostLeadershipError(
                    f"another runner leads topology {self.topology_id!r} now: it took over "
                    f"while this runner was cut off from the store ({exc}). This runner "
                    "stops; start it again to make it a standby"
                ) from exc
            except CoordinatorError as exc:
                if deadline is not None and self.clock() >= deadline:
                    raise LostLeadershipError(
                        f"could not get the leadership of topology {self.topology_id!r} back "
                        f"within {self.timeout_s}s ({type(exc).__name__}: {exc}); check that "
                        "the state store is up, then start the runner again: it resumes from "
                        "the store"
                    ) from exc
                if tries == 1 or tries % 25 == 0:
                    log.warning(
                        "store unreachable, still trying to lead topology=%s tries=%d error=%s",
                        self.topology_id,
                        tries,
                        exc,
                    )
                self.stopping.wait(PAUSE_S)
                continue
            for context in self._contexts:
                context.fence_token = self.token
            return state
        return None
