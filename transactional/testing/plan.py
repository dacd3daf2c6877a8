"""Fault plans written in plain terms: "txid 3, first attempt, after the sink write",
"every attempt of txid 7 during emit", "kill the process when txid 5 commits".

A plan is a list of rules, built in code::

    FaultPlan().fail(FaultPoint.AFTER_SINK_WRITE, txid=3, attempts=[1])
               .fail(FaultPoint.EMIT, txid=7, attempts=None)
               .crash(FaultPoint.BEFORE_SINK_WRITE, txid=5)

or parsed from a string, for plans given from outside a test (a flag, a variable)::

    FaultPlan.parse("after_sink_write:3:1, emit:7:*, crash@before_sink_write:5")

Grammar (whitespace around tokens is ignored; point names are case-insensitive and
may use ``-`` for ``_``)::

    plan     := "" | rule ("," rule)*
    rule     := fail | crash
    fail     := POINT ":" TXID [":" attempts]      attempts default to 1
    crash    := "crash@" POINT ":" TXID [":" N]    attempt number N, default 1
    attempts := "*" | span ("+" span)*             "*": every attempt
    span     := N | N "-" N                        "2-4" is 2, 3 and 4
    POINT    := after_store_meta | emit | process | before_sink_write
              | between_committers | after_sink_write | after_advance
    TXID, N  := an integer >= 1

``str(plan)`` writes a plan back in this grammar, so ``FaultPlan.parse(str(plan)) ==
plan``. Attempt numbers are the runner's: the n-th attempt of a txid *in one run*,
counted again from 1 by a restarted run, so a ``fail`` rule fires again in every run
that reaches it. A ``crash`` rule fires once per plan: a process is killed once.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from transactional.errors import ConfigurationError, InjectedFault
from transactional.faults import FaultPoint
from transactional.types import TransactionAttempt

__all__ = ["FaultPlan", "FaultPlanError", "FaultRule", "SimulatedCrash"]

_CRASH = "crash@"
_POINTS = ", ".join(p.value for p in FaultPoint)
GRAMMAR = (
    "rules are POINT:TXID[:ATTEMPTS] (ATTEMPTS: '*', or numbers and ranges joined by '+', "
    "e.g. 1+3-4; default 1) or crash@POINT:TXID[:N], separated by commas; "
    f"POINT is one of {_POINTS}"
)


class FaultPlanError(ConfigurationError):
    """A fault plan that cannot be understood; the message names the rule and the fix."""


class SimulatedCrash(BaseException):
    """The process "died" at a planned step of the protocol.

    A ``BaseException`` and not an ``Exception``, so that neither the runner's retries
    nor a user's ``except Exception`` take it for an ordinary failure: the run ends at
    once, as a kill would (no advance, no ``ack``/``fail``/``cleanup_before`` hooks, no
    retry), and the store and sinks keep whatever state they had at that moment. The
    next run on the same store resumes from there.
    """

    def __init__(self, point: FaultPoint, txid: int, number: int, *, echo: bool = False):
        self.point = point
        self.txid = txid
        self.number = number
        where = f"{point.value} of txid {txid} attempt {number}"
        super().__init__(
            f"reached {where} after the simulated crash" if echo else f"simulated crash at {where}"
        )


@dataclass(frozen=True)
class FaultRule:
    """Fail (or, with ``crash``, kill the run) at ``point`` of ``txid``; ``attempts``
    are 1-based attempt numbers, or None for every attempt."""

    point: FaultPoint
    txid: int
    attempts: frozenset[int] | None = frozenset({1})
    crash: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "point", FaultPoint(self.point))
        except ValueError:
            raise FaultPlanError(
                f"unknown fault point {self.point!r}: use one of {_POINTS}"
            ) from None
        if isinstance(self.txid, bool) or not isinstance(self.txid, int) or self.txid < 1:
            raise FaultPlanError(f"txid must be an integer >= 1, not {self.txid!r}")
        if self.attempts is not None:
            attempts = frozenset(self.attempts)
            if not attempts or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in attempts
            ):
                raise FaultPlanError(
                    f"attempts of txid {self.txid} must be attempt numbers >= 1 (or None for "
                    f"every attempt), not {sorted(self.attempts, key=repr)!r}"
                )
            object.__setattr__(self, "attempts", attempts)
        if self.crash and (self.attempts is None or len(self.attempts) != 1):
            raise FaultPlanError(
                f"a crash of txid {self.txid} happens once: give one attempt number, not "
                f"{'every attempt' if self.attempts is None else sorted(self.attempts)}"
            )

    def matches(self, point: FaultPoint, txid: int, number: int) -> bool:
        return (
            self.point is point
            and self.txid == txid
            and (self.attempts is None or number in self.attempts)
        )

    def __str__(self) -> str:
        if self.crash and self.attempts is not None:  # always, as __post_init__ checked
            (number,) = self.attempts
            tail = "" if number == 1 else f":{number}"
            return f"{_CRASH}{self.point.value}:{self.txid}{tail}"
        return f"{self.point.value}:{self.txid}:{_format_attempts(self.attempts)}"


class FaultPlan:
    """The faults of one test, checked by the runner at every step (``check``).

    ``injected`` lists ``(point, txid, number)`` of every fault raised, crashes included,
    in the order they fired; ``crashed`` the crash rules already spent; ``unmet()`` the
    rules that never fired (a plan that injects nothing proves nothing).
    """

    def __init__(self, rules: Iterable[FaultRule] = ()) -> None:
        self.rules: list[FaultRule] = list(rules)
        self.injected: list[tuple[FaultPoint, int, int]] = []
        self.crashed: list[FaultRule] = []
        #: rule index -> the attempt numbers it fired on
        self._fired: dict[int, set[int]] = {}
        self._lock = threading.Lock()  # checked from the worker and commit threads at once

    def unmet(self) -> list[str]:
        """Each rule that did not fire on every attempt it names (or, for a rule of every
        attempt, never fired), as ``"<rule>: <what never came>"``."""
        found = []
        with self._lock:
            for i, rule in enumerate(self.rules):
                fired = self._fired.get(i, set())
                if rule.attempts is None:
                    if not fired:
                        found.append(f"{rule}: never fired")
                    continue
                missing = sorted(rule.attempts - fired)
                if missing:
                    what = "attempt" if len(missing) == 1 else "attempts"
                    found.append(
                        f"{rule}: {what} {', '.join(map(str, missing))} of txid {rule.txid} "
                        f"never reached {rule.point.value}"
                    )
        return found

    def fail(
        self, point: FaultPoint | str, txid: int, attempts: Iterable[int] | None = (1,)
    ) -> FaultPlan:
        """Raise ``InjectedFault`` at ``point`` of ``txid`` on these attempt numbers
        (None: on every attempt, which the runner ends with ``PoisonBatchError``, or, under
        ``at_most_once``, drops the txid after its first failure)."""
        chosen = None if attempts is None else frozenset(attempts)
        self.rules.append(FaultRule(FaultPoint(point), txid, chosen))
        return self

    def crash(self, point: FaultPoint | str, txid: int, attempt: int = 1) -> FaultPlan:
        """End the run at ``point`` of ``txid`` (its ``attempt``-th attempt) as if the
        process were killed there: ``SimulatedCrash``. Fires once."""
        self.rules.append(FaultRule(FaultPoint(point), txid, frozenset({attempt}), crash=True))
        return self

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """A plan from its string form; see the module docstring for the grammar."""
        if not isinstance(text, str):
            raise FaultPlanError(f"a fault plan is a string, not {type(text).__name__}")
        if not text.strip():
            return cls()
        return cls(_parse_rule(item.strip(), text) for item in text.split(","))

    def check(self, point: FaultPoint, attempt: TransactionAttempt, number: int) -> None:
        txid = attempt.txid
        with self._lock:
            crash = next(
                (
                    r
                    for r in self.rules
                    if r.crash and r not in self.crashed and r.matches(point, txid, number)
                ),
                None,
            )
            if crash is not None:
                self.crashed.append(crash)
                self._fired.setdefault(self.rules.index(crash), set()).add(number)
            else:
                hits = [
                    i
                    for i, r in enumerate(self.rules)
                    if not r.crash and r.matches(point, txid, number)
                ]
                if not hits:
                    return
                for i in hits:
                    self._fired.setdefault(i, set()).add(number)
            self.injected.append((point, txid, number))
        if crash is not None:
            raise SimulatedCrash(point, txid, number)
        raise InjectedFault(f"planned fault at {point.value} of txid {txid} attempt {number}")

    def __str__(self) -> str:
        return ",".join(str(rule) for rule in self.rules)

    def __repr__(self) -> str:
        return f"FaultPlan.parse({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FaultPlan):
            return NotImplemented
        return self.rules == other.rules

    __hash__ = None  # type: ignore[assignment]


_Complaint = Callable[[str], "FaultPlanError"]


def _format_attempts(attempts: frozenset[int] | None) -> str:
    if attempts is None:
        return "*"
    spans: list[str] = []
    numbers = sorted(attempts)
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return "+".join(spans)


def _parse_rule(item: str, text: str) -> FaultRule:
    def bad(reason: str) -> FaultPlanError:
        return FaultPlanError(f"fault rule {item!r} in {text!r}: {reason}; {GRAMMAR}")

    crash = item.lower().startswith(_CRASH)
    fields = [f.strip() for f in item[len(_CRASH) if crash else 0 :].split(":")]
    if not item or len(fields) not in (2, 3):
        raise bad("expected POINT:TXID or POINT:TXID:ATTEMPTS")
    name = fields[0].lower().replace("-", "_")
    try:
        point = FaultPoint(name)
    except ValueError:
        raise bad(f"unknown point {fields[0]!r}") from None
    txid = _number(fields[1], bad, "txid")
    if len(fields) == 2:
        attempts: frozenset[int] | None = frozenset({1})
    elif crash:
        attempts = frozenset({_number(fields[2], bad, "attempt number of a crash")})
    elif fields[2] == "*":
        attempts = None
    else:
        attempts = frozenset(n for span in fields[2].split("+") for n in _span(span, bad))
    return FaultRule(point, txid, attempts, crash=crash)


def _number(token: str, bad: _Complaint, what: str) -> int:
    if not re.fullmatch(r"[0-9]+", token) or int(token) < 1:
        raise bad(f"{what} {token!r} is not an integer >= 1")
    return int(token)


def _span(token: str, bad: _Complaint) -> range:
    low, dash, high = token.strip().partition("-")
    first = _number(low.strip(), bad, "attempt")
    last = _number(high.strip(), bad, "attempt") if dash else first
    if last < first:
        raise bad(f"attempt range {token!r} runs backwards")
    return range(first, last + 1)
