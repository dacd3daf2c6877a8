"""Crash matrix: the demo process (driver, Spark JVM and Python workers) SIGKILLed at
every named step of the protocol, for every spout kind, then started again with the same
arguments until drained; every count must match the answer computed from the input,
and every tweet (counted under its id too, ``--record-ids``) be in each sink exactly once,
with nothing that no input record explains and nothing an undone attempt left
(``tests/history.py``, reading the sinks with redis-py and ``deltalake``, and each Delta
table's log: every commit that changed rows carries its txid marker). Redis is judged by
its server's own account too (``tests/monitor.py``, ``MONITOR`` through the chain): every
write to the sink came from a commit script, so marker, counts and dead letters changed
together.

Every run commits in groups: after a start the first commit is ``currtx`` alone, and
then up to three txids go together (``--max-group 3``; ``--group-wait`` lets a processed
txid wait for the ones still processing, so the groups do not depend on timing). The
chain below therefore also dies before, between and after the sinks' writes of a group,
and after its advance.

One chain of runs per spout kind and place: run k dies at step k of ``CHAIN`` (set from outside
with ``--crash-at`` or ``TRANSACTIONAL_CRASH_AT``), run k+1 resumes from what it left,
and a last run without a crash drains. Every run commits to both sinks (``--sink
both``: a Redis committer, then a Delta one), which is what gives the step *between
two committers* a meaning, and lets one chain cover each step for both sinks. The
cases are spout x sink: each checks, for its sink, that every run died by SIGKILL at
its step leaving the state that step implies, and that the drained counts are exact.

The partitioned and opaque kinds run on local files and tables (the partitioned kind
into transactional-mode sinks, the opaque one into opaque-mode sinks); the transactional
and opaque kinds (both Delta commit modes again) run with their input and their Delta
tables in a bucket of the S3 stand-in (moto's server), reached through the standard
AWS settings: the file source reads the bucket, delta-rs commits there by conditional
writes. So every spout kind, both commit modes on local disk and in S3; the
transactional kind has no local chain of its own (its spout reads local files as it
reads the bucket's, and its sinks' transactional mode is the partitioned chain's),
which keeps CI's run of this module to seven chains.

Three more run every spout kind against a Spark Connect server (``--remote``, the
server started by the tests and alive across the chain's runs): what is SIGKILLed is
then the client alone, which has no JVM; its jobs left on the server are orphans whose
results nobody reads.

In a rotated run (``make test-slow``, CI: ``tests/rotation.py``) each chain dies at
``ALWAYS`` and at a third of the other steps; the chains of each spout kind, place and
commit mode take different thirds (``PHASES``), so every run kills at every step on the
opaque spout, on Spark Connect and in both commit modes (at two thirds of the steps on
the other spout kinds and places), and three consecutive seeds kill every chain at
every step.

Plus a randomized campaign: a longer run on the single-Redis-sink topology, killed from
outside at random moments (seeded, by the rotation's seed in a rotated run, so that CI
runs differ), restarted each time, then drained.
"""

from __future__ import annotations

import io
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from examples.tweets.cli import main as demo
from tests import rotation
from tests.history import judge, read_delta, read_redis
from tests.monitor import ScriptWrites
from tests.processes import (
    DemoProcess,
    adopting_orphans,
    demo_env,
    killed,
    printed_tops,
    reap_session,
    redis_txid,
    store_group,
    store_state,
)
from tests.processes import delta_txid as delta_sink_txid
from tests.reference import Expected, expected_counts
from transactional.faults import FaultPoint
from transactional.testing.servers import RedisServer, S3Server

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

SPOUTS = ("transactional", "partitioned", "opaque")
#: The chains: on local files and tables the partitioned and opaque kinds, in S3
#: (``-s3``) the transactional and opaque kinds (each Delta commit mode in both places),
#: and every spout kind on Spark Connect.
CHAINS = (
    "partitioned", "opaque", "transactional-s3", "opaque-s3",
    *(f"{s}-connect" for s in SPOUTS),
)  # fmt: skip
#: Each chain's Redis database (5 to 8 are other tests').
DATABASES = dict(zip(CHAINS, (1, 2, 3, 9, 10, 11, 12), strict=True))
#: 120 lines: 4 txids for every kind (the partitioned kinds' batch is per partition).
BATCH = {"transactional": "30", "partitioned": "10", "opaque": "10"}
#: Each run of a chain dies at the next of these (step, txid): every step of the
#: protocol. Early txids keep the work a crash throws away small; later steps move on
#: so that replays of committed, half-committed and merely started txids all occur.
CHAIN = [
    (FaultPoint.AFTER_STORE_META, 1),
    (FaultPoint.EMIT, 1),
    (FaultPoint.PROCESS, 1),
    (FaultPoint.BEFORE_SINK_WRITE, 1),
    (FaultPoint.BETWEEN_COMMITTERS, 1),
    (FaultPoint.AFTER_SINK_WRITE, 2),
    (FaultPoint.AFTER_ADVANCE, 3),
]
TOP = 3
#: The kill of every chain in every run: into a group the sinks took (which the steps
#: after it replay), and for the weaker guarantees the sink write a replay repeats.
ALWAYS = (FaultPoint.AFTER_SINK_WRITE, 2)
#: Each chain's third of the other steps under a seed (``rotation.Rotation.takes``): the
#: opaque chains, the Connect chains and the chains of each commit mode hold every phase.
PHASES = {
    "partitioned": 2, "opaque": 0,
    "transactional-s3": 2, "opaque-s3": 1,
    "transactional-connect": 0, "partitioned-connect": 1, "opaque-connect": 2,
}  # fmt: skip
#: The slices the other steps are cut into (a chain of 7 steps dies 3 times a run).
SLICES = 3


def steps(
    chosen: rotation.Rotation, phase: int, slices: int = SLICES
) -> list[tuple[FaultPoint, int]]:
    """The kills of a chain of ``phase`` in this run, in ``CHAIN``'s order: ``ALWAYS`` and
    the ``slices``-th part of the other steps this seed gives ``phase``."""
    return rotation.kills(chosen, CHAIN, ALWAYS, phase, slices)


@dataclass
class Crash:
    point: FaultPoint
    txid: int
    returncode: int
    output: str
    exits: dict[int, tuple[str, int]]  # what was left of the run: pid -> (command, status)
    currtx: int
    metas: list[int]
    group: tuple[int, int] | None  # the commit group the store recorded
    sinks: dict[str, int]  # sink -> last txid it holds

    def describe(self) -> str:
        return (
            f"crash at {self.point.value}:{self.txid}: returncode={self.returncode} "
            f"currtx={self.currtx} metas={self.metas} group={self.group} sinks={self.sinks}\n"
            f"{self.output[-3000:]}"
        )


@dataclass
class Chain:
    spout: str
    expected: Expected
    redis_url: str
    delta_path: Path | str  # a directory, or an s3:// URL
    state_dir: Path
    connect: bool = False  # run on a Spark Connect server (the client has no JVM)
    steps: list[tuple[FaultPoint, int]] = field(default_factory=list)  # its kills this run
    crashes: list[Crash] = field(default_factory=list)
    final_returncode: int = -1
    final_output: str = ""
    #: The writes to the Redis sink made outside its commit script (``tests.monitor``).
    outside: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def tweets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    out = tmp_path_factory.mktemp("crash-input") / "tweets"
    code = demo(
        [
            "generate",
            "--count",
            "120",
            "--seed",
            "31",
            "--partitions",
            "3",
            "--bad-rate",
            "0.04",
            "--out",
            str(out),
        ],
        out=io.StringIO(),
    )
    assert code == 0
    expected = expected_counts(out)
    assert expected.dead_letters and expected.hashtags and expected.pairs
    return out, expected


def fresh_db(server: RedisServer, db: int) -> str:
    """A Redis database of its own (the demo's keys are fixed), flushed."""
    url = server.url.rsplit("/", 1)[0] + f"/{db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture(scope="module")
def s3_env(s3_server: S3Server) -> Iterator[dict[str, str]]:
    """The S3 stand-in's standard AWS settings, in this process's environment too (the
    sinks and the log are read here with ``deltalake`` and pyarrow) for the module."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3_server.settings.items():
            patch.setenv(name, value)
        yield s3_server.settings


def upload(root: Path, bucket: str) -> str:
    """The files of the directory ``root`` into ``s3://bucket/input/``, by pyarrow."""
    import pyarrow.fs as pa_fs

    s3 = pa_fs.FileSystem.from_uri(f"s3://{bucket}")[0]
    for path in sorted(root.iterdir()):
        with s3.open_output_stream(f"{bucket}/input/{path.name}") as out:
            out.write(path.read_bytes())
    return f"s3://{bucket}/input"


@pytest.fixture(scope="module", params=CHAINS)
def chain(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    tweets: tuple[Path, Expected],
    tmp_path_factory: pytest.TempPathFactory,
) -> Chain:
    spout, _, where = str(request.param).partition("-")
    path, expected = tweets
    work = tmp_path_factory.mktemp(f"chain-{request.param}")
    db = fresh_db(redis_server, DATABASES[request.param])
    kills = steps(rotation.of(request.config), PHASES[request.param])
    result = Chain(spout, expected, db, work / "delta", work / "state", steps=kills)
    source = str(path)
    settings: dict[str, str] = {}
    if where == "s3":
        settings = request.getfixturevalue("s3_env")
        bucket = request.getfixturevalue("s3_server").bucket()
        source = upload(path, bucket)
        result.delta_path = f"s3://{bucket}/delta"
    spark = ["--master", "local[2]"]
    if where == "connect":
        result.connect = True
        spark = ["--remote", request.getfixturevalue("spark_connect").remote]
    args = [
        "run",
        "--input",
        source,
        "--spout",
        spout,
        "--sink",
        "both",
        "--redis-url",
        result.redis_url,
        "--delta-path",
        str(result.delta_path),
        "--state-dir",
        str(result.state_dir),
        "--batch-size",
        BATCH[spout],
        "--max-pending",
        "3",
        "--max-group",
        "3",
        "--group-wait",
        "60",
        "--until-drained",
        *spark,
        "--top",
        str(TOP),
        "--record-ids",  # each tweet counted by id too: judged record by record
    ]
    # The Redis server's own account of every write, and adopting a dead run's JVM and
    # workers to reap them here.
    monitor = ScriptWrites(result.redis_url, work / "monitor.log")
    with monitor, adopting_orphans():
        for k, (point, txid) in enumerate(result.steps):
            spec = f"{point.value}:{txid}"
            if k == 0:  # the environment variable, as a wrapper script would set it
                env = demo_env(TRANSACTIONAL_CRASH_AT=spec, **settings)
                run = DemoProcess(args, work / f"run{k}.log", env)
            else:
                env = demo_env(**settings)
                run = DemoProcess([*args, "--crash-at", spec], work / f"run{k}.log", env)
            code = run.wait()
            exits = reap_session(run.pid)
            currtx, metas = store_state(result.state_dir)
            group = store_group(result.state_dir)
            sinks = {
                "redis": redis_txid(result.redis_url, "redis"),
                "delta": delta_sink_txid(result.delta_path, "delta", opaque=spout == "opaque"),
            }
            output = run.output()
            crash = Crash(point, txid, code, output, exits, currtx, metas, group, sinks)
            result.crashes.append(crash)
        final = DemoProcess(args, work / "final.log", demo_env(**settings))
        result.final_returncode = final.wait()
        reap_session(final.pid)
    result.final_output = final.output()
    result.outside = monitor.outside()
    return result


def commit_span(crash: Crash) -> tuple[int, int]:
    """The txids of the commit the crash hit (its own txid, or its recorded group): the
    store's group while it starts at ``currtx``, or, after an advance, if it ends just
    below ``currtx`` (the store keeps the last group recorded)."""
    group, t = crash.group, crash.txid
    if group is not None and group[0] <= t <= group[1]:
        advanced = crash.point is FaultPoint.AFTER_ADVANCE
        if group[0] == crash.currtx or (advanced and group[1] == crash.currtx - 1):
            return group
    return t, t


def expected_state(crash: Crash, sink: str) -> tuple[int | None, int | None]:
    """(currtx, sink txid) that dying at the crash's step must leave; None where the
    other threads may have moved on (the step is on a worker thread, and a lower txid
    may be committing meanwhile), bounded by the checks in ``check_crash``. A group
    ``first..last`` is written whole, marked with ``last``."""
    first, last = commit_span(crash)
    ahead = sink == "redis"  # --sink both commits Redis first, then Delta
    return {
        # On the commit thread, so first - 1 is committed: nothing of the group yet.
        FaultPoint.BEFORE_SINK_WRITE: (first, first - 1),
        FaultPoint.BETWEEN_COMMITTERS: (first, last if ahead else first - 1),
        FaultPoint.AFTER_SINK_WRITE: (first, last),
        FaultPoint.AFTER_ADVANCE: (last + 1, last),
    }.get(crash.point, (None, None))


def check_crash(crash: Crash, sink: str, connect: bool = False) -> None:
    why = crash.describe()
    assert crash.returncode == -9, why  # died by SIGKILL, not by an error
    marker = f"crash_at point={crash.point.value} txid={crash.txid} "
    assert crash.output.count(marker) == 1, why  # ...at the step it was told
    # ...and took its JVM along: SIGKILLed, not left to notice the driver's death and
    # exit on its own (running its shutdown hooks) a moment later. Nothing else of the
    # run outlived it either (reap_session waited for every process of the session).
    # On Spark Connect the client started none: its Spark is the server's.
    jvms = [status for command, status in crash.exits.values() if command == "java"]
    assert not jvms if connect else jvms and all(killed(s) for s in jvms), (crash.exits, why)
    held = crash.sinks[sink]
    last = commit_span(crash)[1]
    # Never behind the store, at most the group being committed ahead of it.
    assert crash.currtx - 1 <= held <= max(crash.currtx, last), why
    # Metadata stored before anything else (an advance keeps the last txid's only).
    assert (last if crash.point is FaultPoint.AFTER_ADVANCE else crash.txid) in crash.metas, why
    currtx, txid = expected_state(crash, sink)
    if currtx is None:  # not yet committed: t is at most the next to commit
        assert crash.currtx <= crash.txid and held <= crash.txid - 1, why
    else:
        assert (crash.currtx, held) == (currtx, txid), why


def tops(expected: Expected) -> list[tuple[str, int]]:
    return sorted(expected.hashtags.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("sink", ["redis", "delta"])
def test_killed_at_every_step_then_rerun_counts_exactly(
    chain: Chain, sink: str, spark: Any
) -> None:
    assert [(c.point, c.txid) for c in chain.crashes] == chain.steps
    for crash in chain.crashes:
        check_crash(crash, sink, chain.connect)
    # Groups were crashed into: after the sinks took one, and after its advance.
    spans = {(c.point, commit_span(c)) for c in chain.crashes}
    assert (FaultPoint.AFTER_SINK_WRITE, (2, 4)) in spans, [c.describe() for c in chain.crashes]
    if (FaultPoint.AFTER_ADVANCE, 3) in chain.steps:
        assert (FaultPoint.AFTER_ADVANCE, (2, 4)) in spans
    assert chain.final_returncode == 0, chain.final_output[-3000:]
    assert "crash_at " not in chain.final_output
    currtx, _ = store_state(chain.state_dir)
    image = (
        read_redis(chain.redis_url)
        if sink == "redis"
        else read_delta(chain.delta_path, committed=currtx - 1)
    )
    verdict = judge(image, chain.expected)  # read with redis-py and deltalake
    assert verdict.exact, str(verdict)
    if sink == "redis":  # and by the server's own account: every write in a commit script
        assert chain.outside == [], chain.outside[:10]
    # The end-of-run summary shows each sink's top hashtags.
    assert printed_tops(chain.final_output)[(sink, "top hashtags")] == tops(chain.expected)
    held = (
        redis_txid(chain.redis_url, "redis")
        if sink == "redis"
        else delta_sink_txid(chain.delta_path, "delta", opaque=chain.spout == "opaque")
    )
    assert held == currtx - 1 == 4  # 120 lines, 30 per txid
    if sink == "delta":  # `show` reads both sinks back (once per chain: it costs Delta reads)
        assert_show_both(chain, spark)


def assert_show_both(chain: Chain, spark: Any) -> None:
    out = io.StringIO()
    code = demo(
        [
            "show",
            "--sink",
            "both",
            "--redis-url",
            chain.redis_url,
            "--delta-path",
            str(chain.delta_path),
            "--top",
            str(TOP),
        ],
        out=out,
    )
    assert code == 0, out.getvalue()
    printed = printed_tops(out.getvalue())
    for sink in ("redis", "delta"):
        assert printed[(sink, "top hashtags")] == tops(chain.expected)
    dead = str(len(chain.expected.dead_letters))
    assert re.findall(r"dead letters: (\d+)", out.getvalue()) == [dead, dead]


@pytest.mark.timeout(1200)
def test_random_sigkills_then_drain_count_exactly(
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    pytestconfig: pytest.Config,
) -> None:
    path = tmp_path_factory.mktemp("campaign-input") / "tweets"
    assert (
        demo(
            [
                "generate",
                "--count",
                "600",
                "--seed",
                "47",
                "--partitions",
                "3",
                "--bad-rate",
                "0.03",
                "--out",
                str(path),
            ],
            out=io.StringIO(),
        )
        == 0
    )
    expected = expected_counts(path)
    url = fresh_db(redis_server, 5)
    args = [
        "run",
        "--input",
        str(path),
        "--spout",
        "opaque",
        "--sink",
        "redis",
        "--redis-url",
        url,
        "--state-dir",
        str(tmp_path / "state"),
        "--batch-size",
        "5",
        "--max-pending",
        "3",
        "--max-group",
        "3",
        "--group-wait",
        "60",
        "--until-drained",
        "--master",
        "local[2]",
        "--top",
        "0",
        "--record-ids",
    ]
    # The kills' moments: new in each rotated run (its seed), else always the same ones.
    rng = random.Random(20261122 + (rotation.of(pytestconfig).seed or 0))
    with adopting_orphans():
        killed_runs(args, url, tmp_path, rng)
    final = DemoProcess(args, tmp_path / "final.log")
    assert final.wait() == 0, final.tail()
    verdict = judge(read_redis(url), expected)
    assert verdict.exact, str(verdict)
    currtx, _ = store_state(tmp_path / "state")
    assert redis_txid(url, "sink") == currtx - 1 == 40  # 600 lines, 15 per txid


def killed_runs(args: list[str], url: str, tmp_path: Path, rng: random.Random) -> None:
    for k in range(5):
        before = redis_txid(url, "sink")
        run = DemoProcess(args, tmp_path / f"run{k}.log")
        midstream = rng.random() >= 0.3
        if not midstream:  # at any moment from the start: start-up and replays too
            time.sleep(rng.uniform(1.0, 8.0))
        else:  # after this run committed something, mid-stream
            deadline = time.monotonic() + 300
            while redis_txid(url, "sink") <= before and run.poll() is None:
                assert time.monotonic() < deadline, run.tail()
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.0))
        assert run.poll() is None, f"run {k} ended before it was killed:\n{run.tail()}"
        assert run.kill() == -9
        exits = reap_session(run.pid)  # nothing outlives the kill for long...
        jvms = [status for command, status in exits.values() if command == "java"]
        # ...and the JVM shared its group's fate (a run killed mid-stream had one; one
        # killed during start-up may have died before its JVM started).
        assert (jvms or not midstream) and all(killed(s) for s in jvms), exits
        currtx, _ = store_state(tmp_path / "state")
        assert currtx - 1 <= redis_txid(url, "sink") <= currtx, run.tail()
