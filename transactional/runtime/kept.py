"""What an attempt keeps in Spark until it is over, and its release.

An attempt's steps make local checkpoints: the materialised batch (``Engine.materialise``)
and any a bolt makes itself. Their blocks stay in Spark's memory store until released;
left to Spark, they stay until the driver's garbage collector lets the
``ContextCleaner`` see them gone, and a long run's store fills with txids long
committed. So ``Pipeline.run`` returns what the attempt made (``Kept``), the executor
holds it while the attempt may still be committed (``Releaser.keep``), and releases it
once the attempt is over: acknowledged, cancelled, superseded while processing, or
failed inside the pipeline (which releases its own). Releasing walks each frame's plan
(10 to 60 ms of py4j calls for a txid), so it runs on a thread of its own, off the
coordinator.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import partial
from typing import Any

from transactional.runtime.quiet import quietly
from transactional.spark.engine import Engine
from transactional.types import TransactionAttempt


@dataclass(frozen=True)
class Kept:
    """What an attempt keeps in Spark until it is over: the frames it made (the
    materialised batch, the bolts' streams, the committers' collected frames), whose
    local checkpoints made after ``since`` (``Engine.mark``) ``Engine.release`` drops."""

    frames: tuple[Any, ...] = ()
    since: int = 0

    def release(self, engine: Engine) -> int:
        return engine.release(self.frames, self.since)


class Releaser:
    """Holds each processed attempt's ``Kept`` until the attempt is over, and releases
    it on the ``txn-release`` thread (on the caller's once shut down). A failed release
    only leaves the blocks to Spark's own cleaner."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._held: dict[TransactionAttempt, Kept] = {}
        self._thread = ThreadPoolExecutor(1, "txn-release")

    def keep(self, attempt: TransactionAttempt, kept: Kept) -> None:
        """Hold ``kept`` until ``drop(attempt)``: the attempt may still be committed."""
        self._held[attempt] = kept

    def drop(self, attempt: TransactionAttempt) -> None:
        """``attempt`` is over (acknowledged or cancelled): release what it kept."""
        self.release(self._held.pop(attempt, Kept()))

    def release(self, kept: Kept) -> None:
        if not kept.frames:
            return
        try:
            self._thread.submit(self._release, kept)
        except RuntimeError:  # shut down: the run is over
            self._release(kept)

    def release_all(self) -> None:
        """Release what every attempt still held kept (the run is over)."""
        while self._held:
            self.release(self._held.popitem()[1])

    def settle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the releases asked for so far (one thread: they
        are done once a no-op submitted after them is); a release that hangs (a Connect
        server gone) is then left to finish on its own."""
        try:
            self._thread.submit(lambda: None).result(timeout=timeout_s)
        except (RuntimeError, FutureTimeout):  # shut down already, or still releasing
            return

    def shutdown(self, wait: bool) -> None:
        """``wait``: until every release asked for is done."""
        self._thread.shutdown(wait=wait)

    def _release(self, kept: Kept) -> None:
        quietly(partial(kept.release, self.engine), "release kept blocks")
