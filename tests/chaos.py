"""``python -m tests.chaos``: a fault campaign against the tweet demo at scale (``make
chaos``; not part of ``make test``), with a per-record checker and one table at the end.

Everything runs as it would in production, on loopback: the state in ZooKeeper, the
Redis sink on a Redis Cluster (three masters, a replica each, ``appendfsync always``),
the Delta sink beside it (``--sink both``), Spark on a standalone master with two
workers. For each spout kind the demo counts an input with bad records
(``generate --bad-rate``), every tweet also counted under its id (``--record-ids``),
with exceptions injected at protocol steps (``--fail-rate``), while the campaign, each
time the run has committed something new, injects one of these (the kinds after the
first in turn, those that leave the run going before the random kill):

- ``kill -9 at <step>``: SIGKILL at a protocol step (``--crash-at STEP:TXID``, planned
  for every other run as it starts), the steps taken in turn (from a different step
  for each spout kind); a run that passes the
  txid without reaching the step is killed at once (counted as ``kill -9 random``);
- ``kill -9 random``: SIGKILL of the whole run at a random moment;
- ``zk session expiry``: the run frozen (SIGSTOP) until ZooKeeper has expired its
  session, then resumed, as after a long GC pause;
- ``zk restart``: the ZooKeeper server SIGKILLed and started again;
- ``redis failover``: the master of the campaign's Redis slot SIGKILLed until its
  replica has taken over, then started again (it rejoins as a replica);
- ``redis restart``: that master SIGKILLed and started again at once (before a
  failover), from its append-only file;
- ``worker kill``: a Spark worker (and its executor) SIGKILLed, a new one started.

Each is counted only once a witness apart from the run has seen it take effect
(``tests.witness``): a kill by the run's exit status (SIGKILL), a session expiry by
ZooKeeper no longer holding the run's ephemeral nodes, a ZooKeeper restart by the run's
own report of its connection lost and back, a failover by a replica's ``INFO`` saying
it is the master, a Redis restart by the node's new ``run_id``, a worker kill by the
driver's REST API listing an executor lost. A planned fault that no witness saw is "not
fired", named in the output, and fails the campaign.

A killed or failed run is started again with the same arguments; after the last fault,
runs are repeated until one drains. Then both sinks are read back with their own
clients (redis-py, ``deltalake``) and judged record by record by ``tests.history``
against ``tests.reference`` (computed from the input files alone): each tweet id must be
counted exactly once and each bad line be a dead letter exactly once (a tweet counted 0
times is lost, twice is a duplicate), nothing may be there that no input record
explains (a phantom) or that an undone attempt left (a leftover), and every hashtag,
user and pair count must match.

Midway, once a run has gone on after a fault, both sinks are read and judged too
(``judge(midway=True)``: a record counted more often than the input holds it, a
phantom, a count past the records'), and what they hold wrong is put down to that
fault's kind: the second table.

Exit status: 0 when every planned fault fired and nothing is lost, duplicated, phantom,
left over or miscounted on either sink, at the end or midway, else 1. ``--every-kind``
goes on past ``--faults`` until every kind fired; ``--json`` and ``--markdown`` write
the figures and the tables (``make chaos`` writes ``tests/CHAOS.md``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.history import judge, read_delta, read_redis
from tests.jvm import worker_python
from tests.processes import DemoProcess, redis_txid, wait_session_gone
from tests.provenance import commit
from tests.reference import Expected, expected_counts, input_files, lines_of
from tests.witness import (
    Moot,
    NotFired,
    app_id,
    executors_in_session,
    killed_by_sigkill,
    replicas_of,
    run_id,
    wait_executor_lost,
    wait_promoted,
    wait_sessions_expired,
    waited,
    zk_sessions,
)
from transactional.faults import CRASH_MARKER, FaultPoint
from transactional.testing.cluster_servers import (
    RedisCluster,
    SparkMaster,
    SparkWorker,
)
from transactional.testing.servers import ZooKeeperServer, free_port

SPOUTS = ("transactional", "partitioned", "opaque")
PROCESS_KINDS = (
    "kill -9 at step",
    "kill -9 random",
    "zk session expiry",
    "zk restart",
    "redis failover",
    "redis restart",
    "worker kill",
)
#: The steps ``kill -9 at step`` takes in turn.
STEPS = tuple(FaultPoint)
#: The ZooKeeper session of every run (seconds): a frozen run loses it after this.
SESSION_S = 4.0
VERDICT_COLUMNS = ("lost", "duplicated", "phantoms", "leftovers", "miscounted")
#: What a reading midway can find wrong (``tests.history.judge(midway=True)``).
MIDWAY_COLUMNS = ("duplicated", "phantoms", "miscounted")


@dataclass
class Campaign:
    spout: str
    topology_id: str
    prefix: str  # the Redis keys' hash tag: one slot, one master
    delta_path: Path
    runs: int = 0
    failed_runs: int = 0  # stopped with an error (exit 1/2), e.g. a sink down too long
    faults: Counter[str] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)  # kill -9 at each step
    injected: int = 0  # exceptions injected by --fail-rate, from the runs' logs
    drained: bool = False
    #: Planned faults no witness saw take effect, each saying which and why.
    not_fired: list[str] = field(default_factory=list)
    #: Faults that met no run (``witness.Moot``): neither counted nor failing.
    moot: list[str] = field(default_factory=list)
    #: Faults of the kinds taken in turn injected so far (the next kind's index).
    turn: int = 0
    #: The Spark UI port of the current run (its REST API witnesses executors lost).
    ui_port: int = 0
    #: The kind of the last fault witnessed, not yet followed by a reading of the sinks.
    last_kind: str | None = None
    #: By fault kind: the sinks read and judged midway after a fault of it
    #: (``readings``, ``unreadable``) and what was wrong in them.
    after: dict[str, Counter[str]] = field(default_factory=dict)
    #: What those readings found wrong, said in full.
    midway_notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Settings:
    spouts: tuple[str, ...]
    tweets: int
    batch: int  # per partition (x3 for the transactional spout)
    faults: int  # process-level faults per spout kind
    every_kind: bool  # and more, until each kind fired (at most three times as many)
    fail_rate: float
    bad_rate: float
    seed: int


@dataclass
class Servers:
    zookeeper: ZooKeeperServer
    redis: RedisCluster
    master: SparkMaster
    workers: list[SparkWorker]

    def close(self) -> None:
        for server in [*self.workers, self.master, self.zookeeper]:
            server.close()
        self.redis.close()


def _sink_txid(servers: Servers, campaign: Campaign) -> int:
    """The txid the Redis sink holds (-1: not readable now, e.g. mid-failover)."""
    try:
        url, topology = servers.redis.url, campaign.topology_id
        return redis_txid(url, "redis", topology, prefix=campaign.prefix, cluster=True)
    except Exception:
        return -1


def _progress(
    servers: Servers, campaign: Campaign, run: DemoProcess, since: int, timeout: float
) -> bool:
    """Wait until the run committed past ``since`` (True) or ended (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.poll() is not None:
            return False
        if _sink_txid(servers, campaign) > since:
            return True
        time.sleep(0.2)
    return False


def _more(campaign: Campaign, settings: Settings, fault: int) -> bool:
    """Whether the campaign injects another fault: ``faults`` of them, then, with
    ``every_kind``, more until every kind fired; never into a drained run."""
    if campaign.drained:
        return False
    if fault < settings.faults:
        return True
    missing = [k for k in PROCESS_KINDS if campaign.faults[k] == 0]
    return settings.every_kind and bool(missing) and fault < 3 * settings.faults


def _read_midway(campaign: Campaign, servers: Servers, expected: Expected) -> None:
    """Both sinks read and judged midway (``tests.history.judge(midway=True)``) once the
    run has gone on after a fault: what they hold wrong is put down to that fault's
    kind. A sink that cannot be read now (a Redis slot without a master) is counted
    ``unreadable``; the final reading judges it."""
    kind, campaign.last_kind = campaign.last_kind, None
    if kind is None:
        return
    tally = campaign.after.setdefault(kind, Counter())
    readers = {
        "redis": lambda: read_redis(servers.redis.url, campaign.prefix, cluster=True),
        "delta": lambda: read_delta(campaign.delta_path),
    }
    for sink, read in readers.items():
        try:
            image = read()
        except Exception as exc:
            tally["unreadable"] += 1
            campaign.midway_notes.append(f"after {kind}: {sink} unreadable ({exc!r:.200})")
            continue
        verdict = judge(image, expected, midway=True)
        tally["readings"] += 1
        for name in MIDWAY_COLUMNS:
            tally[name] += len(getattr(verdict, name))
        if not verdict.exact:
            campaign.midway_notes.append(f"after {kind}, midway: {verdict}")


def _finish(campaign: Campaign, run: DemoProcess, code: int) -> None:
    campaign.injected += run.output().count("error=InjectedFault")
    if code == 0:
        campaign.drained = True
    elif code in (1, 2):
        campaign.failed_runs += 1


def _start(
    campaign: Campaign, settings: Settings, args: list[str], work: Path, crash: str | None
) -> DemoProcess:
    """The next run: same arguments, its own seed of injected exceptions, and a planned
    crash (``--crash-at``) if one is given."""
    campaign.runs += 1
    campaign.ui_port = free_port()
    seed = settings.seed * 1000 + SPOUTS.index(campaign.spout) * 100 + campaign.runs
    extra = ["--fail-seed", str(seed), *(["--crash-at", crash] if crash else [])]
    extra += ["--conf", f"spark.ui.port={campaign.ui_port}", "--conf", "spark.ui.enabled=true"]
    return DemoProcess([*args, *extra], work / f"run{campaign.runs}.log")


class Injector:
    """The faults that act on the servers or on a running run. Each returns what its
    witness (``tests.witness``) saw, or raises ``NotFired``: a fault is counted only once
    something apart from the run under test has seen it take effect."""

    def __init__(self, servers: Servers, rng: random.Random) -> None:
        self.servers = servers
        self.rng = rng

    def zk_session_expiry(self, run: DemoProcess) -> str:
        hosts = self.servers.zookeeper.hosts
        sessions = zk_sessions(hosts)  # the run's leader node, and any left by a dead run
        os.kill(run.pid, signal.SIGSTOP)  # the driver's Python: no heartbeat to ZooKeeper
        try:  # frozen until ZooKeeper itself has expired the sessions, as a long GC pause
            owners = wait_sessions_expired(hosts, sessions, timeout=SESSION_S * 4 + 20)
        finally:
            os.kill(run.pid, signal.SIGCONT)
        return f"ZooKeeper expired {len(sessions)} session(s); owners now {len(owners)}"

    def zk_restart(self, run: DemoProcess) -> str:
        logged = len(run.output())
        self.servers.zookeeper.stop()
        time.sleep(self.rng.uniform(0.2, 3.0))  # the outage: the fault's own length
        self.servers.zookeeper.start()

        def reported() -> str | None:
            said = run.output()[logged:]
            if "zookeeper connection lost" in said and (
                "zookeeper connection back" in said or run.poll() is not None
            ):
                return said
            if run.poll() is not None:
                _moot_if_done(run, "zk restart")
            return None

        waited("zk restart: the run's report of its connection lost and back", reported, 60)
        return "the run reported its ZooKeeper connection lost and back"

    def redis_failover(self, prefix: str) -> str:
        master = self.servers.redis.master_of(prefix)
        running = [n.port for n in self.servers.redis.nodes if n.proc is not None]
        replicas = replicas_of(running, master.port)
        master.stop()
        promoted = wait_promoted(replicas, timeout=60)  # the cluster's failover, seen
        master.start()  # it rejoins as a replica of the promoted one
        return f"replica {promoted} promoted in place of {master.port}"

    def redis_restart(self, prefix: str) -> str:
        master = self.servers.redis.master_of(prefix)
        before = run_id(master.port)
        master.stop()
        master.start()  # back before the cluster's node timeout: no failover
        after = run_id(master.port)
        if before is None or after is None or after == before:
            raise NotFired(f"redis restart: node {master.port} run_id {before} -> {after}")
        return f"node {master.port} restarted (run_id {before[:8]} -> {after[:8]})"

    def worker_kill(self, run: DemoProcess, ui_port: int) -> str:
        workers = self.servers.workers
        try:
            app = waited("worker kill: the run's application id", lambda: app_id(ui_port), 60)

            def hosted() -> dict[int, set[str]] | None:
                """The run's executors on each worker, from the processes themselves
                (one may run none of the run's yet: a replacement still starting one)."""
                found = {
                    i: executors_in_session(w.proc.pid, app)
                    for i, w in enumerate(workers)
                    if w.proc is not None
                }
                return {i: ids for i, ids in found.items() if ids} or None

            hosts = waited("worker kill: an executor of the run on a worker", hosted, 60)
        except NotFired:
            _moot_if_done(run, "worker kill")
            raise
        victim = sorted(hosts)[self.rng.randrange(len(hosts))]
        # SIGKILL, then its directory (the executors' copies of the jars) removed.
        workers[victim].close()
        try:
            lost = wait_executor_lost(ui_port, hosts[victim], timeout=60)
        except NotFired:
            _moot_if_done(run, "worker kill")
            raise
        finally:
            replacement = SparkWorker(self.servers.master)
            replacement.start()
            workers[victim] = replacement
        return f"executor {lost['id']} lost ({lost.get('removeReason', 'no reason given')})"


def _moot_if_done(run: DemoProcess, kind: str) -> None:
    """Raise ``Moot`` if ``run`` has exited 0 (drained): the fault came too late for it."""
    if run.poll() == 0:
        raise Moot(f"{kind}: the run drained and exited 0 before the fault reached it")


def _first_step(spout: str) -> int:
    """Where in ``STEPS`` the spout kind's turn of kills starts: spread over the steps,
    so that a short campaign, a kill at a step or two per kind, kills at different
    steps for each kind rather than at the first step three times."""
    return SPOUTS.index(spout) * len(STEPS) // len(SPOUTS)


def _in_turn(turn: int) -> str:
    """The kind of the ``turn``-th fault of the kinds taken in turn: the five that leave
    the run going first, then a kill at a random moment, which ends it."""
    kinds = PROCESS_KINDS[2:] + PROCESS_KINDS[1:2]
    return kinds[turn % len(kinds)]


def _inject(inject: Injector, kind: str, run: DemoProcess, campaign: Campaign) -> str:
    """Inject one fault of ``kind`` into ``run``; what its witness saw (``NotFired``:
    nothing)."""
    if kind == "kill -9 random":
        code = run.kill()
        _finish(campaign, run, code)
        killed_by_sigkill(code, kind)  # from the OS: the exit status of the run
        return f"exit {code}"
    if kind == "zk session expiry":
        return inject.zk_session_expiry(run)
    if kind == "zk restart":
        return inject.zk_restart(run)
    if kind == "redis failover":
        return inject.redis_failover(campaign.prefix)
    if kind == "redis restart":
        return inject.redis_restart(campaign.prefix)
    return inject.worker_kill(run, campaign.ui_port)


def run_campaign(
    campaign: Campaign,
    settings: Settings,
    args: list[str],
    work: Path,
    servers: Servers,
    expected: Expected,
    rng: random.Random,
    say: Callable[[str], None],
) -> None:
    inject = Injector(servers, rng)
    run: DemoProcess | None = None
    fault = 0
    crash: tuple[FaultPoint, int] | None = None
    try:
        while _more(campaign, settings, fault):
            # The other kinds in turn, so that a short campaign has each (a planned crash
            # at a step is decided at a run's start).
            kind = _in_turn(campaign.turn)
            if run is None:
                held = max(_sink_txid(servers, campaign), 0)
                crash = None
                if campaign.runs % 2 == 1:  # every other run crashes at the next step in turn
                    turn = _first_step(campaign.spout) + sum(campaign.steps.values())
                    step = STEPS[turn % len(STEPS)]
                    # Txids up to held + max_pending may be stored already: a replay meets
                    # no metadata write, so that step is planned past them.
                    ahead = 3 if step is FaultPoint.AFTER_STORE_META else rng.randrange(3)
                    crash = (step, held + 1 + ahead)
                run = _start(campaign, settings, args, work, crash and f"{crash[0]}:{crash[1]}")
            since = max(_sink_txid(servers, campaign), 0)
            if crash is not None:  # wait for the planned crash, or for the run to pass it
                deadline = time.monotonic() + 600
                while run.poll() is None and time.monotonic() < deadline:
                    if _sink_txid(servers, campaign) > crash[1] + 1:
                        break
                    time.sleep(0.2)
                _read_midway(campaign, servers, expected)
                if run.poll() is not None and CRASH_MARKER in run.output():
                    code = run.kill()
                    wait_session_gone(run.pid)
                    _finish(campaign, run, code)
                    fault += 1
                    what = f"kill -9 at {crash[0]}:{crash[1]}"
                    try:  # its exit status, from the OS: it died of its own SIGKILL
                        killed_by_sigkill(code, what)
                    except NotFired as exc:
                        campaign.not_fired.append(str(exc))
                        say(f"{campaign.spout}: fault {fault}: NOT FIRED: {exc}")
                    else:
                        campaign.faults["kill -9 at step"] += 1
                        campaign.steps[crash[0].value] += 1
                        campaign.last_kind = "kill -9 at step"
                        say(f"{campaign.spout}: fault {fault}: {what} (exit {code})")
                    run, crash = None, None
                    continue
                crash = None
                if run.poll() is None:  # passed the txid without the step: kill it now
                    kind = "kill -9 random"
                else:
                    code = run.kill()
                    _finish(campaign, run, code)
                    say(f"{campaign.spout}: run {campaign.runs} ended with {code} before its crash")
                    run = None
                    continue
            elif not _progress(servers, campaign, run, since, timeout=600):
                stuck = run.poll() is None  # no commit in 10 minutes: worth a look
                code = run.kill()
                wait_session_gone(run.pid)
                _finish(campaign, run, code)
                what = "was stuck; killed" if stuck else f"ended with {code}"
                say(f"{campaign.spout}: run {campaign.runs} {what} before a fault ({run.log})")
                run = None
                continue
            else:
                time.sleep(rng.uniform(0.0, 2.0))
            _read_midway(campaign, servers, expected)
            if run.poll() is not None:  # it drained (or failed) meanwhile: no fault to count
                _finish(campaign, run, run.kill())
                run = None
                continue
            fault += 1
            in_turn = kind == _in_turn(campaign.turn)  # not a kill in place of a crash
            if in_turn:
                campaign.turn += 1
            try:
                seen = _inject(inject, kind, run, campaign)
            except Moot as exc:  # the run drained first: that kind again, on the next run
                fault -= 1
                campaign.turn -= in_turn
                campaign.moot.append(str(exc))
                say(f"{campaign.spout}: moot: {exc} (run {campaign.runs})")
            except NotFired as exc:
                campaign.not_fired.append(str(exc))
                say(f"{campaign.spout}: fault {fault}: NOT FIRED: {exc} (run {campaign.runs})")
            else:
                campaign.faults[kind] += 1
                campaign.last_kind = kind
                say(f"{campaign.spout}: fault {fault}: {kind}: {seen} (run {campaign.runs})")
            if kind == "kill -9 random":
                wait_session_gone(run.pid)
                run = None
        for _ in range(10):  # drain: the last run goes on; a failed one is started again
            if campaign.drained:
                break
            if run is None:
                run = _start(campaign, settings, args, work, None)
            code = run.wait(timeout=1800)
            _finish(campaign, run, code)
            say(f"{campaign.spout}: run {campaign.runs} ended with {code}")
            run = None
        _read_midway(campaign, servers, expected)  # the last fault's, once the runs ended
    except BaseException:  # the campaign failed: leave no run behind
        if run is not None and run.poll() is None:
            run.kill()
        raise


def by_kind(campaigns: Sequence[Campaign]) -> tuple[Any, int]:
    """The table of the fault kinds: how many fired (seen by their witness), and what
    the sinks read midway after them held wrong; and the count of that."""
    from rich.table import Table

    table = Table(title="after each kind of fault (both sinks read midway)", title_justify="left")
    columns = ["fault", "fired", "readings", "unreadable", *MIDWAY_COLUMNS]
    for name in columns:
        table.add_column(name, justify="left" if name == "fault" else "right")
    wrong = 0
    for kind in PROCESS_KINDS:
        tally = sum((c.after.get(kind, Counter()) for c in campaigns), Counter())
        wrong += sum(tally[k] for k in MIDWAY_COLUMNS)
        fired = sum(c.faults[kind] for c in campaigns)
        table.add_row(kind, str(fired), *(str(tally[k]) for k in columns[2:]))
    for c in campaigns:
        for what in c.midway_notes:
            print(f"{c.spout}: {what}", file=sys.stderr)
    return table, wrong


def report(
    campaigns: Sequence[Campaign], expected: Expected, servers: Servers
) -> tuple[Any, int, Counter[str], list[dict[str, Any]]]:
    """The table of the campaigns, each sink judged record by record (``tests.history``,
    read with redis-py and ``deltalake``), the count of what is wrong, the faults, and
    each row's figures."""
    from rich.table import Table

    table = Table(title="chaos campaign", title_justify="left")
    columns = ["spout", "sink", "runs", "errored", *PROCESS_KINDS, "not fired", "exceptions"]
    columns += ["bad records", "records", *VERDICT_COLUMNS]
    for name in columns:
        table.add_column(name, justify="left" if name in ("spout", "sink") else "right")
    failures = 0
    totals: Counter[str] = Counter()
    rows: list[dict[str, Any]] = []
    for c in campaigns:
        totals.update(c.faults)
        totals["exceptions"] += c.injected
        totals["bad records"] += len(expected.dead_letters)
        totals["not fired"] += len(c.not_fired)
        totals["moot"] += len(c.moot)
        failures += len(c.not_fired)  # a planned fault no witness saw fails the campaign
        for reason in c.not_fired:
            print(f"{c.spout}: not fired: {reason}", file=sys.stderr)
        images = [
            read_redis(servers.redis.url, c.prefix, cluster=True),
            read_delta(c.delta_path),
        ]
        for verdict in (judge(image, expected) for image in images):
            figures = verdict.figures()
            bad = sum(figures[k] for k in VERDICT_COLUMNS)
            failures += bad + (0 if c.drained else 1)  # an undrained campaign fails too
            if not verdict.exact:
                print(verdict, file=sys.stderr)
            rows.append(
                {"spout": c.spout, "sink": verdict.sink, "runs": c.runs, "drained": c.drained}
                | {
                    "faults": dict(c.faults),
                    "not fired": c.not_fired,
                    "moot": c.moot,
                    "exceptions": c.injected,
                }
                | figures
            )
            table.add_row(
                c.spout,
                verdict.sink,
                str(c.runs),
                str(c.failed_runs),
                *(str(c.faults[k]) for k in PROCESS_KINDS),
                str(len(c.not_fired)),
                str(c.injected),
                f"{len(expected.dead_letters):,}",
                f"{verdict.records:,}",
                *(str(figures[k]) for k in VERDICT_COLUMNS[:-1]),
                str(figures["miscounted"]) + ("" if c.drained else " (not drained)"),
            )
    return table, failures, totals, rows


def _markdown(figures: dict[str, Any], tables: str) -> str:
    """The campaign's record: how it was run, where, and its tables as printed."""
    command = " ".join(["python -m tests.chaos", *figures["argv"]])
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "# Chaos campaign: the last full run\n\n"
        f"`{command}` at commit `{figures['commit']}`, {when}, on {os.cpu_count()} cores "
        f"in {figures['seconds'] // 60} min. Written by the campaign itself "
        "(`--markdown`); the figures as JSON with `--json`. How it works and what each "
        'column means: docs/concepts/guarantees.md, "The chaos campaign".\n\n'
        f"```text\n{tables.rstrip()}\n```\n"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one spout kind, a small input")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--tweets", type=int, help="input lines (default 6000; quick 300)")
    p.add_argument("--faults", type=int, help="process-level faults per spout kind (default 50)")
    p.add_argument("--fail-rate", type=float, default=0.3, help="injected exceptions")
    p.add_argument("--bad-rate", type=float, default=0.05, help="bad input records")
    p.add_argument("--spouts", nargs="+", choices=SPOUTS, help="default: all (quick: opaque)")
    p.add_argument(
        "--every-kind",
        action="store_true",
        help="past --faults, go on until every kind of fault fired (up to 3x --faults)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", type=Path, help="write the figures to this file as JSON")
    p.add_argument("--markdown", type=Path, help="write the tables to this Markdown file")
    return p


def start_servers(say: Callable[[str], None]) -> Servers:
    zookeeper = ZooKeeperServer()
    redis = RedisCluster(masters=3, replicas=1, node_timeout_ms=2000)
    master = SparkMaster()
    servers = Servers(zookeeper, redis, master, [SparkWorker(master), SparkWorker(master)])
    try:
        zookeeper.start()
        redis.start()
        master.start()
        for worker in servers.workers:
            worker.start()
    except BaseException:
        servers.close()
        raise
    say(
        f"servers: ZooKeeper {zookeeper.hosts}, Redis Cluster {redis.url} (3 masters, "
        f"a replica each), Spark {master.url} (2 workers)"
    )
    return servers


def run_args(
    campaign: Campaign, settings: Settings, data: Path, work: Path, servers: Servers
) -> list[str]:
    batch = settings.batch * (3 if campaign.spout == "transactional" else 1)
    conf = [
        f"spark.pyspark.python={worker_python()}",
        "spark.driver.host=127.0.0.1",
        "spark.driver.bindAddress=127.0.0.1",
        "spark.executor.memory=1g",
        "spark.sql.shuffle.partitions=4",
    ]
    return [
        "run", "--input", str(data), "--spout", campaign.spout,
        "--sink", "both", "--redis-url", servers.redis.url,
        "--redis-key-prefix", campaign.prefix, "--delta-path", str(campaign.delta_path),
        "--zookeeper", servers.zookeeper.hosts, "--zk-session-timeout", str(SESSION_S),
        "--state-dir", str(work / "state"), "--topology-id", campaign.topology_id,
        "--record-ids", "--batch-size", str(batch), "--max-pending", "3",
        "--max-attempts", "30", "--until-drained", "--master", servers.master.url,
        *(item for setting in conf for item in ("--conf", setting)),
        "--top", "0", "--fail-rate", str(settings.fail_rate),
    ]  # fmt: skip


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # the servers and the run are stopped on the way out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    settings = Settings(
        spouts=tuple(args.spouts or (("opaque",) if args.quick else SPOUTS)),
        tweets=args.tweets or (300 if args.quick else 6000),
        batch=10,
        faults=args.faults if args.faults is not None else (6 if args.quick else 50),
        every_kind=args.every_kind,
        fail_rate=args.fail_rate,
        bad_rate=args.bad_rate,
        seed=args.seed,
    )
    from rich.console import Console

    # A table this wide needs room; a pipe or a log file has no width of its own.
    console = Console(record=True) if sys.stdout.isatty() else Console(width=220, record=True)
    started = time.monotonic()

    def say(text: str) -> None:
        console.log(text)

    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    servers = start_servers(say)
    try:
        from examples.tweets.cli import main as demo

        data = work / "tweets"
        generate = ["generate", "--count", str(settings.tweets), "--seed", str(settings.seed)]
        generate += ["--partitions", "3", "--bad-rate", str(settings.bad_rate)]
        demo([*generate, "--out", str(data)], out=io.StringIO())
        expected = expected_counts(data)
        lines = sum(len(lines_of(f)) for f in input_files(data))
        say(f"input: {lines:,} lines, {len(expected.dead_letters):,} of them bad")
        rng = random.Random(settings.seed)
        campaigns = []
        for spout in settings.spouts:
            c = Campaign(spout, f"chaos-{spout}", f"{{chaos-{spout}}}:", work / spout / "delta")
            (work / spout).mkdir(parents=True, exist_ok=True)
            arguments = run_args(c, settings, data, work / spout, servers)
            run_campaign(c, settings, arguments, work / spout, servers, expected, rng, say)
            campaigns.append(c)
        say("reading both sinks back")
        table, failures, totals, rows = report(campaigns, expected, servers)
        kinds, wrong_midway = by_kind(campaigns)
        failures += wrong_midway
        console.export_text()  # the tables alone go to --markdown
        console.print(table)
        console.print(kinds)
        process = sum(totals[k] for k in PROCESS_KINDS)
        steps = dict(sum((c.steps for c in campaigns), Counter()))
        seconds = time.monotonic() - started
        console.print(
            f"seed {settings.seed}, {lines:,} lines, {len(settings.spouts)} spout kinds x "
            f"2 sinks; faults, each seen to fire by a witness apart from the run: {process} "
            f"({', '.join(f'{k} {totals[k]}' for k in PROCESS_KINDS)}); not faults, and "
            f"not counted as such: {totals['exceptions']} exceptions injected into the "
            f"run (it reports each itself), {totals['bad records']} bad input records; "
            f"kill -9 by step: {steps}; not fired: {totals['not fired']}; moot (the run "
            f"drained first, planned again): {totals['moot']}; {seconds:.0f}s; "
            f"lost, duplicated, phantom, left over, miscounted (at the end or midway) or "
            f"not fired: {failures} (0 expected)"
        )
        figures = {
            "argv": list(argv if argv is not None else sys.argv[1:]),
            "commit": commit(),
            "seed": settings.seed,
            "lines": lines,
            "spouts": list(settings.spouts),
            "faults": {k: totals[k] for k in PROCESS_KINDS},
            "steps": steps,
            "exceptions": totals["exceptions"],
            "bad records": totals["bad records"],
            "not fired": totals["not fired"],
            "after": {
                k: dict(sum((c.after.get(k, Counter()) for c in campaigns), Counter()))
                for k in PROCESS_KINDS
            },
            "sinks": rows,
            "failures": failures,
            "seconds": round(seconds),
        }
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1) + "\n")
        if args.markdown:
            args.markdown.write_text(_markdown(figures, console.export_text()))
        return 0 if failures == 0 else 1
    finally:
        servers.close()
        if args.keep:
            console.print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
