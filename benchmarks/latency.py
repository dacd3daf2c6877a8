"""Latency, Kafka to Redis, exactly once (issue 54): the framework run by its own CLI
(``transactional run benchmarks.latency_topology:build``) against Structured Streaming
(the anchor: Kafka source, default trigger, ``foreachBatch`` writing with one idempotent
Lua script per batch), each a process of its own on ``local[*]`` with
``create_spark_session``'s defaults, one case after the other on the same servers.

Each case gets a fresh topic of ``PARTITIONS`` partitions and a fresh Redis key prefix.
A backlog of ``BACKLOG`` events, timestamped before the launch, is written first; the
consumer is launched at t0 and at once events are produced at ``rate`` per second
(each value: the event's epoch milliseconds as text) until ``warm_up`` + ``seconds``
seconds after the consumer has counted the backlog (its start-up). A poller reads the counts every ``POLL_S`` and notes when each 100 ms bucket's
count first equals what was produced into it, once the producer has moved past it; a
bucket's latency is that moment minus the bucket's end, over the buckets that end in
the last ``seconds``: steady state, start-up and its catching up left out. Start-up: from t0 until the backlog is all counted. At the end
every count is checked against what was produced.

    python -m benchmarks.latency [--seconds 45] [--rate 1000] [--warm-up 150] [--only TEXT]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.latency_topology import BUCKET_MS, TABLE

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(__file__).resolve().parent / ".work" / "latency"

#: The issue's measurement: events per second, measured seconds; and the warm-up,
#: seconds from the consumer's start-up (its backlog counted) to the measured window.
#: Each JVM compiles Spark's planning code for minutes: a small txid took 262 ms from
#: commit to commit after 90 txids and 187 ms after 460, where the JIT compiler used 196
#: and 57 ms of CPU per txid (benchmarks/analysis.md, second round). The figures are of
#: the process that has run a while, as a pipeline does; both sides get the same time.
RATE = 1000
SECONDS = 45.0
WARM_UP_S = 150.0
#: The topic's partitions, written round-robin.
PARTITIONS = 4
#: Events in the topic before the consumer starts, excluded from the latency figures.
BACKLOG = 2_000
#: How often the poller reads the counts, and how often the producer sends a burst.
POLL_S = 0.01
BURST_S = 0.01
#: How long a consumer may take to count the backlog before the case is given up.
STARTUP_S = 240.0
#: How long the counts may take to complete once the producer stopped.
DRAIN_S = 90.0
#: How long a consumer may take to stop after SIGTERM before its group is killed.
STOP_S = 30.0

#: The issue's tuned settings of the framework.
TUNED = (
    "--max-pending",
    "1",
    "--batch-size",
    "1000",
    "--poll-interval",
    "0.02",
    "--poll-max",
    "0.1",
)

Progress = Callable[[str], None]
#: librdkafka's lines: a fresh broker's "coordinator load in progress, retrying" is no
#: news (the delivery reports say what matters), only errors are.
LOG = logging.getLogger("benchmarks.latency")
LOG.setLevel(logging.ERROR)


@dataclass(frozen=True)
class LatencyCase:
    """One row: Structured Streaming, or the framework with ``settings``, flags of
    ``transactional run`` (empty: its defaults)."""

    name: str
    settings: tuple[str, ...] = ()
    structured_streaming: bool = False

    def described(self) -> str:
        if self.structured_streaming:
            return "default trigger, foreachBatch, one Lua script a batch"
        return f"`{' '.join(self.settings)}`" if self.settings else "the defaults"


STRUCTURED_STREAMING = LatencyCase("structured streaming", structured_streaming=True)
#: The rows, one after the other: the anchor; the framework with the tuned settings at
#: 1, 2 and 4 txids in flight; and with adaptive execution off (the low-latency profile
#: of docs/performance.md). (Its warm-up costs nothing here: the Kafka spout has no
#: sample batch.)
CASES: tuple[LatencyCase, ...] = (
    STRUCTURED_STREAMING,
    LatencyCase("framework, max_pending=1", TUNED),
    LatencyCase("framework, max_pending=2", ("--max-pending", "2", *TUNED[2:])),
    LatencyCase("framework, max_pending=4", ("--max-pending", "4", *TUNED[2:])),
    LatencyCase(
        "framework, max_pending=2, aqe off",
        ("--max-pending", "2", *TUNED[2:], "--conf", "spark.sql.adaptive.enabled=false"),
    ),
)


@dataclass
class LatencyResult:
    case: LatencyCase
    #: Buckets that end in the measured window, and the latency of each that completed.
    buckets: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    #: Seconds from the launch until the backlog was all counted, and until any count.
    startup_s: float | None = None
    first_count_s: float | None = None
    #: What was wrong with the counts or the run (none: exact).
    problems: list[str] = field(default_factory=list)
    log: Path | None = None
    #: The warm-up the figures came after (a start-up longer than it is in them).
    warm_up_s: float = 0.0

    def percentile(self, q: float) -> float | None:
        """Nearest rank."""
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    @property
    def exact(self) -> str:
        return "; ".join(self.problems) if self.problems else "exact"


class Produced:
    """What the producer wrote: events per bucket, and the bucket below which every
    count is final (the producer has moved past it). Written by the producer's thread,
    read by the poller's, under ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[int, int] = {}
        self.final_below = -1
        self.failed = 0  # deliveries the broker refused

    def add(self, bucket: int, events: int) -> None:
        with self.lock:
            self.counts[bucket] = self.counts.get(bucket, 0) + events

    def finalise_below(self, bucket: int) -> None:
        with self.lock:
            self.final_below = max(self.final_below, bucket)

    def final(self, exclude: Iterable[int]) -> dict[int, int]:
        """The final counts not in ``exclude``."""
        with self.lock:
            skip = set(exclude)
            below = self.final_below
            return {b: c for b, c in self.counts.items() if b < below and b not in skip}

    def delivered(self, error: Any, _message: Any) -> None:
        if error is not None:
            with self.lock:
                self.failed += 1


class Poller(threading.Thread):
    """Reads the counts every ``POLL_S`` (its own connection) and notes, per bucket, the
    wall-clock time its count first equalled the final produced count."""

    def __init__(self, redis_url: str, key: str, produced: Produced) -> None:
        super().__init__(name="latency-poller", daemon=True)
        self.redis_url, self.key, self.produced = redis_url, key, produced
        self.complete: dict[int, float] = {}  # bucket -> epoch seconds
        self.first_count: float | None = None
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            tick = time.monotonic()
            while not self._halt.is_set():
                self._poll(client)
                tick += POLL_S
                self._halt.wait(max(0.0, tick - time.monotonic()))
        except BaseException as exc:  # reported by the measurement
            self.error = exc
        finally:
            client.close()

    def _poll(self, client: Any) -> None:
        wanted = self.produced.final(self.complete)
        pipe = client.pipeline(transaction=False)
        pipe.hlen(self.key)
        if wanted:
            pipe.hmget(self.key, [str(b) for b in wanted])
        replies = pipe.execute()
        now = time.time()
        if self.first_count is None and replies[0]:
            self.first_count = now
        if wanted:
            for (bucket, count), held in zip(wanted.items(), replies[1], strict=True):
                if held is not None and int(held) == count:
                    self.complete[bucket] = now

    def stop(self) -> None:
        self._halt.set()
        self.join()


def _new_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(60)


def _producer(bootstrap: str) -> Any:
    """librdkafka's own lines (a retry while the fresh broker loads) go to ``LOG``."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            "acks": "all",
            "logger": LOG,
        }
    )


def _flush(producer: Any) -> None:
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"{left} events left unsent to Kafka after 60 s")


def _backlog(producer: Any, topic: str, produced: Produced) -> set[int]:
    """``BACKLOG`` events over the 2 s that end 1 s before now, all in Kafka on
    return; their buckets."""
    first = int(time.time() * 1000) - 3000
    buckets: set[int] = set()
    for i in range(BACKLOG):
        ms = first + i * 2000 // BACKLOG
        bucket = ms // BUCKET_MS
        produced.add(bucket, 1)
        buckets.add(bucket)
        producer.produce(
            topic, str(ms).encode(), partition=i % PARTITIONS, on_delivery=produced.delivered
        )
        producer.poll(0)
    _flush(producer)
    produced.finalise_below(max(buckets) + 1)
    return buckets


def _produce(
    producer: Any,
    topic: str,
    produced: Produced,
    rate: int,
    until: Callable[[], float | None],
    alive: Callable[[], bool],
) -> None:
    """``rate`` events a second until the epoch time ``until()`` (None: not known yet,
    at most ``STARTUP_S``), in a burst every ``BURST_S`` of what the schedule has due by
    then, so that the rate stays exact."""
    start = time.monotonic()
    sent = 0
    ticks = 0
    while alive():
        end = until()
        if (end is None and time.monotonic() - start > STARTUP_S) or (
            end is not None and time.time() >= end
        ):
            break
        now = time.monotonic()
        due = int((now - start) * rate)
        if due > sent:
            ms = int(time.time() * 1000)
            bucket = ms // BUCKET_MS
            produced.add(bucket, due - sent)  # counted before the consumer can see it
            value = str(ms).encode()
            for i in range(sent, due):
                producer.produce(
                    topic, value, partition=i % PARTITIONS, on_delivery=produced.delivered
                )
            sent = due
            produced.finalise_below(bucket)
        producer.poll(0)
        ticks += 1
        time.sleep(max(0.0, start + ticks * BURST_S - time.monotonic()))
    _flush(producer)
    with produced.lock:
        last = max(produced.counts)
    produced.finalise_below(last + 1)


def _transactional() -> list[str]:
    script = Path(sys.executable).with_name("transactional")
    return [str(script)] if script.exists() else [sys.executable, "-m", "transactional.cli"]


def _launch(
    case: LatencyCase, work: Path, bootstrap: str, topic: str, redis_url: str, prefix: str
) -> subprocess.Popen[bytes]:
    if case.structured_streaming:
        command = [sys.executable, "-m", "benchmarks.latency", "--structured-streaming"]
        command += ["--kafka", bootstrap, "--topic", topic, "--redis-url", redis_url]
        command += ["--key-prefix", prefix, "--checkpoint", str(work / "checkpoint")]
    else:
        command = [*_transactional(), "run", "benchmarks.latency_topology:build"]
        command += ["--topology-id", "latency", "--state-dir", str(work / "state")]
        command += list(case.settings)
    env = {
        **os.environ,
        "LATENCY_KAFKA": bootstrap,
        "LATENCY_TOPIC": topic,
        "LATENCY_REDIS_URL": redis_url,
        "LATENCY_KEY_PREFIX": prefix,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    with (work / "consumer.log").open("ab") as log:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(process: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM, a deadline, then SIGKILL of its group (its JVM, its Python workers);
    what it left of its group is killed too. Its exit code (None: killed)."""
    code: int | None = process.poll()
    if code is None:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            code = None
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return code


def _check(held: dict[int, int], produced: Produced, dead: int, result: LatencyResult) -> None:
    """Every bucket's count against what was produced into it."""
    lost = duplicated = 0
    for bucket, count in produced.counts.items():
        got = held.get(bucket, 0)
        lost += max(0, count - got)
        duplicated += max(0, got - count)
    strays = {b: c for b, c in held.items() if b not in produced.counts}
    if produced.failed:
        result.problems.append(f"{produced.failed} events not delivered to Kafka")
    if lost:
        result.problems.append(f"{lost} events lost")
    if duplicated:
        result.problems.append(f"{duplicated} events counted twice")
    if strays:
        result.problems.append(
            f"{len(strays)} buckets never produced ({sum(strays.values())} events)"
        )
    if dead:
        result.problems.append(f"{dead} dead letters")
    total, counted = sum(produced.counts.values()), sum(held.values())
    if total != counted and not (lost or duplicated or strays):
        result.problems.append(f"{counted} counted against {total} produced")


def measure_case(
    case: LatencyCase,
    index: int,
    bootstrap: str,
    redis_url: str,
    seconds: float,
    rate: int,
    warm_up: float,
    progress: Progress,
) -> LatencyResult:
    import redis

    run = uuid.uuid4().hex[:8]
    work = WORK / f"{index}-{run}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    topic, prefix = f"latency-{run}-{index}", f"latency:{run}:{index}:"
    key = prefix + TABLE
    result = LatencyResult(case, log=work / "consumer.log", warm_up_s=warm_up)
    _new_topic(bootstrap, topic)
    produced = Produced()
    producer = _producer(bootstrap)
    backlog = _backlog(producer, topic, produced)
    poller = Poller(redis_url, key, produced)
    poller.start()

    t0 = time.time()
    ready: list[float] = []  # when the backlog was all counted (epoch)

    def until() -> float | None:
        """The measured window ends ``warm_up + seconds`` after the backlog is counted."""
        if not ready and backlog <= poller.complete.keys():
            ready.append(max(poller.complete[b] for b in backlog))
        return ready[0] + warm_up + seconds if ready else None

    consumer = _launch(case, work, bootstrap, topic, redis_url, prefix)
    progress(f"latency: {case.name}: launched (log {result.log}), producing {rate}/s")
    try:
        _produce(producer, topic, produced, rate, until, lambda: consumer.poll() is None)
        deadline = time.monotonic() + DRAIN_S
        while (
            len(poller.complete) < len(produced.counts)
            and time.monotonic() < deadline
            and consumer.poll() is None
            and poller.error is None
        ):
            time.sleep(0.1)
    finally:
        early = consumer.poll()  # not None: it exited before it was told to stop
        code = _stop(consumer)
        poller.stop()
    if poller.error is not None:
        raise RuntimeError(f"the latency poller failed: {poller.error}") from poller.error

    begin = (ready[0] if ready else t0) + warm_up
    window = begin * 1000, (begin + seconds) * 1000
    measured = [b for b in produced.counts if window[0] < (b + 1) * BUCKET_MS <= window[1]]
    result.buckets = len(measured)
    result.latencies_ms = [
        poller.complete[b] * 1000 - (b + 1) * BUCKET_MS for b in measured if b in poller.complete
    ]
    if backlog <= poller.complete.keys():
        result.startup_s = max(poller.complete[b] for b in backlog) - t0
    if poller.first_count is not None:
        result.first_count_s = poller.first_count - t0
    incomplete = [b for b in produced.counts if b not in poller.complete]
    _record(work / "buckets.json", t0, produced, poller.complete, backlog, window)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        held = {int(b): int(c) for b, c in client.hgetall(key).items()}  # type: ignore[union-attr]
        dead = (
            int(client.get(prefix + "ss:bad") or 0)  # type: ignore[arg-type]
            if case.structured_streaming
            else int(client.llen(prefix + "dead_letters"))  # type: ignore[arg-type]
        )
    finally:
        client.close()
    if early is not None or code not in (None, 0, 130, -signal.SIGTERM):
        when = "before it was stopped" if early is not None else "when stopped"
        result.problems.append(f"the consumer exited with {code} {when} (log {result.log})")
    elif code is None:
        result.problems.append(f"the consumer did not stop within {STOP_S:.0f} s: killed")
    if incomplete:
        result.problems.append(f"{len(incomplete)} buckets incomplete after {DRAIN_S:.0f} s")
    _check(held, produced, dead, result)
    progress(
        f"latency: {case.name}: start-up {_seconds(result.startup_s)} s, "
        f"p99 {_ms(result.percentile(0.99))} ms, {result.exact}"
    )
    return result


def _part(bucket: int, backlog: set[int], window: tuple[float, float]) -> str:
    end = (bucket + 1) * BUCKET_MS
    if bucket in backlog:
        return "backlog"
    return "warm-up" if end <= window[0] else "measured" if end <= window[1] else "after"


def _record(
    path: Path,
    t0: float,
    produced: Produced,
    complete: dict[int, float],
    backlog: set[int],
    window: tuple[float, float],
) -> None:
    """Every bucket of the case (its end from the launch, its count, its latency), to
    see how the latency moves over the run."""
    rows = [
        {
            "bucket": b,
            "end_s": round((b + 1) * BUCKET_MS / 1000 - t0, 3),
            "count": count,
            "latency_ms": round(complete[b] * 1000 - (b + 1) * BUCKET_MS, 1)
            if b in complete
            else None,
            "part": _part(b, backlog, window),
        }
        for b, count in sorted(produced.counts.items())
    ]
    path.write_text(json.dumps({"launched": t0, "buckets": rows}, indent=1) + "\n")


def measure(
    progress: Progress,
    seconds: float = SECONDS,
    rate: int = RATE,
    warm_up: float = WARM_UP_S,
    cases: Sequence[LatencyCase] = CASES,
    redis_url: str | None = None,
    bootstrap_servers: str | None = None,
) -> list[LatencyResult]:
    """Each case alone, in turn; a Kafka broker and a Redis server are started for the
    measurement when not given (and stopped after it)."""
    with servers(bootstrap_servers, redis_url) as (kafka, redis):
        return [
            measure_case(case, i, kafka, redis, seconds, rate, warm_up, progress)
            for i, case in enumerate(cases)
        ]


@contextmanager
def servers(bootstrap_servers: str | None, redis_url: str | None) -> Iterator[tuple[str, str]]:
    """A Kafka broker's bootstrap servers and a Redis server's URL: those given, else
    servers started for the block and stopped after it."""
    from transactional.testing.servers import KafkaServer, RedisServer

    started: list[Any] = []
    try:
        if bootstrap_servers is None:
            kafka = KafkaServer()
            started.append(kafka)
            kafka.start()
            bootstrap_servers = kafka.bootstrap_servers
        if redis_url is None:
            redis_server = RedisServer()
            started.append(redis_server)
            redis_server.start()
            redis_url = redis_server.url
        yield bootstrap_servers, redis_url
    finally:
        for server in reversed(started):
            server.close()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def latency_table(results: Sequence[LatencyResult]) -> list[str]:
    """The table, then the issue's targets against the Structured Streaming row."""
    lines = [
        "| case | settings | buckets | p50 ms | p90 ms | p99 ms | max ms "
        "| start-up s (backlog) | exact |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        startup = _seconds(r.startup_s)
        if r.first_count_s is not None:
            startup += f" (first count {r.first_count_s:.1f})"
        lines.append(
            f"| {r.case.name} | {r.case.described()} | {r.buckets} | "
            f"{_ms(r.percentile(0.5))} | {_ms(r.percentile(0.9))} | "
            f"{_ms(r.percentile(0.99))} | {_ms(r.percentile(1.0))} | {startup} | {r.exact} |"
        )
    return [*lines, "", *targets(results)]


def _target(value: float | None, bound: float | None, what: str) -> str:
    if value is None or bound is None:
        return f"{what}: no figure"
    if value <= bound:
        return f"{what}: met ({value:,.0f} ms)"
    return f"{what}: missed by {value - bound:,.0f} ms ({value:,.0f} ms)"


def targets(results: Sequence[LatencyResult]) -> list[str]:
    """Issue 54's targets for each framework row: p99 at most Structured Streaming's
    (same run) and at most 500 ms; p50 at most 250 ms."""
    anchor = next((r for r in results if r.case.structured_streaming), None)
    ss_p99 = anchor.percentile(0.99) if anchor is not None and not anchor.problems else None
    lines = ["Targets (issue 54), against the Structured Streaming row of this run:", ""]
    for r in results:
        if r.case.structured_streaming:
            continue
        if r.problems:
            lines.append(f"- {r.case.name}: not judged ({r.exact})")
            continue
        p50, p99 = r.percentile(0.5), r.percentile(0.99)
        checks = [
            _target(p99, ss_p99, "p99 <= Structured Streaming's p99"),
            _target(p99, 500, "p99 <= 500 ms"),
            _target(p50, 250, "p50 <= 250 ms"),
        ]
        lines.append(f"- {r.case.name}: {'; '.join(checks)}")
    return lines


def section(
    results: Sequence[LatencyResult],
    seconds: float = SECONDS,
    rate: int = RATE,
    warm_up: float = WARM_UP_S,
) -> list[str]:
    """The section of ``benchmarks/RESULTS.md``."""
    return [
        "## Latency, Kafka to Redis (exactly once)",
        "",
        *latency_table(results),
        "",
        f"A topic of {PARTITIONS} partitions gets {rate:,} events/s (round-robin, each "
        "value its epoch milliseconds); each consumer counts them per 100 ms bucket into a "
        "Redis hash, exactly once: the framework through `transactional run "
        "benchmarks.latency_topology:build` (Kafka spout, a counting bolt, the Redis "
        "committer), Structured Streaming through a Kafka stream whose `foreachBatch` "
        "applies a batch's counts with one Lua script unless its batch id is already "
        "stored. Both run alone in turn, in a process of their own on `local[*]` with "
        "`create_spark_session`'s defaults. A bucket's latency is the time from its end "
        "until its count in Redis first equals what was produced into it (read every "
        f"{POLL_S * 1000:.0f} ms), over the buckets that end in {seconds:g} s measured "
        f"from {warm_up:g} s after the consumer's start-up on. Start-up is the time from the "
        f"launch until a backlog of {BACKLOG:,} events written before it is all counted "
        "(in parentheses: until any count shows). 'exact': every bucket's count equals "
        "what was produced into it, no other bucket, no dead letter.",
        "",
    ]


# -- Structured Streaming's side, run as a process of its own -------------------------

#: Applies one micro-batch's increments unless its batch id is not above the last
#: applied one (a replayed batch), then stores it. KEYS: counts hash, last batch id,
#: dead-letter count; ARGV: batch id, dead letters, then bucket and increment pairs.
SS_SCRIPT = """
local last = tonumber(redis.call('GET', KEYS[2]) or '-1')
local batch = tonumber(ARGV[1])
if batch <= last then return 0 end
for i = 3, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
if tonumber(ARGV[2]) > 0 then redis.call('INCRBY', KEYS[3], ARGV[2]) end
redis.call('SET', KEYS[2], ARGV[1])
return 1
"""


def structured_streaming(
    kafka: str, topic: str, redis_url: str, prefix: str, checkpoint: str
) -> int:
    """Run until SIGTERM; 1 if the query failed."""
    import redis
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from benchmarks.latency_topology import bucket_of
    from transactional.sources.kafka import kafka_spark_conf
    from transactional.spark.session import create_spark_session

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    client = redis.Redis.from_url(redis_url)
    script = client.register_script(SS_SCRIPT)
    keys = [prefix + TABLE, prefix + "ss:batch", prefix + "ss:bad"]
    spark = create_spark_session("local[*]", "latency-ss", kafka_spark_conf())

    def write(batch: DataFrame, batch_id: int) -> None:
        rows = (
            batch.select(bucket_of(F.col("value").cast("string")).alias("bucket"))
            .groupBy("bucket")
            .count()
            .collect()
        )
        bad = sum(r["count"] for r in rows if r["bucket"] is None)
        pairs = [x for r in rows if r["bucket"] is not None for x in (r["bucket"], r["count"])]
        script(keys=keys, args=[batch_id, bad, *pairs])

    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        while not stopping.is_set() and not query.awaitTermination(1):
            pass
        failure = query.exception()
        if failure is not None:
            print(f"structured streaming failed: {failure}", file=sys.stderr, flush=True)
            return 1
        query.stop()
        return 0
    finally:
        spark.stop()
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=__doc__)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--rate", type=int, default=RATE, help="events per second")
    parser.add_argument("--warm-up", type=float, default=WARM_UP_S)
    parser.add_argument(
        "--only", metavar="TEXT", action="append", help="the cases whose name holds TEXT"
    )
    parser.add_argument("--structured-streaming", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--kafka", "--topic", "--redis-url", "--key-prefix", "--checkpoint"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.structured_streaming:
        return structured_streaming(
            args.kafka, args.topic, args.redis_url, args.key_prefix, args.checkpoint
        )

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    cases = [c for c in CASES if args.only is None or any(t in c.name for t in args.only)]
    results = measure(progress, args.seconds, args.rate, args.warm_up, cases)
    print("\n".join(latency_table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
