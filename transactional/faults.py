"""Failures injected on purpose at named steps of the protocol, for tests and ``--fail-rate``."""

from __future__ import annotations

import random
from enum import StrEnum
from typing import Protocol

from transactional.errors import InjectedFault
from transactional.types import TransactionAttempt


class FaultPoint(StrEnum):
    """The protocol steps where a fault can be injected, in the order an attempt meets them."""

    AFTER_STORE_META = "after_store_meta"  # metadata stored, nothing emitted yet
    EMIT = "emit"  # building the batch
    PROCESS = "process"  # batch processed, results not yet prepared for commit
    BEFORE_SINK_WRITE = "before_sink_write"  # committing, before the first committer writes
    BETWEEN_COMMITTERS = "between_committers"  # after one committer wrote, before the next
    AFTER_SINK_WRITE = "after_sink_write"  # every committer wrote, the store has not advanced
    AFTER_ADVANCE = "after_advance"  # the store advanced, cleanup and ack not yet done


#: The steps ``--fail-rate`` draws from.
RANDOM_POINTS = (
    FaultPoint.EMIT,
    FaultPoint.PROCESS,
    FaultPoint.BEFORE_SINK_WRITE,
    FaultPoint.AFTER_SINK_WRITE,
)


class FaultPlan(Protocol):
    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        """Raise (or kill the process) if a fault is planned at ``point`` for the
        ``number``-th attempt (1-based, counted by this runner) of ``attempt.txid``."""


class RandomFaults:
    """Each attempt fails with probability ``rate`` at one step drawn from ``points``.

    The draw depends only on (seed, txid, attempt number), so a rerun with the same
    seed meets the same faults: a failing campaign can be replayed exactly.
    """

    def __init__(self, rate: float, seed: int = 0, points: tuple[FaultPoint, ...] = RANDOM_POINTS):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"fail rate must be in [0, 1), got {rate}")
        self.rate = rate
        self.seed = seed
        self.points = points
        self.injected: dict[FaultPoint, int] = dict.fromkeys(FaultPoint, 0)

    def planned(self, txid: int, number: int) -> FaultPoint | None:
        rng = random.Random(f"{self.seed}:{txid}:{number}")
        if rng.random() >= self.rate:
            return None
        return rng.choice(self.points)

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        if self.planned(attempt.txid, number) is point:
            self.injected[point] += 1
            raise InjectedFault(
                f"injected fault at {point.value} of txid {attempt.txid} attempt {number}"
            )
