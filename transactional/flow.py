"""Adaptive batch size: flow control after TCP's congestion window.

Each committed txid reports its latency: from its metadata stored to its commit done,
through every attempt, less the time it sat processed waiting for earlier txids to
commit (a smaller batch cannot shorten that wait: with ``max_pending`` K it is up to
K-1 whole commits, and shrinking for it would spiral down to the minimum size on a
sink whose commits have a fixed cost, such as Delta's MERGE).

As TCP does, it starts in slow start: the size doubles once per round, so it finds a
large enough size in a few txids instead of hundreds of steps. A round is a txid run
at the current size: with ``max_pending`` K, the K txids decided before the first
commit were all decided at the first size, and doubling at each of their commits would
overshoot by 2^K before any txid had tried the new size. Slow start ends in one of
two ways:

- a txid over the latency target (or a failure) halves the size, as TCP does;
- a doubling that raised a txid's records per second by less than a quarter keeps the
  size (BBR's exit from its start-up): the cores or the sink are saturated, and larger
  batches would add latency and memory, not throughput.

From then on, while latencies stay under the target the batch grows by a fixed step
(additive increase); a latency over the target shrinks it by a step (the "slow"
state); a failure or a timeout halves it (multiplicative decrease). It never leaves
``[minimum, maximum]``. The runner feeds it; spouts that opt in read ``current`` when
they size a new txid.
"""

from __future__ import annotations

import threading
from collections import deque

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: A doubling must raise a txid's records per second by this factor to go on doubling.
PLATEAU = 1.25


class BatchSizeConfig(BaseModel):
    """``--batch-size auto``: where to start, how far to go, and the latency to keep."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial: int = Field(default=1_000, ge=1)
    minimum: int = Field(default=100, ge=1)
    maximum: int = Field(default=200_000, ge=1)
    #: Records added per txid that met the target; default: ``initial``.
    step: int | None = Field(default=None, ge=1)
    #: End-to-end latency of one txid to stay under, in seconds.
    target_latency_s: float = Field(default=10.0, gt=0)
    #: Factor applied on a failure or a timeout (and at the end of slow start).
    decrease: float = Field(default=0.5, gt=0, lt=1)
    #: Double the size after each commit under the target until the first one over it
    #: or a failure (TCP's slow start); False: additive increase from the start.
    slow_start: bool = True

    @model_validator(mode="after")
    def _ordered(self) -> BatchSizeConfig:
        if not self.minimum <= self.initial <= self.maximum:
            raise ValueError(
                f"batch size bounds must satisfy minimum <= initial <= maximum, got "
                f"{self.minimum} <= {self.initial} <= {self.maximum}"
            )
        return self


#: How many per-txid records are kept: the controller's latest decisions (``history``)
#: and the runner's latest step timings (``RunStats.timings``). A topology runs for
#: months: one entry per txid forever would grow without bound.
HISTORY = 1024


class AdaptiveBatchSize:
    """The controller; thread-safe, since spouts may read it while the runner updates it.
    ``history`` holds its latest decisions, oldest first: (kind, size after) with kind
    ``start`` (doubled in slow start), ``hold`` (in slow start, a txid decided at an
    earlier size), ``plateau`` (slow start ended, size kept), ``grow``, ``slow`` or
    ``fail``."""

    def __init__(self, config: BatchSizeConfig | None = None) -> None:
        self.config = config or BatchSizeConfig()
        self._current = self.config.initial
        self._starting = self.config.slow_start
        self._rate: float | None = None  # records/s of the last round's txid
        self._lock = threading.Lock()
        self.history: deque[tuple[str, int]] = deque(maxlen=HISTORY)

    @property
    def current(self) -> int:
        with self._lock:
            return self._current

    @property
    def step(self) -> int:
        return self.config.step or self.config.initial

    def on_commit(
        self, latency_s: float, records: int | None = None, size: int | None = None
    ) -> int:
        """A txid committed ``latency_s`` after it started; ``records``: how many it
        held; ``size``: the size it was decided at (None: the current one)."""
        cfg = self.config
        with self._lock:
            if latency_s <= cfg.target_latency_s and self._starting:
                kind = self._start_round(latency_s, records, size)
            elif latency_s <= cfg.target_latency_s:
                kind = "grow"
                self._current = min(cfg.maximum, self._current + self.step)
            elif self._starting:
                kind, self._starting = "slow", False
                self._current = max(cfg.minimum, int(self._current * cfg.decrease))
            else:
                kind = "slow"
                self._current = max(cfg.minimum, self._current - self.step)
            self.history.append((kind, self._current))
            return self._current

    def _start_round(self, latency_s: float, records: int | None, size: int | None) -> str:
        """Slow start, under the target: double once per round, unless the last doubling
        no longer paid (``PLATEAU``)."""
        if size is not None and size != self._current:
            return "hold"
        rate = records / latency_s if records and latency_s > 0 else None
        if rate is not None and self._rate is not None and rate < self._rate * PLATEAU:
            self._starting = False
            return "plateau"
        self._rate = rate if rate is not None else self._rate
        self._current = min(self.config.maximum, self._current * 2)
        return "start"

    def on_failure(self) -> int:
        cfg = self.config
        with self._lock:
            self._starting = False
            self._current = max(cfg.minimum, int(self._current * cfg.decrease))
            self.history.append(("fail", self._current))
            return self._current
