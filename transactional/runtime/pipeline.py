"""Step 2 of the protocol (docs/architecture.md, "The protocol"), on a worker thread:
build an attempt's batch and read it once, run the bolts over it, keeping the record
ledger's books ("The record ledger"), and let each committer ``prepare`` its inputs,
every value handed back checked against its contract (``transactional.contracts``).
With plans built once, later attempts re-point the first one's ("Plans built once").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from transactional import contracts
from transactional._logfmt import kv
from transactional.bolt import DEFAULT_STREAM
from transactional.errors import SparkAnalysisError
from transactional.faults import FaultPoint
from transactional.ledger import ID
from transactional.runtime.drivers import Batch, SpoutDriver
from transactional.runtime.kept import Kept
from transactional.runtime.ledger_books import AttemptLedger
from transactional.runtime.ledger_plan import LedgerPlan
from transactional.runtime.messages import Processed
from transactional.runtime.probes import Faults
from transactional.spark._replan import Fused, LazyInputs, holds, one_stage, one_task
from transactional.spark.engine import Digest, Engine, Materialised
from transactional.topology import SPOUT, Topology
from transactional.types import TransactionAttempt

log = logging.getLogger("transactional.runner")

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
class Maker:
    """A component as an error names it: ``role`` (spout, bolt, committer) and ``who``
    (``contracts.component``)."""

    role: str
    who: str
    #: A bolt that accounts for its records (``Bolt.accounts``): its input has ``ID``.
    accounts: bool = False


class Plans:
    """The frames an attempt's components built, by whom, so that a plan Spark's
    analysis refuses (``SparkAnalysisError.classify``) stops the run as the contract
    error of the component that built it. A classic session analyses a plan as it is
    built, so the component being called built it. Spark Connect analyses a plan when
    it is first used, maybe by a later component (a committer reading a bolt's stream),
    so the frames built before are analysed again, in the topology's order, and the
    first refused names its maker: only after a refusal, since on Connect each costs a
    round trip."""

    def __init__(self) -> None:
        self.built: list[tuple[Maker, Any]] = []

    def add(self, maker: Maker, frames: Iterable[Any]) -> None:
        self.built.extend((maker, frame) for frame in frames)

    @contextmanager
    def calling(self, maker: Maker | None) -> Iterator[None]:
        """Raise what fails inside as ``refused`` makes it (``maker``: the component
        being called; None: the runner's own step, which builds no plan of a user's)."""
        try:
            yield
        except Exception as exc:
            error = self.refused(exc, maker)
            if error is exc:
                raise
            raise error from exc

    def refused(self, exc: Exception, maker: Maker | None) -> Exception:
        """``exc`` as a ``SparkAnalysisError`` of the component whose plan Spark refused,
        if it is such a refusal and a component's; else ``exc`` itself."""
        if SparkAnalysisError.classify(exc) is None:
            return exc
        for built, frame in self.built:
            found = _analysis_error(frame)
            if found is not None:
                return _refusal(built, found)
        return refusal(exc, maker)


def _collect_frames(collects: Sequence[Inputs]) -> dict[tuple[int, str], Any]:
    """Every committer's collect plans, by ``(committer, name)``."""
    return {(n, name): frame for n, plan in enumerate(collects) for name, frame in plan.items()}


def refusal(exc: Exception, maker: Maker | None) -> Exception:
    """``exc`` as ``maker``'s ``SparkAnalysisError`` if it is an analysis error
    (``SparkAnalysisError.classify``) and ``maker`` a component; else ``exc`` itself:
    where one component alone was called (a spout deciding a batch)."""
    if maker is None or SparkAnalysisError.classify(exc) is None:
        return exc
    return _refusal(maker, exc)


def _analysis_error(frame: Any) -> Exception | None:
    """The analysis error of ``frame``'s plan, if Spark refuses it."""
    try:
        frame.schema  # noqa: B018 - analyses the plan (on Connect, a round trip)
    except Exception as exc:
        return exc if SparkAnalysisError.classify(exc) is not None else None
    return None


def _refusal(maker: Maker, exc: Any) -> SparkAnalysisError:
    """``exc``, an analysis error (``SparkAnalysisError.classify``), as ``maker``'s."""
    error_class = SparkAnalysisError.classify(exc)
    assert error_class is not None
    # One line: without the plan (classic) or the server's stack trace (Connect) that
    # may follow, and without the class, named on its own.
    text = str(exc.getMessage()).split("\n\nJVM stacktrace:")[0].split(";\n")[0]
    text = text.strip().removeprefix(f"[{error_class}]")
    fix = f"fix the {maker.role}'s code"
    column = (exc.getMessageParameters() or {}).get("objectName", "")
    unresolved = error_class.startswith("UNRESOLVED_COLUMN") and ID in column
    if unresolved and maker.role == "bolt" and not maker.accounts:
        fix = (
            f"it reads the ledger's id column {ID}, which only a bolt that accounts for "
            "its records is given: set `accounts = True`, or drop the column"
        )
    return SparkAnalysisError(maker.who, error_class, " ".join(text.split()), fix)


#: A committer's frames by name: its inputs, or its ``collect_plan``.
Inputs = dict[str, Any]


@dataclass(frozen=True)
class _Template:
    """The plans an attempt built (``Pipeline.plans_once``): each committer's inputs
    and collect plan, and the books, re-pointed at later batches by ``replan``."""

    replan: Any
    inputs: list[Inputs]
    collects: list[Inputs]
    books: AttemptLedger | None
    #: The collect plans as one frame, and each one's Arrow schema (None: one job each).
    fused: Fused | None = None
    schemas: dict[Any, Any] = field(default_factory=dict)
    #: The batch's own observation (its count, digests, tally: ``Pending``), which each
    #: later attempt's plans observe under a name of its own; None: the batch was
    #: counted by the materialise job.
    read: Any = None
    #: The committers' collects are one job whose result stage reads the batch: it
    #: counts a later batch too, and the attempt runs no job of its own to count it.
    one_job: bool = False
    #: The batch the plans were built over.
    batch: Any = None


@dataclass(frozen=True)
class _Replanned:
    """An attempt's plans, re-pointed from the template's."""

    inputs: list[Any]
    collects: list[Inputs]
    books: AttemptLedger | None
    #: The fused collect frame, how to split it and each part's schema (None: one job
    #: each).
    fused: tuple[Any, Fused, dict[Any, Any]] | None
    #: The attempt's observation of its batch (None: the batch was counted already).
    read: Any = None


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
        #: Every bolt's and committer's plans are built once and re-pointed at each
        #: later batch (``Bolt.plan_once``; ``Engine.replan`` says where it can).
        self.plans_once = all(
            getattr(node.bolt, "plan_once", False) for node in self.topology.bolts
        ) and all(getattr(n.committer, "plan_once", False) for n in self.topology.committers)
        self._template: _Template | None = None

    def _ledger(
        self, attempt: TransactionAttempt, read: Materialised, batch: Batch | None = None
    ) -> AttemptLedger | None:
        """The attempt's books; ``batch`` None: the warm-up's sample."""
        if not self.keeps_books:
            return None
        return AttemptLedger(
            self.books,
            attempt.txid,
            read.ids,
            records=read.batch,
            locate=self._locate(attempt, batch),
            terminal=self.terminal,
        )

    def _locate(self, attempt: TransactionAttempt, batch: Batch | None) -> Any:
        """The spout's ``locate`` for the attempt's batch (None: the warm-up's sample)."""
        driver, txid = self.driver, attempt.txid

        def locate(rows: Sequence[Any]) -> Any:
            meta = None if batch is None else driver.public_meta(batch)
            return driver.spout.locate(txid, meta, rows)

        return locate

    def run(self, batch: Batch) -> Result:
        """The attempt's steps. What it kept in Spark is released here if a step fails,
        else by the executor once the attempt is committed or dropped."""
        made: list[Any] = []  # every frame the steps make, as they make it
        since = self.engine.mark()
        plans = Plans()
        try:
            with plans.calling(None):
                result = self._run(batch, made, plans)
        except BaseException:
            Kept(tuple(made), since).release(self.engine)
            raise
        return replace(result, kept=Kept(tuple(made), since))

    def _run(self, batch: Batch, made: list[Any], plans: Plans) -> Result:
        attempt = batch.attempt
        step = describer(self.engine, self.label, attempt, batch.number)
        began = time.perf_counter()
        step("emit")
        spout = Maker("spout", self.driver.name)
        with plans.calling(spout):
            frames, partitions = self.driver.frames(batch)
        plans.add(spout, frames)
        ids = self.books.record_ids(attempt.txid)
        # Plans built once may count the batch in the committers' one job (``Pending``).
        defer = self.plans_once
        if ids is None:
            read = self.engine.materialise(frames, self.driver.digests, partitions, defer=defer)
        else:
            read = self.engine.materialise(
                frames, self.driver.digests, partitions, ids=ids, defer=defer
            )
        made.append(read.batch)
        root = None
        built = self._replanned(attempt, read, batch) if read.pending is not None else None
        if read.pending is not None and (built is None or built.read is None):
            root = read.pending.root
            read = read.pending.settle()  # no one job to count it: a job of its own
        self.measure(attempt, "emit", began)
        if read.pending is None and self._empty(read):
            return self._nothing(attempt, read)
        began = time.perf_counter()
        step("process")
        if built is None:
            built = self._replanned(attempt, read, batch)
        template = built is None and self.plans_once
        fused = None
        if built is None:
            books = self._ledger(attempt, read, batch)
            streams = self._bolts(attempt, read.batch, made, plans, books)
            inputs, collects = self._plans(attempt, streams, plans, books)
        else:
            inputs, collects, books, fused = built.inputs, built.collects, built.books, built.fused
        self.faults.check(FaultPoint.PROCESS, attempt, batch.number)
        self.measure(attempt, "process", began)
        began = time.perf_counter()
        step("prepare")
        prepared, collected = self._prepared(attempt, inputs, collects, made, plans, fused)
        if read.pending is not None:  # counted by the committers' job
            assert built is not None
            read = read.pending.resolve(built.read)
            if self._empty(read):
                return self._nothing(attempt, read)
        if books is not None:
            step("ledger")  # jobs only for what no committer read, or a recount
            books.batch = read.ids  # re-pointed books are made before the batch is counted
            books.check()
        if template:
            self._keep(read.batch, inputs, collects, books, collected, root)
        self.measure(attempt, "prepare", began)
        groupable = all(
            node.committer.groupable(p)
            for node, p in zip(self.topology.committers, prepared, strict=True)
        )
        processed = Processed(attempt, read.records, empty=False, groupable=groupable)
        return Result(processed, prepared, read.digests)

    def _empty(self, read: Materialised) -> bool:
        """An empty batch of a spout that does not commit them: not processed."""
        return read.records == 0 and not self.driver.spout.commit_empty_batches

    def _nothing(self, attempt: TransactionAttempt, read: Materialised) -> Result:
        """An empty batch, committed only inside a recorded group: as ``None`` to every
        committer."""
        empty = Processed(attempt, 0, empty=True, groupable=True)
        return Result(empty, [None] * len(self.topology.committers), read.digests)

    def warm_up(self, frame: Any) -> int:
        """Run the spout's sample ``frame`` through the attempt's steps (materialise, as
        the driver does, with its digests; the bolts; every committer's prepare) as
        ``WARM_UP``, an attempt of txid 0, which no runner stores or commits. Returns the
        sample's records; the prepared results are dropped."""
        made: list[Any] = []
        since = self.engine.mark()
        plans = Plans()
        plans.add(Maker("spout", f"{self.driver.name}.sample_batch"), [frame])
        try:
            with plans.calling(None):
                ids = self.books.record_ids(WARM_UP.txid)
                if ids is None:
                    read = self.engine.materialise([frame], self.driver.digests)
                else:
                    read = self.engine.materialise([frame], self.driver.digests, ids=ids)
                made.append(read.batch)
                if read.records:
                    books = self._ledger(WARM_UP, read)
                    streams = self._bolts(WARM_UP, read.batch, made, plans, books)
                    inputs, collects = self._plans(WARM_UP, streams, plans, books)
                    self._prepared(WARM_UP, inputs, collects, made, plans)
                    if books is not None:
                        books.check()
                return read.records
        finally:
            Kept(tuple(made), since).release(self.engine)

    def _replanned(
        self, attempt: TransactionAttempt, read: Materialised, batch: Batch
    ) -> _Replanned | None:
        """The template's committer inputs, collect plans and books re-pointed at the
        attempt's batch (``Engine.replan``), its fused collect plans (None: one job
        each), and, if the committers' one job counts the batch, the attempt's
        observation of it; None: there is no template, or it does not fit the batch,
        and the attempt builds its plans (``_bolts``, ``_plans``)."""
        template = self._template
        if template is None:
            return None
        if read.pending is not None:  # the kept relation alone: observed as the template's
            repointed = template.replan.over(read.pending.kept, kept=True)
        else:
            repointed = template.replan.over(read.batch)
        if repointed is None:
            return None
        inputs = [LazyInputs(given, repointed) for given in template.inputs]
        if template.fused is None:
            collects = [
                {n: repointed.frame(f) for n, f in plan.items()} for plan in template.collects
            ]
        else:  # only the fused frame is collected: the plans' names are what is used
            collects = [dict.fromkeys(plan) for plan in template.collects]
        books = None
        if template.books is not None:
            records = read.batch if read.pending is None else repointed.later(template.batch)
            books = template.books.replanned(
                attempt.txid, read.ids, records, self._locate(attempt, batch), repointed
            )
        fused = None
        if template.fused is not None:
            fused = (repointed.frame(template.fused.frame), template.fused, template.schemas)
        counted = None
        if template.one_job and read.pending is not None and read.pending.tasks == 1:
            # A batch of several partitions is counted apart: the one job's one task
            # would read them in turn (more latency on Kafka's four: analysis.md).
            counted = repointed.observation(template.read)
        return _Replanned(inputs, collects, books, fused, counted)

    def _keep(
        self,
        batch: Any,
        inputs: list[Inputs],
        collects: list[Inputs],
        books: AttemptLedger | None,
        collected: Mapping[Any, Any],
        read: Any = None,
    ) -> None:
        """The attempt's plans kept as the template later attempts re-point; if Spark
        would not re-point them all (``Engine.replan``), every attempt builds its own.
        The collect plans of a batch of one task are also kept as one frame (``Fused``):
        one job for all of them, in the schemas their own jobs gave (``collected``).
        ``read``: the batch's observation (``Pending.root``), if it was deferred; when
        every committer collects, by one job of one stage, that job counts each later
        batch (``_Template.one_job``)."""
        frames = [f for part in (*inputs, *collects) for f in part.values()]
        if books is not None:
            frames += books.frames()
        fused = None
        plans = _collect_frames(collects)
        if len(plans) > 1 and one_task(batch):
            fused = Fused(plans)
            frames.append(fused.frame)
        observed = books.observed() if books is not None else []
        if read is not None:
            observed.append(read)
        replan = self.engine.replan(frames, batch, observed)
        if replan is None:
            self.plans_once = False
            log.info(kv("plans_built_each_txid", reason="Spark cannot re-point them"))
            return
        schemas = {key: collected[key].schema for key in plans} if fused is not None else {}
        job = fused.frame if fused is not None else next(iter(plans.values()), None)
        one_job = (
            read is not None
            and all(collects)
            and (fused is not None or len(plans) == 1)
            and job is not None
            and holds(job, read)
            and one_stage(job)
        )
        self._template = _Template(
            replan, inputs, collects, books, fused, schemas, read, bool(one_job), batch
        )

    def _plans(
        self,
        attempt: TransactionAttempt,
        streams: dict[tuple[str, str], Any],
        plans: Plans,
        books: AttemptLedger | None = None,
    ) -> tuple[list[Inputs], list[Inputs]]:
        """Each committer's inputs, and its ``collect_plan`` (checked)."""
        nodes = self.topology.committers
        if books is not None:
            read = {ref: books.committer_input(ref, streams[ref]) for ref in self.terminal}
            streams = {**streams, **read}
        inputs = [{k: streams[ref] for k, ref in node.inputs.items()} for node in nodes]
        collects = []
        for node, given in zip(nodes, inputs, strict=True):
            maker = self._maker(node)
            with plans.calling(maker):
                plan = node.committer.collect_plan(attempt, given)
                plan = contracts.collect_plan(plan, self.engine.is_frame, maker.who, attempt.txid)
            plans.add(maker, plan.values())
            collects.append(dict(plan))
        return inputs, collects

    @staticmethod
    def _maker(node: Any) -> Maker:
        return Maker("committer", contracts.component("committer", node.name, node.committer))

    def _prepared(
        self,
        attempt: TransactionAttempt,
        inputs: Sequence[Mapping[str, Any]],
        collects: list[Inputs],
        made: list[Any],
        plans: Plans,
        fused: tuple[Any, Fused, dict[Any, Any]] | None = None,
    ) -> tuple[list[Any], dict[Any, Any]]:
        """Every committer's ``collect_plan`` collected together (by one job when
        ``fused``: the frame, how to split it, each part's schema), then each one's
        ``prepare_collected``; ``prepare`` for a committer that collects nothing. Also
        what was collected, by ``(committer, name)``."""
        nodes = self.topology.committers
        if fused is not None:
            frame, split, schemas = fused
            made.append(frame)
            collected = split.split(self.engine.collect({None: frame})[None], schemas)
        else:
            frames = _collect_frames(collects)
            made.extend(frames.values())
            collected = self.engine.collect(frames) if frames else {}
        prepared = []
        for n, (node, given, plan) in enumerate(zip(nodes, inputs, collects, strict=True)):
            with plans.calling(self._maker(node)):
                if not plan:
                    prepared.append(node.committer.prepare(attempt, given))
                    continue
                own = {name: collected[(n, name)] for name in plan}
                prepared.append(node.committer.prepare_collected(attempt, given, own))
        return prepared, collected

    def _bolts(
        self,
        attempt: TransactionAttempt,
        batch: Any,
        made: list[Any],
        plans: Plans,
        books: AttemptLedger | None = None,
    ) -> dict[tuple[str, str], Any]:
        is_frame = self.engine.is_frame
        txid = attempt.txid
        streams: dict[tuple[str, str], Any] = {(SPOUT, DEFAULT_STREAM): batch}
        for node in self.topology.bolts:
            who = contracts.component("bolt", node.name, node.bolt)
            maker = Maker("bolt", who, accounts=getattr(node.bolt, "accounts", False))
            outputs = tuple(node.bolt.outputs)
            given = streams[node.input]
            with nullcontext() if books is None else books.running(node):
                if books is not None:
                    given = books.bolt_input(node, given)
                with plans.calling(maker):
                    out = node.bolt.process(attempt, given)
                    out = contracts.bolt_streams(out, outputs, is_frame, who, "process", txid)
                    out = node.bolt.finish_batch(attempt, out)
                    out = contracts.bolt_streams(out, outputs, is_frame, who, "finish_batch", txid)
            plans.add(maker, out.values())
            if books is not None:
                books.outputs(node, out)
            for stream in outputs:
                streams[(node.name, stream)] = out[stream]
                made.append(out[stream])
        return streams
