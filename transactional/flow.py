"""Adaptive batch size: flow control after TCP's congestion window.

Each committed txid reports its latency: from its metadata stored to its commit done,
through every attempt, less the time it sat processed waiting for earlier txids to
commit (a smaller batch cannot shorten that wait: with ``max_pending`` K it is up to
K-1 whole commits, and shrinking for it would spiral down to the minimum size on a
sink whose commits have a fixed cost, such as Delta's MERGE).

Throughput is measured as BBR measures bandwidth: a round is the txids decided between
two sizing decisions, and its delivery rate is the records they committed per second,
from the commit before the round's first to its last. That counts what a txid's own
latency hides: the time commits spend queued behind each other, and the cores the
other txids in flight take.

As TCP does, it starts in slow start: the size doubles once per round, so it finds a
large enough size in a few rounds instead of hundreds of steps (with ``max_pending``
K, the K txids decided before the first commit are one round: doubling at each of
their commits would overshoot by 2^K before any txid had tried the new size). Slow
start ends in one of two ways:

- a txid over the latency target (or a failure) halves the size, as TCP does;
- a doubling that raised the delivery rate by less than a quarter (BBR's exit from its
  start-up): the cores or the sink are saturated, and larger batches would add latency
  and memory, not throughput. The size goes to the cruise size: the smallest whose
  round delivered within ``TOLERANCE`` of the best of the last ``RATE_WINDOW`` rounds.

From then on each round either probes a step above the cruise size or returns to it,
so a larger size is kept only when it delivered more (BBR's probing); a txid over the
target shrinks it by a step (the "slow" state, once per round); a failure or a timeout
halves it (multiplicative decrease). It never leaves ``[minimum, maximum]``. The runner
feeds it; spouts that opt in read ``current`` when they size a new txid.
"""

from __future__ import annotations

import threading
from collections import deque

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: A doubling must raise the delivery rate by this factor to go on doubling.
PLATEAU = 1.25
#: After slow start, a round delivering less than the best recent one by more than this
#: fraction sends the size back to the best one's.
TOLERANCE = 0.05
#: How many complete rounds the best delivery rate is taken over (BBR's max filter).
RATE_WINDOW = 8


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
    ``start`` (doubled in slow start), ``hold`` (a txid of an earlier round: nothing
    decided), ``plateau`` (slow start ended at the best round's size), ``grow``,
    ``back`` (a step that did not pay, undone), ``slow`` or ``fail``.

    A round is the txids decided between two decisions (``round`` tags them when they
    start); it is measured from the last commit before its first to its last commit,
    so its records per second are the pipeline's delivery rate at its size, queueing
    and commits included. It ends at the first commit of a later round, which is when
    the controller decides again."""

    def __init__(self, config: BatchSizeConfig | None = None) -> None:
        self.config = config or BatchSizeConfig()
        self._current = self.config.initial
        self._starting = self.config.slow_start
        self._round = 0  # the round new txids belong to
        self._sizes = {0: self._current}  # round -> its size, for rounds not yet measured
        self._slowed = 0  # rounds before this one were answered by a "slow" decision
        self._measuring: _Round | None = None
        self._rates: deque[tuple[float, int]] = deque(maxlen=RATE_WINDOW)  # (rate, size)
        self._lock = threading.Lock()
        self.history: deque[tuple[str, int]] = deque(maxlen=HISTORY)

    @property
    def current(self) -> int:
        with self._lock:
            return self._current

    @property
    def round(self) -> int:
        with self._lock:
            return self._round

    @property
    def step(self) -> int:
        return self.config.step or self.config.initial

    def rates(self) -> list[tuple[float, int]]:
        """The latest complete rounds' (records per second, size), oldest first."""
        with self._lock:
            return list(self._rates)

    def on_commit(
        self,
        latency_s: float,
        records: int | None = None,
        round: int | None = None,
        at: float | None = None,
    ) -> int:
        """A txid committed ``latency_s`` after it started, at time ``at`` (monotonic);
        ``records``: how many it held; ``round``: the round it started in (None: the
        current one, and every commit a round of its own)."""
        cfg = self.config
        with self._lock:
            measured = self._measure(latency_s, records, round, at)
            if latency_s > cfg.target_latency_s and (round is None or round >= self._slowed):
                kind = "slow"  # once per round: its later txids were already answered
                self._forget_from(self._current)
                if self._starting:
                    self._starting = False
                    self._resize(int(self._current * cfg.decrease))
                else:
                    self._resize(self._current - self.step)
                self._slowed = self._round
            elif round is not None and round != self._round:
                kind = "hold"  # decided before the last decision: it says nothing new
            elif self._starting:
                kind = self._start_round(measured)
            else:
                kind = self._probe(measured)
            self.history.append((kind, self._current))
            return self._current

    def _resize(self, size: int) -> None:
        """A decision: the next txids form a new round."""
        self._current = max(self.config.minimum, min(self.config.maximum, size))
        self._round += 1
        self._sizes[self._round] = self._current

    def _measure(
        self, latency_s: float, records: int | None, round: int | None, at: float | None
    ) -> bool:
        """Account the commit to its round; True if it completed the round before it."""
        if at is None or records is None:
            return False
        meas = self._measuring
        if meas is not None and round is not None and round == meas.round:
            meas.end, meas.records = at, meas.records + records
            return False
        if meas is not None and meas.end > meas.begin:
            self._rates.append((meas.records / (meas.end - meas.begin), meas.size))
        # The first round is timed from its first txid's start.
        begin = meas.end if meas is not None else at - latency_s
        size = self._current if round is None else self._sizes.get(round, self._current)
        for old in [r for r in self._sizes if round is not None and r < round]:
            del self._sizes[old]
        self._measuring = _Round(round, size, begin, at, records)
        return meas is not None

    def _forget_from(self, size: int) -> None:
        """Rounds at ``size`` or more went over the latency target: not a size to return to."""
        kept = [(rate, s) for rate, s in self._rates if s < size]
        self._rates.clear()
        self._rates.extend(kept)

    def _cruise_size(self) -> int:
        """The smallest size whose round delivered within ``TOLERANCE`` of the best
        recent round: as fast, with less latency and memory."""
        best = max(rate for rate, _ in self._rates)
        return min(size for rate, size in self._rates if rate >= best * (1 - TOLERANCE))

    def _start_round(self, measured: bool) -> str:
        """Slow start, under the target: double once per round, unless the last doubling
        no longer raised the delivery rate by a quarter (``PLATEAU``): then the size
        goes to the cruise size (``_cruise_size``)."""
        rates = self._rates
        if measured and len(rates) >= 2 and rates[-1][0] < rates[-2][0] * PLATEAU:
            self._starting = False
            self._resize(self._cruise_size())
            return "plateau"
        self._resize(self._current * 2)
        return "start"

    def _probe(self, measured: bool) -> str:
        """After slow start, at each round: a round at the cruise size is followed by one
        a step above it (a probe); the probe becomes the cruise size only if it delivered
        more than the tolerance better, else the size goes back."""
        if measured and self._rates:
            cruise = self._cruise_size()
            if cruise != self._current:
                kind = "back" if cruise < self._current else "grow"
                self._resize(cruise)
                return kind
        self._resize(self._current + self.step)
        return "grow"

    def on_failure(self) -> int:
        cfg = self.config
        with self._lock:
            self._starting = False
            self._resize(int(self._current * cfg.decrease))
            self.history.append(("fail", self._current))
            return self._current


class _Round:
    """Commits of one round so far: records, and the span they were delivered in."""

    __slots__ = ("begin", "end", "records", "round", "size")

    def __init__(self, round: int | None, size: int, begin: float, end: float, records: int):
        self.round, self.size = round, size
        self.begin, self.end, self.records = begin, end, records
