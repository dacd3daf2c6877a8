"""``python -m tests.soak``: one long run of the tweet demo, thousands of small txids on
both sinks with its state in ZooKeeper and faults at a low rate throughout, watched
from outside for what grows (``make soak``: 10,000 txids, about two hours on 2 cores;
``--quick`` a few minutes, run by ``make test-soak``).

The run is the demo as a user starts it (``run --sink both --zookeeper ...``), one
record per partition per txid (three per txid), every tweet also counted under its id,
and these faults, each shown to have happened apart from the run's word where it can
be:

- exceptions injected at protocol steps (``--fail-rate``): the failed attempt replayed;
  counted from the run's own ``txid failed`` lines (the run injects them itself);
- ``zk restart`` every ``--fault-every`` seconds, in turn with ``redis restart``: the
  ZooKeeper server SIGKILLed and started again, seen by the run's report of its
  connection lost and back;
- ``redis restart``: the Redis server SIGKILLed and started from its append-only file
  (``appendfsync always``), seen by the server's new ``run_id`` and a commit after it.

Every ``--sample-every`` seconds the soak reads, with psutil and a ZooKeeper client of
its own: the driver's Python process and its Spark JVM (resident memory, threads, open
files; the Python process's resident memory also in its two parts, anonymous and
shared) and how many nodes the topology holds in ZooKeeper, against the txid the
Redis sink holds; and, from the JVM's own garbage-collection log, the heap that was
live after the last full collection. The driver's JVM runs with a fixed heap of ``HEAP``,
touched whole at its start (``-Xms``, ``-XX:+AlwaysPreTouch``): a JVM otherwise grows
its resident memory towards its maximum heap for hours, leak or none (a 2 GiB heap
went from 1.9 to 2.3 GiB over 1,000 txids, with 131 MiB live), so its RSS measures only
what lies outside the heap (threads, metaspace, code, buffers), and the live heap what
lies in it. The JIT is the JVM's full one, as in production (the tests' short-lived
demo processes use the quick one).

After the warm-up (the first ``--warm-up`` of the txids, and at least the 100 whose
metadata the store keeps for rewinds, so that its node count has reached its level) each figure's least-squares slope against the txid (of its running median of three samples: one sample's burst is no growth) must show no growth past its
allowance over the rest of the run (``LIMITS``): a leak of a thread, a file, a node or
memory per txid would show as a slope that, times thousands of txids, passes it. The
threads of delta-rs's runtime are counted apart from the rest, and their level must also
stay under a ceiling (``DELTA_RS_CEILING``): its pool grows in steps for a while (a quick
run judges only that ceiling, and not memory).

At the end both sinks are read with their own clients and judged record by record
(``tests.history``) against ``tests.reference``: nothing lost, duplicated, phantom or
left over. Exit 0 when the result is exact, every planned fault fired and every figure
is flat; else 1, saying why.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from coordinators import ZooKeeperStateStore
from tests.chaos import _terminated
from tests.history import judge, read_delta, read_redis
from tests.jvm import driver_opts
from tests.processes import DemoProcess, demo_env, redis_txid
from tests.provenance import commit
from tests.reference import expected_counts
from tests.witness import NotFired, run_id, waited, zk_nodes
from transactional.testing.servers import RedisServer, ZooKeeperServer

TOPOLOGY = "soak"
SESSION_S = 6
MIB = 1 << 20

#: How much each figure may grow over the run after the warm-up (slope x txids): an
#: absolute allowance, and for memory also a fraction of its level after the warm-up
#: (whichever is larger). Memory settles slowly (the JVM's heap grows to its working
#: size; Python's arenas fragment), a leak does not settle. The store's nodes move with
#: the txids in flight (up to ``--max-pending`` 3, a node each and one per partition),
#: and a quick run may still be filling the store's history past its warm-up: one beside
#: other tests went 388 -> 415 nodes from txid 101 to 174 and held there, a growth of 21
#: over its judged txids; 24 covers it, a node a txid is not (80 in a quick run). The driver's threads and open files
#: swing by about ten between samples as Spark's pools start threads and idle them out
#: (AQE's result-stage pool alone may hold 16; a 200-txid run in CI saw 400 to 410 and
#: back within a minute): 16 is that swing for files. Threads also step and stay a while:
#: a quick run beside the cluster suite went from about 398 to 412 for its last 25 txids,
#: which a slope over its 80 judged txids reads as a growth of 19 or 20; 32 is twice such a
#: step. A thread or a file leaked per txid is 80 in a quick run, thousands in the full.
#: delta-rs's runtime is judged apart (``DELTA_RS_CEILING``).
LIMITS: dict[str, tuple[float, float]] = {
    "python_rss_mib": (64.0, 0.10),
    "python_anon_mib": (64.0, 0.10),
    "python_file_mib": (64.0, 0.10),
    "jvm_rss_mib": (128.0, 0.10),
    "jvm_heap_mib": (64.0, 0.10),
    "threads": (32.0, 0.0),
    "delta_rs_threads": (16.0, 0.0),
    "open_files": (16.0, 0.0),
    "store_nodes": (24.0, 0.0),
}

#: The threads of delta-rs's runtime in the driver's Python process (tokio's, named
#: ``tokio-*``): two workers, and a pool for blocking file calls that starts a thread
#: whenever more calls run at once than it has idle threads, and lets a thread go only
#: after 10 s unused. It grows in steps when a table's commit writes a Delta checkpoint
#: (every ``delta.checkpointInterval``, 100 commits) and reads the commits since the last
#: one at once, and then holds, as a run calls it every second: measured alone (one
#: table, 1,300 MERGE commits), 8 threads, then 49 to 89 at its first checkpoint and
#: at most 92 after; in a quick soak (five tables) 8 to 71 over its first 110 txids, and
#: in a CI run a step past the warm-up that made the driver's threads grow 36 (when they
#: were judged together). A quick run ends before the pool has settled, so there its
#: level is judged against this ceiling and not its slope (the full soak judges both): a
#: thread leaked per txid passes it before the quick run's end.
DELTA_RS_CEILING = 160.0

#: Figures whose slope a quick run does not judge: memory, too short a run to settle
#: (judged by the full soak), and delta-rs's runtime (its ceiling is judged).
QUICK_UNJUDGED = (
    "python_rss_mib", "python_anon_mib", "python_file_mib", "jvm_rss_mib", "jvm_heap_mib",
    "delta_rs_threads",
)  # fmt: skip


@dataclass
class Sample:
    seconds: float
    txid: int
    python_rss_mib: float
    jvm_rss_mib: float
    #: The driver's threads (Python's and its JVM's) but delta-rs's runtime's.
    threads: int
    #: Threads of delta-rs's runtime in the driver's Python process (``tokio-*``).
    delta_rs_threads: int
    open_files: int
    store_nodes: int
    #: The heap live after the JVM's last full collection (None: none yet).
    jvm_heap_mib: float | None = None
    #: The driver's Python RSS in two parts (psutil's: the RSS less its shared pages, and
    #: the shared, on Linux /proc's ``RssFile`` and ``RssShmem``): what it allocated
    #: (heaps, allocators' arenas, stacks) and the pages of files it maps (its libraries'
    #: code), so that a growth says which it is.
    python_anon_mib: float | None = None
    python_file_mib: float | None = None


@dataclass
class Figure:
    name: str
    first: float
    last: float
    peak: float
    #: Growth per 1,000 txids after the warm-up (least squares).
    slope: float
    #: ``slope`` over the txids after the warm-up; and what it may be.
    growth: float
    allowed: float
    #: The level the figure may never pass (None: none).
    ceiling: float | None = None
    #: Whether its growth is judged (a quick run's memory and delta-rs's runtime: not).
    judged: bool = True

    @property
    def flat(self) -> bool:
        return self.problem is None

    @property
    def problem(self) -> str | None:
        """Why the figure is not flat (None: it is)."""
        if self.ceiling is not None and self.peak > self.ceiling:
            return f"{self.name} reached {self.peak:.0f} (ceiling {self.ceiling:.0f})"
        if self.judged and self.growth > self.allowed:
            return f"{self.name} grew {self.growth:.2f} (allowed {self.allowed:.1f})"
        return None


@dataclass
class Soak:
    txids: int
    samples: list[Sample] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=lambda: {"zk restart": 0, "redis restart": 0})
    planned: dict[str, int] = field(default_factory=lambda: {"zk restart": 0, "redis restart": 0})
    injected_failures: int = 0
    #: The JVM's full collections over the run (its GC log).
    full_collections: int = 0
    problems: list[str] = field(default_factory=list)


#: The driver JVM's heap in the soak: fixed, several times what it holds live (135 to
#: 250 MiB in a full soak), so that full collections come about once a minute (every
#: 14 s at 512m).
HEAP = "1g"
#: A full collection's line in the JVM's ``-Xlog:gc`` output (Parallel GC):
#: ``GC(57) Pause Full (Ergonomics) 300M->110M(491M) 200.1ms``.
FULL_GC = re.compile(r"Pause Full \([^)]*\) (\d+)M->(\d+)M\((\d+)M\)")


class GcLog:
    """The heap live after the last full collection, read from the JVM's GC log as it
    grows (the JVM writes it; nothing of the run's own code)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.live: float | None = None
        self.full_collections = 0

    def read(self) -> float | None:
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                text = log.read()
        except FileNotFoundError:
            return self.live
        complete = text[: text.rfind(b"\n") + 1]  # a line being written waits
        self.offset += len(complete)
        for match in FULL_GC.finditer(complete.decode("utf-8", "replace")):
            self.live = float(match.group(2))
            self.full_collections += 1
        return self.live


def jvm_options(gc_log: Path) -> str:
    """``SPARK_SUBMIT_OPTS`` of the soak's run: the tests' class archive with the full
    JIT, the heap fixed and touched at start, its collections logged."""
    heap = f"-Xms{HEAP} -XX:+AlwaysPreTouch"
    return f"{driver_opts(quick=False)} {heap} -Xlog:gc:file={gc_log}::filecount=0"


def _txid(redis_server: RedisServer) -> int:
    """The last txid the run's Redis sink holds."""
    return redis_txid(redis_server.url, "redis", TOPOLOGY)


def sample(pid: int, zk: Any, started: float, txid: int, heap: GcLog) -> Sample | None:
    """The driver's figures now (None: the process is gone, or the soak's own ZooKeeper
    client is between sessions after a ZooKeeper restart: the next sample counts)."""
    import psutil
    from kazoo.exceptions import KazooException

    try:
        nodes = sum(1 for _ in zk_nodes(zk, f"/transactional/{TOPOLOGY}"))
    except KazooException:
        return None
    try:
        driver = psutil.Process(pid)
        jvms = [p for p in driver.children(recursive=True) if p.name() == "java"]
        # A run on its way out (its JVM gone, or the driver a zombie) is not sampled:
        # its zeros would pull every slope down and hide a leak.
        if not jvms or driver.status() == psutil.STATUS_ZOMBIE:
            return None
        memory = driver.memory_info()  # on Linux, shared is RssFile + RssShmem
        py_rss, mapped = memory.rss / MIB, memory.shared / MIB
        jvm_rss = sum(p.memory_info().rss for p in jvms) / MIB
        delta_rs = delta_rs_threads(pid)
        threads = driver.num_threads() + sum(p.num_threads() for p in jvms) - delta_rs
        files = driver.num_fds() + sum(p.num_fds() for p in jvms)
    except psutil.Error:
        return None
    return Sample(
        round(time.monotonic() - started, 1), txid, round(py_rss, 1), round(jvm_rss, 1),
        threads, delta_rs, files, nodes, heap.read(), round(py_rss - mapped, 1), round(mapped, 1),
    )  # fmt: skip


def delta_rs_threads(pid: int) -> int:
    """The threads of ``pid`` that delta-rs's runtime started (their names, from
    /proc, begin with ``tokio``); ``psutil.NoSuchProcess`` if it is gone, as psutil's
    own readings say."""
    import psutil

    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        raise psutil.NoSuchProcess(pid) from None
    count = 0
    for task in tasks:
        try:
            count += (task / "comm").read_text().startswith("tokio")
        except OSError:
            continue  # a thread that ended while it was listed
    return count


#: The txids the store keeps the metadata of for rewinds (``ZooKeeperStateStore``'s
#: ``history``), and some: its node count grows until a run is past them (at 110 txids
#: a run was still 10 nodes short of its level).
STORE_HISTORY = ZooKeeperStateStore.history + 20


def warm_up(txids: int, fraction: float) -> int:
    """The txid the warm-up ends at: ``fraction`` of the run, and past the store's
    history in any case."""
    return max(int(txids * fraction), STORE_HISTORY)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of ``points`` (0 when they all have one x)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def running_median(values: Sequence[float]) -> list[float]:
    """``values`` smoothed by a running median of three, the ends by Tukey's end-point
    rule (the median of the end value, its smoothed neighbour, and the line through the
    next two smoothed values): one sample's burst is no growth (a quick run's open files
    went 443 -> 505 -> (end) at its last sample, which a slope reads as 27), what holds
    for two samples or more is; a straight line is left as it is."""
    n = len(values)
    if n < 3:
        return list(values)
    out = [values[0], *(sorted(values[i - 1 : i + 2])[1] for i in range(1, n - 1)), values[-1]]
    out[0] = sorted((values[0], out[1], 3 * out[1] - 2 * out[2]))[1]
    out[-1] = sorted((values[-1], out[-2], 3 * out[-2] - 2 * out[-3]))[1]
    return out


def figures(
    samples: Sequence[Sample], warm_txid: int, last_txid: int, quick: bool = False
) -> list[Figure]:
    """Each figure after the warm-up: its level, slope and growth against its limit,
    delta-rs's runtime also against its ceiling over the whole run (none without
    samples); ``quick``: the growth of ``QUICK_UNJUDGED`` not judged."""
    after = [s for s in samples if s.txid >= warm_txid] or list(samples)
    if not after:
        return []
    span = max(last_txid - warm_txid, 1)
    out = []
    for name, (absolute, fraction) in LIMITS.items():
        # A figure known only from some point (the live heap: from the first full
        # collection) is judged from there, and not at all from fewer than 3 samples.
        points = [(s.txid, float(v)) for s in after if (v := getattr(s, name)) is not None]
        if len(points) < 3:
            continue
        values = [v for _, v in points]
        per_txid = slope(list(zip([x for x, _ in points], running_median(values), strict=True)))
        allowed = max(absolute, fraction * values[0])
        ceiling, peak = None, max(values)
        if name == "delta_rs_threads":
            ceiling, peak = DELTA_RS_CEILING, max(s.delta_rs_threads for s in samples)
        out.append(
            Figure(name, values[0], values[-1], peak, per_txid * 1000, per_txid * span,
                   allowed, ceiling, judged=not (quick and name in QUICK_UNJUDGED))
        )  # fmt: skip
    return out


def _unjudged(f: Figure) -> str:
    """What the table's verdict on ``f`` leaves out."""
    ceiling = f", its peak under {f.ceiling:.0f}" if f.ceiling is not None else ""
    if not f.judged:
        return f" (growth not judged{ceiling})"
    return f" (and its peak under {f.ceiling:.0f})" if f.ceiling is not None else ""


def table(result: Soak, figs: Sequence[Figure]) -> str:
    lines = [
        f"{'figure':<16} {'after warm-up':>13} {'at the end':>11} {'peak':>9} "
        f"{'slope/1k txids':>15} {'growth':>9} {'allowed':>9}  flat",
    ]
    for f in figs:
        lines.append(
            f"{f.name:<16} {f.first:>13.1f} {f.last:>11.1f} {f.peak:>9.1f} "
            f"{f.slope:>15.3f} {f.growth:>9.2f} {f.allowed:>9.1f}  {'yes' if f.flat else 'NO'}"
            f"{_unjudged(f)}"
        )
    faults = ", ".join(f"{k}: {v} of {result.planned[k]}" for k, v in result.faults.items())
    lines.append(
        f"faults fired: {faults}; injected failures: {result.injected_failures}; "
        f"full collections of the JVM's heap ({HEAP}): {result.full_collections}"
    )
    return "\n".join(lines)


class Faults:
    """The soak's own faults, in turn, each waited on until its witness saw it."""

    def __init__(self, zookeeper: ZooKeeperServer, redis: RedisServer, result: Soak) -> None:
        self.zookeeper, self.redis, self.result = zookeeper, redis, result
        self.turn = 0

    def next(self, run: DemoProcess) -> str:
        kind = ("zk restart", "redis restart")[self.turn % 2]
        self.turn += 1
        self.result.planned[kind] += 1
        seen = self.zk_restart(run) if kind == "zk restart" else self.redis_restart()
        self.result.faults[kind] += 1
        return f"{kind}: {seen}"

    def zk_restart(self, run: DemoProcess) -> str:
        logged = len(run.output())
        self.zookeeper.stop()
        self.zookeeper.start()
        run.wait_said(r"zookeeper connection lost", timeout=60, since=logged)
        run.wait_said(r"zookeeper connection back", timeout=60, since=logged)
        return "the run reported its connection lost and back"

    def _held(self) -> int:
        """The txid the Redis sink holds; -1 while Redis cannot say (restarted, it
        answers "loading" until it has read its append-only file back)."""
        import redis

        try:
            return redis_txid(self.redis.url, "redis", TOPOLOGY)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return -1

    def redis_restart(self) -> str:
        before, at = run_id(self.redis.port), redis_txid(self.redis.url, "redis", TOPOLOGY)
        self.redis.stop()
        self.redis.start()
        if run_id(self.redis.port) == before:
            raise NotFired(f"redis restart: the server's run_id is still {before}")
        waited("redis restart: a commit after it", lambda: self._held() > at or None, 120)
        return "a new run_id, and a commit after it"


def run_args(
    data: Path, work: Path, zk: str, redis_url: str, fail_rate: float, zk_restarts: int
) -> list[str]:
    """The demo's command line. Each ZooKeeper restart takes the leadership from the run
    once, so its budget of re-elections is the most ``zk_restarts`` the soak may make
    and one more: the default (10) is what a full soak of 108 min used up exactly, and a
    slower one, restarting ZooKeeper an eleventh time, was stopped by it (2026-12-07)."""
    return [
        "run", "--input", str(data), "--spout", "opaque", "--sink", "both",
        "--redis-url", redis_url, "--delta-path", str(work / "delta"),
        "--zookeeper", zk, "--zk-session-timeout", str(SESSION_S),
        "--state-dir", str(work / "state"), "--topology-id", TOPOLOGY,
        "--record-ids", "--batch-size", "1", "--max-pending", "3",
        "--max-attempts", "30", "--max-reelections", str(zk_restarts + 1),
        "--until-drained", "--master", "local[2]",
        "--top", "0", "--fail-rate", str(fail_rate), "--fail-seed", "11",
    ]  # fmt: skip


def soak(args: argparse.Namespace, say: Callable[[str], None]) -> Soak:
    from kazoo.client import KazooClient

    from examples.tweets.cli import main as demo

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    data = work / "tweets"
    result = Soak(args.txids)
    generate = ["generate", "--count", str(args.txids * 3), "--seed", "5", "--partitions", "3"]
    assert demo([*generate, "--bad-rate", "0.05", "--out", str(data)], out=io.StringIO()) == 0
    expected = expected_counts(data)
    zookeeper, redis_server = ZooKeeperServer(), RedisServer(appendonly=True)
    zookeeper.start()
    redis_server.start()
    zk = KazooClient(hosts=zookeeper.hosts)
    run = None
    try:
        zk.start(timeout=30)
        # Faults alternate, one every --fault-every seconds until --timeout at most.
        zk_restarts = math.ceil(args.timeout / args.fault_every / 2)
        argv = run_args(data, work, zookeeper.hosts, redis_server.url, args.fail_rate, zk_restarts)
        heap = GcLog(work / "gc.log")
        env = demo_env(SPARK_SUBMIT_OPTS=jvm_options(heap.path))
        run = DemoProcess([*argv, "--conf", f"spark.driver.memory={HEAP}"], work / "run.log", env)
        say(f"run started (pid {run.pid}); {args.txids} txids, log {work / 'run.log'}")
        started = time.monotonic()
        faults = Faults(zookeeper, redis_server, result)
        next_sample, next_fault = started, started + args.fault_every
        committed = 0
        while run.poll() is None:
            now = time.monotonic()
            if now - started > args.timeout:
                result.problems.append(f"the run did not drain in {args.timeout:.0f}s")
                break
            if now >= next_sample:
                committed = max(committed, _txid(redis_server))
                taken = sample(run.pid, zk, started, committed, heap)
                # A run that has committed its last txid (before the reading or during
                # it) is on its way out, its Spark stopping (a quick run's threads were
                # read at a quarter of their level there): not sampled.
                if taken is not None and max(committed, _txid(redis_server)) < args.txids:
                    result.samples.append(taken)
                    if len(result.samples) % 20 == 0:
                        say(f"txid {committed} of {args.txids}: {taken}")
                next_sample = now + args.sample_every
            if now >= next_fault and committed < args.txids * 0.95:
                say(faults.next(run))
                next_fault = time.monotonic() + args.fault_every
            time.sleep(0.2)
        code = run.wait(timeout=120)
        if code != 0:
            result.problems.append(f"the run exited {code}: {run.tail(1500)}")
        result.injected_failures = run.output().count("error=InjectedFault")
        heap.read()
        result.full_collections = heap.full_collections
        last = redis_txid(redis_server.url, "redis", TOPOLOGY)
        if last == 0:  # a run refused at start leaves no tables to read
            result.problems.append("the run committed nothing")
            return result
        for image in (read_redis(redis_server.url), read_delta(work / "delta", last)):
            verdict = judge(image, expected)
            if not verdict.exact:
                result.problems.append(f"{image.sink}: {verdict}")
    finally:
        if run is not None and run.poll() is None:
            run.kill()
        zk.stop()
        zk.close()
        zookeeper.close()
        redis_server.close()
        if args.keep:
            say(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick", action="store_true",
        help="200 txids, a fault every 25 s, memory shown but not judged, delta-rs's "
        "threads judged by their ceiling only",
    )  # fmt: skip
    p.add_argument("--txids", type=int, help="txids of three records (default 10000)")
    p.add_argument("--fault-every", type=float, help="seconds between faults (default 300)")
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--warm-up", type=float, help="fraction of the txids (0.2; quick 0.5)")
    p.add_argument("--fail-rate", type=float, default=0.01, help="injected exceptions")
    p.add_argument("--timeout", type=float, help="seconds the run may take (default 4 h)")
    p.add_argument("--json", type=Path, help="write the samples and figures here")
    p.add_argument("--markdown", type=Path, help="write the table here, with the commit")
    p.add_argument("--keep", action="store_true", help="keep the work directory (run log, tables)")
    return p


def _markdown(argv: Sequence[str], seconds: float, tables: str, passed: bool) -> str:
    """The soak's record: how it was run, where, and its table as printed."""
    command = " ".join(["python -m tests.soak", *argv])
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    verdict = "passed" if passed else "FAILED"
    return (
        "# Soak: the last full run\n\n"
        f"`{command}` at commit `{commit()}`, {when}, on {os.cpu_count()} cores in "
        f"{seconds // 60:.0f} min: {verdict}. Written by the soak itself (`--markdown`); "
        "every sample as JSON with `--json`. What it runs and how each figure is judged: "
        "`tests/soak.py`'s docstring.\n\n"
        f"```text\n{tables.rstrip()}\n```\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.txids = args.txids or (200 if args.quick else 10_000)
    args.fault_every = args.fault_every or (25.0 if args.quick else 300.0)
    args.warm_up = args.warm_up or (0.5 if args.quick else 0.2)
    args.timeout = args.timeout or (900.0 if args.quick else 4 * 3600.0)
    signal.signal(signal.SIGTERM, _terminated)

    def say(text: str) -> None:
        print(f"soak: {text}", flush=True)

    began = time.monotonic()
    result = soak(args, say)
    figs = figures(result.samples, warm_up(args.txids, args.warm_up), args.txids, args.quick)
    tables = table(result, figs)
    print(tables, flush=True)
    result.problems.extend(f.problem for f in figs if f.problem)
    if not args.quick and "jvm_heap_mib" not in {f.name for f in figs}:
        result.problems.append(
            "the live heap was not judged: fewer than 3 samples after a full collection "
            f"past the warm-up ({result.full_collections} full collections in all)"
        )
    for kind, planned in result.planned.items():
        if planned == 0 or result.faults[kind] < planned:
            result.problems.append(f"{kind}: {result.faults[kind]} of {planned} planned fired")
    if result.injected_failures == 0:
        result.problems.append("no injected failure happened")
    if len(result.samples) < 10:
        result.problems.append(f"only {len(result.samples)} samples")
    if args.json:
        figures_json = {
            **{k: v for k, v in asdict(result).items() if k != "samples"},
            "samples": [asdict(s) for s in result.samples],
            "figures": [{**asdict(f), "flat": f.flat} for f in figs],
        }
        args.json.write_text(json.dumps(figures_json, indent=1))
    if args.markdown:
        passed = not result.problems
        args.markdown.write_text(
            _markdown(argv or sys.argv[1:], time.monotonic() - began, tables, passed)
        )
    for problem in result.problems:
        print(f"soak: FAILED: {problem}", file=sys.stderr, flush=True)
    if not result.problems:
        print("soak: exact on both sinks, every fault fired, every figure flat", flush=True)
    return 1 if result.problems else 0


if __name__ == "__main__":
    sys.exit(main())
