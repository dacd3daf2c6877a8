"""Step 2 of the protocol, on a worker thread: build an attempt's batch, read it once,
run the bolts over it and let each committer ``prepare`` its inputs.

The batch is materialised once (``Engine.materialise``: one job reads, counts and keeps
it), so every bolt and committer of the attempt sees the same rows, even from a
non-deterministic source. Then every committer's ``collect_plan`` frames (per-key sums,
dead letters) come to the driver as Arrow (``Engine.collect``: a job each, reading the
kept batch, not the source). Every value a bolt or a
committer hands back is checked against its contract (``transactional.contracts``).

With the ledger on (``transactional.ledger``), the batch's records get their ids in
the materialise job, each bolt is given what it may see (its input with the ids if it
accounts, without the ledger's columns if not), each committer a checked bolt's stream
observed and without the ledger's columns, and after the committers' jobs, before the
attempt is reported processed, the books are checked: a bolt that lost or duplicated
records fails the attempt (``LedgerError``), so nothing of it is committed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from transactional import contracts
from transactional.bolt import DEFAULT_STREAM
from transactional.engine import Digest, Engine
from transactional.faults import FaultPoint
from transactional.ledger import AttemptLedger, LedgerPlan
from transactional.runtime.drivers import Batch, SpoutDriver
from transactional.runtime.kept import Kept
from transactional.runtime.messages import Processed
from transactional.runtime.probes import Faults
from transactional.topology import SPOUT, Topology
from transactional.types import TransactionAttempt

#: The warm-up's attempt: txids start at 1, so txid 0 is never stored or committed.
WARM_UP = TransactionAttempt(0, 0)

#: ``(attempt, step, began)``: a step of the attempt that began at ``perf_counter`` time.
Measure = Callable[[TransactionAttempt, str, float], None]


def describer(
    engine: Engine, label: str, attempt: TransactionAttempt, number: int
) -> Callable[[str], None]:
    """Sets the description of the Spark jobs of each step of an attempt, as the Spark
    UI shows it: ``tweets txid=7 attempt=2 step=emit``."""

    def step(name: str) -> None:
        engine.describe(f"{label} txid={attempt.txid} attempt={number} step={name}".strip())

    return step


@dataclass(frozen=True)
class Result:
    """A processed attempt: the event, each committer's prepared value, the digest of
    each partition read (None: the determinism check is off) and what it keeps in
    Spark until it is committed or dropped."""

    event: Processed
    prepared: Sequence[Any]
    digests: dict[int, Digest] | None
    kept: Kept = field(default_factory=Kept)


@dataclass(eq=False)
class Pipeline:
    topology: Topology
    driver: SpoutDriver
    engine: Engine
    faults: Faults
    measure: Measure
    #: Names the topology in the Spark jobs' descriptions.
    label: str = ""
    #: Check the record ledger (``RunnerConfig.ledger``); only on an engine that counts
    #: ids (``counts_ids``: Spark's).
    ledger: bool = False

    def __post_init__(self) -> None:
        on = self.ledger and getattr(self.engine, "counts_ids", False)
        self.books = LedgerPlan.of(self.topology, on)
        #: The streams committers read.
        self.terminal = frozenset(
            ref for node in self.topology.committers for ref in node.inputs.values()
        )
        #: The ledger's part needs Spark frames: none when no bolt accounts.
        self.keeps_books = bool(self.books.accounting) and getattr(self.engine, "counts_ids", False)

    def _ledger(self, attempt: TransactionAttempt, tally: Any) -> AttemptLedger | None:
        if not self.keeps_books:
            return None
        return AttemptLedger(self.books, attempt.txid, tally, terminal=self.terminal)

    def run(self, batch: Batch) -> Result:
        """The attempt's steps. What it kept in Spark is released here if a step fails,
        else by the executor once the attempt is committed or dropped."""
        made: list[Any] = []  # every frame the steps make, as they make it
        since = self.engine.mark()
        try:
            result = self._run(batch, made)
        except BaseException:
            Kept(tuple(made), since).release(self.engine)
            raise
        return replace(result, kept=Kept(tuple(made), since))

    def _run(self, batch: Batch, made: list[Any]) -> Result:
        attempt = batch.attempt
        step = describer(self.engine, self.label, attempt, batch.number)
        began = time.perf_counter()
        step("emit")
        frames, partitions = self.driver.frames(batch)
        ids = self.books.record_ids(attempt.txid)
        if ids is None:
            read = self.engine.materialise(frames, self.driver.digests, partitions)
        else:
            read = self.engine.materialise(frames, self.driver.digests, partitions, ids=ids)
        made.append(read.batch)
        self.measure(attempt, "emit", began)
        if read.records == 0 and not self.driver.spout.commit_empty_batches:
            # Committed only inside a recorded group: as ``None`` to every committer.
            empty = Processed(attempt, 0, empty=True, groupable=True)
            nothing = [None] * len(self.topology.committers)
            return Result(empty, nothing, read.digests)
        began = time.perf_counter()
        step("process")
        books = self._ledger(attempt, read.ids)
        streams = self._bolts(attempt, read.batch, made, books)
        self.faults.check(FaultPoint.PROCESS, attempt, batch.number)
        self.measure(attempt, "process", began)
        began = time.perf_counter()
        step("prepare")
        prepared = self._prepare(attempt, streams, made, books)
        if books is not None:
            step("ledger")  # jobs only for what no committer read, or a recount
            books.check()
        self.measure(attempt, "prepare", began)
        groupable = all(
            node.committer.groupable(p)
            for node, p in zip(self.topology.committers, prepared, strict=True)
        )
        processed = Processed(attempt, read.records, empty=False, groupable=groupable)
        return Result(processed, prepared, read.digests)

    def warm_up(self, frame: Any) -> int:
        """Run the spout's sample ``frame`` through the attempt's steps (materialise, as
        the driver does, with its digests; the bolts; every committer's prepare) as
        ``WARM_UP``, an attempt of txid 0, which no runner stores or commits. Returns the
        sample's records; the prepared results are dropped."""
        made: list[Any] = []
        since = self.engine.mark()
        try:
            ids = self.books.record_ids(WARM_UP.txid)
            if ids is None:
                read = self.engine.materialise([frame], self.driver.digests)
            else:
                read = self.engine.materialise([frame], self.driver.digests, ids=ids)
            made.append(read.batch)
            if read.records:
                books = self._ledger(WARM_UP, read.ids)
                streams = self._bolts(WARM_UP, read.batch, made, books)
                self._prepare(WARM_UP, streams, made, books)
                if books is not None:
                    books.check()
            return read.records
        finally:
            Kept(tuple(made), since).release(self.engine)

    def _prepare(
        self,
        attempt: TransactionAttempt,
        streams: dict[tuple[str, str], Any],
        made: list[Any],
        books: AttemptLedger | None = None,
    ) -> list[Any]:
        """Every committer's ``collect_plan`` collected together, then each one's
        ``prepare_collected``; ``prepare`` for a committer that collects nothing."""
        nodes = self.topology.committers
        if books is not None:
            read = {ref: books.committer_input(ref, streams[ref]) for ref in self.terminal}
            streams = {**streams, **read}
        inputs = [{k: streams[ref] for k, ref in node.inputs.items()} for node in nodes]
        plans = []
        for node, given in zip(nodes, inputs, strict=True):
            who = contracts.component("committer", node.name, node.committer)
            plan = node.committer.collect_plan(attempt, given)
            plans.append(contracts.collect_plan(plan, self.engine.is_frame, who, attempt.txid))
        fused = {(n, name): frame for n, plan in enumerate(plans) for name, frame in plan.items()}
        made.extend(fused.values())
        collected = self.engine.collect(fused) if fused else {}
        prepared = []
        for n, (node, given, plan) in enumerate(zip(nodes, inputs, plans, strict=True)):
            if not plan:
                prepared.append(node.committer.prepare(attempt, given))
                continue
            own = {name: collected[(n, name)] for name in plan}
            prepared.append(node.committer.prepare_collected(attempt, given, own))
        return prepared

    def _bolts(
        self,
        attempt: TransactionAttempt,
        batch: Any,
        made: list[Any],
        books: AttemptLedger | None = None,
    ) -> dict[tuple[str, str], Any]:
        is_frame = self.engine.is_frame
        txid = attempt.txid
        streams: dict[tuple[str, str], Any] = {(SPOUT, DEFAULT_STREAM): batch}
        for node in self.topology.bolts:
            who = contracts.component("bolt", node.name, node.bolt)
            outputs = tuple(node.bolt.outputs)
            given = streams[node.input]
            with nullcontext() if books is None else books.running(node):
                if books is not None:
                    given = books.bolt_input(node, given)
                out = node.bolt.process(attempt, given)
                out = contracts.bolt_streams(out, outputs, is_frame, who, "process", txid)
                out = node.bolt.finish_batch(attempt, out)
                out = contracts.bolt_streams(out, outputs, is_frame, who, "finish_batch", txid)
            if books is not None:
                books.outputs(node, out)
            for stream in outputs:
                streams[(node.name, stream)] = out[stream]
                made.append(out[stream])
        return streams
