"""One attempt's books of the record ledger: what each checked bolt was given and
accounted for, observed in the committers' own jobs, and the check before the commit,
which recounts exactly before it fails a txid and names the records lost or
multiplied. How: docs/architecture.md, "The record ledger"."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from transactional.contracts import component
from transactional.errors import ContractError, LedgerError
from transactional.ledger import COLUMNS, DROPPED, FOLDED, ID, XOR, Tally, recording
from transactional.runtime.ledger_plan import LedgerPlan
from transactional.spark.columns import prebuilt
from transactional.topology import SPOUT

if TYPE_CHECKING:
    from pyspark.sql import Column

    from transactional.spark._replan import Repointed
    from transactional.topology import BoltNode

log = logging.getLogger("transactional.ledger")

#: How many of the records lost or multiplied a ``LedgerError`` names.
NAMED = 5
#: A value longer than this is cut, where a record is named by its values.
_VALUE_CHARS = 60
#: A spout's ``locate`` for one attempt: a few of its batch's rows in, a text (or None)
#: for each out (``transactional.spout``).
Locate = Callable[[Sequence[Mapping[str, Any]]], Sequence[str | None] | None]


def _account(columns: Sequence[str]) -> tuple[Column, Column]:
    """Each row's part of a tally: ``(FOLDED, XOR)`` on an aggregate row, ``(1, ID)`` on
    a row that carries a record, nothing on a row with neither."""
    from pyspark.sql import functions as F

    carried_n = F.when(F.col(ID).isNotNull(), F.lit(1)) if ID in columns else None
    carried_x = F.col(ID) if ID in columns else None
    n_parts = [
        c for c in (F.col(FOLDED) if FOLDED in columns else None, carried_n) if c is not None
    ]
    x_parts = [c for c in (F.col(XOR) if XOR in columns else None, carried_x) if c is not None]
    n = F.coalesce(*n_parts, F.lit(0)).cast("long")
    x = F.coalesce(*x_parts, F.lit(0)).cast("long")
    return n, x


def _tally_metrics(columns: Sequence[str]) -> list[Column]:
    """A tally's aggregates over a stream of ``columns``: ``n`` and ``x``, and with
    ``DROPPED`` the dropped rows' ``dn`` and ``dx`` apart."""
    from pyspark.sql import functions as F

    n, x = _account(columns)
    if DROPPED not in columns:
        return [F.sum(n).alias("n"), F.bit_xor(x).alias("x")]
    kept, gone = F.col(DROPPED).isNull(), F.col(DROPPED).isNotNull()
    return [
        F.sum(F.when(kept, n)).alias("n"),
        F.bit_xor(F.when(kept, x)).alias("x"),
        F.sum(F.when(gone, n)).alias("dn"),
        F.bit_xor(F.when(gone, x)).alias("dx"),
    ]


def _kept(frame: Any, columns: Sequence[str]) -> Any:
    """``frame`` without the rows ``drop_where`` marked dropped (and without the mark)."""
    from pyspark.sql import functions as F

    if DROPPED not in columns:
        return frame
    return frame.where(F.col(DROPPED).isNull()).drop(DROPPED)


def _plain(frame: Any, columns: Sequence[str]) -> Any:
    """``frame`` as a reader the ledger does not check is given it: no dropped row, no
    ledger column."""
    frame = _kept(frame, columns)
    present = [c for c in COLUMNS if c in columns and c != DROPPED]
    return frame.drop(*present) if present else frame


@dataclass(eq=False)
class Tap:
    """One stream of a checked bolt, with the rows its route dropped (``drop``'s frames,
    if this stream carries them; ``drop_where`` marks rows in the stream itself): its
    ``rows`` observed, and what a committer is given (``given``: the same rows without
    the dropped ones and without the ledger's columns)."""

    frame: Any
    columns: tuple[str, ...]
    drops: list[tuple[Any, str]]
    _rows: Any = None
    _observation: Any = None
    _given: Any = None
    _exact: tuple[Tally, Tally] | None = None
    _metric_columns: tuple[str, ...] = ()

    def _metrics(self, columns: tuple[str, ...]) -> list[Column]:
        """The tally's aggregates over a stream of ``columns``: built once per session
        for each set of columns (``columns.prebuilt``), for they are the same in every
        txid and cost some 80 round trips to the JVM to build."""
        return prebuilt(self.frame, ("ledger.metrics", columns), partial(_tally_metrics, columns))

    def rows(self) -> Any:
        """The stream's rows and the drops' (``DROPPED``: their reason), observed."""
        if self._rows is None:
            from pyspark.sql import Observation
            from pyspark.sql import functions as F

            rows = self.frame
            if self.drops:
                for frame, reason in self.drops:
                    marked = frame.select(F.col(ID), F.lit(reason).alias(DROPPED))
                    rows = rows.unionByName(marked, allowMissingColumns=True)
            marks = (ID, DROPPED) if self.drops else ()
            columns = tuple(dict.fromkeys((*self.columns, *marks)))
            self._observation = Observation(f"ledger-{uuid.uuid4().hex}")
            self._rows = rows.observe(self._observation, *self._metrics(columns))
            self._metric_columns = columns
        return self._rows

    def given(self) -> Any:
        """What a committer reads: the stream's own rows, without the ledger's columns."""
        if self._given is None:
            rows = self.rows()
            self._given = _plain(rows, self._metric_columns)
        return self._given

    def observed(self) -> tuple[Tally, Tally] | None:
        """(stream, drops) as a committer's job observed them; None: no job read it."""
        if self._observation is None:
            return None
        try:
            if not self._observation._jo.future().isCompleted():
                return None
        except Exception:  # another Spark's Observation: count it instead
            return None
        return self._split(self._observation.get)

    def exact(self) -> tuple[Tally, Tally]:
        """(stream, drops) counted by a job of their own (once)."""
        if self._exact is None:
            rows = self.rows()
            got = rows.agg(*self._metrics(self._metric_columns)).collect()[0].asDict()
            self._exact = self._split(got)
        return self._exact

    @staticmethod
    def _split(got: Mapping[str, Any]) -> tuple[Tally, Tally]:
        return Tally.of(got["n"], got["x"]), Tally.of(got.get("dn"), got.get("dx"))

    def frames(self) -> list[Any]:
        """Every frame the tap holds."""
        held = [self.frame, *(f for f, _ in self.drops), self._rows, self._given]
        return [f for f in held if f is not None]

    def replanned(self, repointed: Repointed) -> Tap:
        """The tap of a later attempt whose plans are this one's re-pointed: its frames
        re-pointed when first used, its observation its own."""
        later = repointed.later
        return Tap(
            later(self.frame),
            self.columns,
            [(later(f), reason) for f, reason in self.drops],
            _rows=None if self._rows is None else later(self._rows),
            _observation=None if self._rows is None else repointed.observation(self._rows),
            _given=None if self._given is None else later(self._given),
            _metric_columns=self._metric_columns,
        )

    def ids(self, kept: bool) -> Any | None:
        """The ``ID`` of each record the stream's rows and drops carry (``kept``: only
        those a reader is given); None: it folds records, which have no id of their own."""
        from pyspark.sql import functions as F

        rows = self.rows()
        columns = self._metric_columns
        if FOLDED in columns or ID not in columns:
            return None
        if kept and DROPPED in columns:
            rows = rows.where(F.col(DROPPED).isNull())
        return rows.where(F.col(ID).isNotNull()).select(ID)


@dataclass(eq=False)
class _BoltBooks:
    """What ``drop`` records for the bolt being run."""

    who: str
    outputs: tuple[str, ...]
    routes: tuple[tuple[str, ...], ...]
    accounts: bool
    drops: dict[int, list[tuple[Any, str]]] = field(default_factory=dict)

    def drop(self, frame: Any, reason: str, stream: str | None) -> None:
        if not self.accounts:
            raise ContractError(
                f"{self.who} calls transactional.ledger.drop() but does not account for "
                "its records: set accounts = True on its class (and account for every "
                "record), or do not call drop()"
            )
        if not isinstance(reason, str) or not reason:
            raise ContractError(f"{self.who}: drop() needs a reason (a non-empty string)")
        if stream is None:
            if len(self.routes) != 1:
                raise ContractError(
                    f"{self.who} has routes {list(self.routes)}: name the stream the "
                    "records leave, drop(frame, reason, stream=...)"
                )
            route = 0
        elif stream in self.outputs:
            route = next(i for i, r in enumerate(self.routes) if stream in r)
        else:
            raise ContractError(
                f"{self.who}: drop(..., stream={stream!r}) names no stream of its "
                f"outputs {list(self.outputs)}"
            )
        if ID not in frame.columns:
            raise ContractError(
                f"{self.who}: drop({reason!r}) was given rows without "
                f"transactional.ledger.ID: drop rows of the bolt's input, with their ID"
            )
        self.drops.setdefault(route, []).append((frame, reason))


@dataclass(eq=False)
class AttemptLedger:
    """One attempt's books: what each bolt was given and accounted for, and the check
    before the commit (``check``)."""

    plan: LedgerPlan
    txid: int
    #: The batch's tally from the job that read it (None: no ids were given, or not yet
    #: read: the runner sets it before ``check``).
    batch: Tally | None
    #: The materialised batch, with ``ID`` and the spout's position columns: where a
    #: failed check finds what it names.
    records: Any = None
    #: The spout's ``locate`` for this attempt's batch (its txid and metadata given):
    #: asked only by a failed check, for a spout without position columns.
    locate: Locate | None = None
    _columns: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    _frames: dict[tuple[str, str], Any] = field(default_factory=dict)
    _drops: dict[str, dict[int, list[tuple[Any, str]]]] = field(default_factory=dict)
    _taps: dict[tuple[str, str], Tap] = field(default_factory=dict)
    _given: dict[tuple[str, str], Any] = field(default_factory=dict)
    _readers: dict[tuple[str, str], list[BoltNode]] = field(default_factory=dict)
    _nodes: list[BoltNode] = field(default_factory=list)
    #: The streams committers read.
    terminal: frozenset[tuple[str, str]] = frozenset()

    @property
    def counting(self) -> bool:
        return self.batch is not None

    def frames(self) -> list[Any]:
        """Every frame the books hold (``Replan.of`` checks each can be re-pointed)."""
        drops = [f for by in self._drops.values() for d in by.values() for f, _ in d]
        taps = [f for tap in self._taps.values() for f in tap.frames()]
        return [*self._frames.values(), *drops, *taps, *self._given.values()]

    def observed(self) -> list[Any]:
        """The observed frames: each tap's rows."""
        return [tap._rows for tap in self._taps.values() if tap._rows is not None]

    def replanned(
        self,
        txid: int,
        batch: Tally | None,
        records: Any,
        locate: Locate | None,
        repointed: Repointed,
    ) -> AttemptLedger:
        """The books of a later attempt whose plans are this one's re-pointed
        (``Bolt.plan_once``): the same streams, columns and drops, every frame re-pointed
        when first used (a passing check uses none: only the observations, each the
        attempt's own), and the attempt's own batch, tally and records."""
        later = repointed.later
        books = AttemptLedger(
            self.plan, txid, batch, records=records, locate=locate, terminal=self.terminal
        )
        books._columns = dict(self._columns)
        books._frames = {ref: later(f) for ref, f in self._frames.items()}
        books._drops = {
            name: {i: [(later(f), reason) for f, reason in d] for i, d in by.items()}
            for name, by in self._drops.items()
        }
        books._taps = {ref: tap.replanned(repointed) for ref, tap in self._taps.items()}
        books._given = {ref: later(f) for ref, f in self._given.items()}
        books._readers = {ref: list(nodes) for ref, nodes in self._readers.items()}
        books._nodes = list(self._nodes)
        return books

    # -------------------------------------------------------------- the bolts

    def bolt_input(self, node: BoltNode, frame: Any) -> Any:
        """What ``node`` is given: with ``ID`` (null when not counted) if it accounts,
        else without any ledger column."""
        from pyspark.sql import functions as F

        columns = self._columns_of(node.input, frame)
        if node.name in self.plan.accounting:
            frame = _kept(frame, columns)
            if ID in columns:
                return frame
            return frame.withColumn(ID, F.lit(None).cast("long"))
        return _plain(frame, columns)

    def _columns_of(self, ref: tuple[str, str], frame: Any) -> tuple[str, ...]:
        if ref in self._columns:
            return self._columns[ref]
        # Of the spout's batch, only ID matters, and it is there when counted.
        spout = (ID,) if self.counting else ()
        columns = spout if ref[0] == SPOUT else tuple(frame.columns)
        self._columns[ref] = columns
        return columns

    @contextmanager
    def running(self, node: BoltNode) -> Iterator[None]:
        """``node``'s ``process`` and ``finish_batch`` run inside: ``drop`` records there."""
        routes = self.plan.routes.get(node.name, (tuple(node.bolt.outputs),))
        books = _BoltBooks(
            component("bolt", node.name, node.bolt),
            tuple(node.bolt.outputs),
            routes,
            node.name in self.plan.accounting,
            self._drops.setdefault(node.name, {}),
        )
        with recording(books):
            yield

    def outputs(self, node: BoltNode, streams: Mapping[str, Any]) -> None:
        """``node``'s streams, each checked to account for records in a form the ledger
        reads (a checked bolt), and their columns noted."""
        self._nodes.append(node)
        self._readers.setdefault(node.input, []).append(node)
        accounting = node.name in self.plan.accounting
        checked = node.name in self.plan.checked and self.counting
        who = component("bolt", node.name, node.bolt)
        for stream, frame in streams.items():
            ref = (node.name, stream)
            self._frames[ref] = frame
            if not accounting:
                self._columns[ref] = ()  # never given the ledger's columns
                continue
            columns = tuple(frame.columns)
            self._columns[ref] = columns
            if not checked:
                continue
            if (FOLDED in columns) != (XOR in columns):
                raise ContractError(
                    f"{who} stream {stream!r} has only one of {FOLDED!r} and {XOR!r}: "
                    "fold with *transactional.ledger.folded(), which gives both"
                )
            if ID not in columns and FOLDED not in columns:
                raise ContractError(
                    f"{who} accounts for its records (accounts = True), but its stream "
                    f"{stream!r} (columns {[c for c in columns if c not in COLUMNS]}) carries "
                    "none of them: keep transactional.ledger.ID in it (a row-wise transform), "
                    "fold it with agg(..., *folded()), or drop(frame, reason) what it leaves out"
                )

    # -------------------------------------------------------------- the committers

    def committer_input(self, ref: tuple[str, str], frame: Any) -> Any:
        """What a committer reading ``ref`` is given: a checked bolt's stream observed
        (the same frame for every committer that reads it), any other without the
        ledger's columns."""
        if ref in self._given:
            return self._given[ref]
        if ref[0] in self.plan.checked and self.counting:
            given = self._tap(ref).given()
        else:
            given = _plain(frame, self._columns_of(ref, frame))
        self._given[ref] = given
        return given

    def _tap(self, ref: tuple[str, str]) -> Tap:
        tap = self._taps.get(ref)
        if tap is None:
            name, stream = ref
            drops: list[tuple[Any, str]] = []
            for index, route in enumerate(self.plan.routes[name]):
                if stream in route and self._carrier(name, route) == stream:
                    drops = self._drops.get(name, {}).get(index, [])
            tap = Tap(self._frames[ref], self._columns[ref], list(drops))
            self._taps[ref] = tap
        return tap

    def _carrier(self, name: str, route: tuple[str, ...]) -> str:
        """The stream of ``route`` whose observation counts the route's drops: the first
        a committer reads, else the first."""
        return next((s for s in route if (name, s) in self.terminal), route[0])

    # -------------------------------------------------------------- the check

    def check(self) -> None:
        """Before anything of the txid is committed: every checked bolt balances, from
        what the txid's jobs observed; an observed imbalance is recounted exactly, and
        only the recount fails the txid (``LedgerError``)."""
        if not self.counting or not self.plan.checked:
            return
        if self._balanced(exact=False):
            return
        self._recount()
        log.warning(
            "ledger txid=%d: the observed totals did not balance but an exact recount "
            "does (a task re-run in a map stage, or a committer that keeps its input in "
            "a checkpoint or reads part of it); the txid goes on",
            self.txid,
        )

    def _checked_nodes(self) -> list[BoltNode]:
        return [n for n in self._nodes if n.name in self.plan.checked]

    def _part(self, ref: tuple[str, str], exact: bool) -> tuple[Tally, Tally] | None:
        tap = self._tap(ref)
        if exact:
            return tap.exact()
        return tap.observed() if ref in self.terminal else None

    def _balanced(self, exact: bool) -> bool:
        """One sum per route, from the sinks back to the batch; every way of knowing a
        stream's tally must agree."""
        from transactional.bolt import DEFAULT_STREAM

        totals: dict[str, list[Tally]] = {}  # bolt -> its routes' totals
        for node in reversed(self._checked_nodes()):
            route_totals = []
            for route in self.plan.routes[node.name]:
                total = Tally()
                for stream in route:
                    ref = (node.name, stream)
                    candidates = self._candidates(ref, totals, exact)
                    if len(set(candidates)) > 1:
                        return False
                    total = total + candidates[0]
                total = total + self._route_drops(node.name, route, exact)
                route_totals.append(total)
            totals[node.name] = route_totals
        given = [self.batch] if self.batch is not None else []
        for reader in self._readers.get((SPOUT, DEFAULT_STREAM), []):
            given += totals.get(reader.name, [])
        return len(set(given)) <= 1

    def _candidates(
        self, ref: tuple[str, str], totals: Mapping[str, list[Tally]], exact: bool
    ) -> list[Tally]:
        candidates = []
        part = self._part(ref, exact)
        if part is not None:
            candidates.append(part[0])
        for reader in self._readers.get(ref, []):
            candidates += totals.get(reader.name, [])
        if not candidates:
            candidates.append(self._tap(ref).exact()[0])
        return candidates

    def _route_drops(self, name: str, route: tuple[str, ...], exact: bool) -> Tally:
        """What ``name`` dropped on ``route``: ``drop``'s frames (counted where their
        carrier stream is) and the rows ``drop_where`` marked in the route's streams."""
        index = self.plan.routes[name].index(route)
        carrier = self._carrier(name, route) if self._drops.get(name, {}).get(index) else None
        total = Tally()
        for stream in route:
            ref = (name, stream)
            if stream != carrier and DROPPED not in self._columns[ref]:
                continue
            part = self._part(ref, exact)
            if part is None:
                part = self._tap(ref).exact()
            total = total + part[1]
        return total

    def _recount(self) -> None:
        """Every checked bolt's input, streams and drops counted exactly; the first bolt
        that does not balance fails the txid."""
        for node in self._checked_nodes():
            if node.input[0] == SPOUT:
                assert self.batch is not None
                given = self.batch
                source = "the spout's batch"
            else:
                given = self._tap(node.input).exact()[0]
                source = f"stream {node.input[0]}:{node.input[1]}"
            for route in self.plan.routes[node.name]:
                accounted = Tally()
                for stream in route:
                    accounted = accounted + self._tap((node.name, stream)).exact()[0]
                accounted = accounted + self._route_drops(node.name, route, exact=True)
                if accounted != given:
                    named, miscounted = self._culprits(node, route, given - accounted)
                    raise LedgerError(
                        component("bolt", node.name, node.bolt),
                        source,
                        route,
                        self.txid,
                        given.records,
                        accounted.records,
                        named,
                        miscounted,
                    )

    def _culprits(
        self, node: BoltNode, route: tuple[str, ...], missing: Tally
    ) -> tuple[tuple[str, ...], int]:
        """The first ``NAMED`` records ``node`` lost or multiplied on ``route`` (given less
        accounted for: ``missing``), named, and how many it lost or multiplied in all;
        ``((), 0)`` when it cannot tell. Jobs of their own: only a failed check runs them."""
        from pyspark.sql import functions as F

        if self.records is None:
            return (), 0
        if node.input[0] == SPOUT:
            given = self.records.select(ID)
        else:
            given = self._tap(node.input).ids(kept=True)
        accounted = [self._tap((node.name, stream)).ids(kept=False) for stream in route]
        frames = [f for f in (given, *accounted) if f is not None]
        n = _COUNT
        if len(frames) != 1 + len(route):
            # Folded records: only one record lost or multiplied can be found, by its id.
            if abs(missing.records) != 1:
                return (), 0
            found = self.records.where(F.col(ID) == _signed(missing.xor)).limit(1).collect()
            named = self._names([{**r.asDict(), n: missing.records} for r in found], False)
            return named, len(named)
        signed = frames[0].select(ID, F.lit(1).alias(n))
        for frame in frames[1:]:
            signed = signed.unionByName(frame.select(ID, F.lit(-1).alias(n)))
        wrong = signed.groupBy(ID).agg(F.sum(n).alias(n)).where(F.col(n) != 0)
        counts = wrong.agg(
            F.count(F.lit(1)).alias("all"), F.sum(F.when(F.col(n) < 0, 1)).alias("multiplied")
        ).collect()[0]
        if not counts["all"]:
            return (), 0
        mixed = bool(counts["multiplied"]) and counts["multiplied"] < counts["all"]
        rows = wrong.join(self.records, ID).orderBy(*_order(self.records, self.plan.position))
        named = self._names([r.asDict() for r in rows.limit(NAMED).collect()], mixed)
        return named, int(counts["all"])

    def _names(self, rows: Sequence[Mapping[str, Any]], mixed: bool) -> tuple[str, ...]:
        """``rows`` of the batch (each with its ``_COUNT``) as the error names them: by
        their position columns; else where the spout's ``locate`` finds them, first, in
        their names' order (numbers as numbers: ``line 9`` before ``line 10``); else by
        their values, in the order given."""
        position = self.plan.position
        where = [None] * len(rows) if position else self._located(rows)
        named = [
            (w, _named(r, position, r[_COUNT], mixed, w)) for r, w in zip(rows, where, strict=True)
        ]
        located = sorted((_natural(name), name) for w, name in named if w is not None)
        return (*(name for _, name in located), *(name for w, name in named if w is None))

    def _located(self, rows: Sequence[Mapping[str, Any]]) -> list[str | None]:
        """What the spout's ``locate`` says of ``rows`` (without the ledger's columns); an
        error or an answer that breaks its contract is logged: the ``LedgerError`` is the
        finding, and the records are then named by their values."""
        nothing: list[str | None] = [None] * len(rows)
        if self.locate is None or not rows:
            return nothing
        given = [{c: v for c, v in r.items() if c not in (*COLUMNS, _COUNT)} for r in rows]
        try:
            found = self.locate(given)
        except Exception as exc:
            log.warning(
                "ledger txid=%d: %s locate raised %r: the records are named by their values",
                self.txid,
                self.plan.spout,
                exc,
            )
            return nothing
        if found is None:
            return nothing
        found = list(found)
        if len(found) != len(rows) or not all(f is None or isinstance(f, str) for f in found):
            log.warning(
                "ledger txid=%d: %s locate answered %r for %d records, not a text or None "
                "each: the records are named by their values",
                self.txid,
                self.plan.spout,
                found,
                len(rows),
            )
            return nothing
        return found


#: Per record id, how many times it was given less how many it was accounted for.
_COUNT = "__transactional_count"


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """``name``'s order with its numbers read as numbers (``line 9`` before ``line 10``)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)


def _signed(xor: int) -> int:
    """A tally's XOR (unsigned) as the LONG an ``ID`` is."""
    return xor - (1 << 64) if xor >= 1 << 63 else xor


def _order(records: Any, position: Sequence[str]) -> list[Column]:
    """The order records are named in: by position; from a spout without position
    columns, by the values that can be ordered (not maps)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    if position:
        columns = list(position)
    else:
        columns = [
            f.name
            for f in records.schema.fields
            if f.name != ID and not isinstance(f.dataType, MapType)
        ]
    return [*(F.col(f"`{c}`") for c in columns), F.col(ID)]


def _named(
    row: Mapping[str, Any],
    position: Sequence[str],
    count: int,
    mixed: bool = False,
    where: str | None = None,
) -> str:
    """A record as a ``LedgerError`` names it: its position in the source's words
    (``partition 2 offset 1041``, ``stream clicks id 1700000000000-0``), else ``where``
    the spout located it (``file part-1.jsonl line 7``), else its values (``id=4
    text='...'``); then how many times it was accounted for, if more than once
    (``count``: given less accounted for), or, among others that were (``mixed``), that
    it was lost."""

    def value(v: Any, quoted: bool) -> str:
        text = repr(v) if quoted or (isinstance(v, str) and (not v or " " in v)) else str(v)
        return text if len(text) <= _VALUE_CHARS else f"{text[: _VALUE_CHARS - 3]}..."

    if position:
        name = " ".join(f"{c} {value(row[c], False)}" for c in position)
    elif where is not None:
        name = where
    else:
        name = " ".join(
            f"{c}={value(v, isinstance(v, str))}"
            for c, v in row.items()
            if c not in (ID, _COUNT) and v is not None
        )
    if count < 0:
        return f"{name}: {1 - count} times"
    return f"{name}: lost" if mixed else name
