"""Failures injected on purpose at named steps of the protocol: exceptions for tests
and ``--fail-rate``, and whole-process SIGKILLs for ``--crash-at``.

A crash must look like a machine losing power: no ``finally``, no ``atexit``, no
shutdown hook of the Spark JVM may run, or the crash would tidy up exactly the state
that recovery has to cope with. So ``KillAt`` sends SIGKILL to the driver *and* its
children (the JVM, and the JVM's Python workers), not only to itself.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
from collections.abc import Callable, Iterable
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from transactional.errors import ConfigurationError, InjectedFault
from transactional.types import TransactionAttempt


class FaultPoint(StrEnum):
    """The protocol steps where a fault can be injected, in the order an attempt meets them.

    Each is checked at most once per attempt. The values are part of the command line
    (``--crash-at after_sink_write:3``) and of recorded campaigns: never rename one.
    """

    AFTER_STORE_META = "after_store_meta"  # metadata stored, nothing emitted yet
    EMIT = "emit"  # building the batch
    PROCESS = "process"  # batch processed, results not yet prepared for commit
    BEFORE_SINK_WRITE = "before_sink_write"  # committing, before the first committer writes
    BETWEEN_COMMITTERS = "between_committers"  # the first committer wrote, the second not yet
    AFTER_SINK_WRITE = "after_sink_write"  # every committer wrote, the store has not advanced
    AFTER_ADVANCE = "after_advance"  # the store advanced, cleanup and ack not yet done


#: The steps ``--fail-rate`` draws from.
RANDOM_POINTS = (
    FaultPoint.EMIT,
    FaultPoint.PROCESS,
    FaultPoint.BEFORE_SINK_WRITE,
    FaultPoint.AFTER_SINK_WRITE,
)


class FaultInjector(Protocol):
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


#: First word of the line ``KillAt`` writes to stderr just before it kills, so whoever
#: watches the process can tell a planned crash from any other death.
CRASH_MARKER = "crash_at"


def parse_crash_at(spec: str) -> list[tuple[FaultPoint, int]]:
    """``"POINT:TXID[,POINT:TXID...]"`` -> targets, e.g. ``"emit:2,after_advance:4"``."""
    names = ", ".join(p.value for p in FaultPoint)
    targets: list[tuple[FaultPoint, int]] = []
    for item in (part.strip() for part in spec.split(",")):
        point, sep, txid = item.partition(":")
        try:
            target = (FaultPoint(point.strip().lower().replace("-", "_")), int(txid))
        except ValueError:
            target = None
        if not sep or target is None or target[1] < 1:
            raise ConfigurationError(
                f"crash point {item!r} in {spec!r}: give POINT:TXID with POINT one of "
                f"{names} and TXID an integer >= 1, e.g. after_sink_write:3"
            )
        targets.append(target)
    return targets


def _descendants(root: int) -> list[int]:
    """Every process below ``root``, from ``/proc`` (empty where there is none)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        # The command name, in parentheses, may itself hold spaces and ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_process_tree() -> None:
    """SIGKILL this process and everything it started, as a power cut would.

    The children go first and by pid, because the group alone is not enough: PySpark's
    worker daemon moves itself into a process group of its own, and a JVM left without
    its driver would run its shutdown hooks (or, before it notices, go on with a
    commit). Then the whole group when this process leads one, else this process.
    """
    pid = os.getpid()
    for child in _descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
    if os.getpgrp() == pid:
        os.killpg(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


class KillAt:
    """Kill the whole process the first time it reaches ``point`` of ``txid``, for each
    ``(point, txid)`` target: a crash at a deterministic step, set from outside the
    process (``--crash-at``, ``TRANSACTIONAL_CRASH_AT``).

    The attempt number is not part of a target: it restarts from 1 in every process,
    and "kill it when txid 3 gets there" is what a crash test means. A target whose
    txid this process never reaches (already committed by an earlier run) never fires;
    ``pending`` lists those, so a caller can say so instead of silently running clean.
    ``kill`` is replaceable so the plan itself can be tested without dying.
    """

    def __init__(
        self,
        targets: Iterable[tuple[FaultPoint, int]],
        kill: Callable[[], object] = kill_process_tree,
    ) -> None:
        self.targets = frozenset(targets)
        self.kill = kill
        self.fired: list[tuple[FaultPoint, int]] = []

    @classmethod
    def parse(cls, spec: str) -> KillAt:
        return cls(parse_crash_at(spec))

    @property
    def pending(self) -> list[tuple[FaultPoint, int]]:
        return sorted(
            self.targets - set(self.fired), key=lambda t: (t[1], list(FaultPoint).index(t[0]))
        )

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        if (point, attempt.txid) not in self.targets or (point, attempt.txid) in self.fired:
            return
        self.fired.append((point, attempt.txid))
        line = (
            f"{CRASH_MARKER} point={point.value} txid={attempt.txid} "
            f"attempt={attempt.attempt_id} number={number} pid={os.getpid()}\n"
        )
        # Unbuffered, straight to the descriptor: it must be out before the kill.
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no stderr: crash anyway
            os.write(sys.stderr.fileno(), line.encode())
        self.kill()


class CombinedFaults:
    """Several plans as one: each is checked in turn at every point."""

    def __init__(self, *plans: FaultInjector) -> None:
        self.plans = plans

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        for plan in self.plans:
            plan.check(point, attempt, number)


def combine(*plans: FaultInjector | None) -> FaultInjector | None:
    """The given plans as one (None when there is none)."""
    present = [p for p in plans if p is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else CombinedFaults(*present)
