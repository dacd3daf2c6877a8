"""``python -m tests.chaos``: a randomized fault campaign against the tweet demo, on both
sinks, with one table at the end (``make chaos``; not part of ``make test``).

For each spout kind, the demo runs with ``--sink both`` (a Redis and a Delta committer)
and ``--fail-rate`` (exceptions injected at protocol steps) over an input with bad
records (``generate --bad-rate``), while the campaign, at random seeded moments after
the run made progress, either SIGKILLs the whole process, restarts the Redis server
(the sink; it keeps its data with ``appendfsync always``) or, with ``--zookeeper``,
restarts the ZooKeeper server holding the state. A killed or failed run is started
again with the same arguments; after the last fault, runs are repeated until one
drains. Then both sinks are compared, key by key, with ``tests.reference``'s answer.

Exit status: 0 when every sink matches exactly, 1 otherwise.
"""

from __future__ import annotations

import argparse
import io
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.processes import DemoProcess, redis_txid, wait_session_gone
from tests.reference import Expected, expected_counts, input_files, lines_of
from transactional.testing.servers import RedisServer, ZooKeeperServer

SPOUTS = ("transactional", "partitioned", "opaque")
KINDS = ("sigkill", "redis restart", "zookeeper restart")


@dataclass
class Campaign:
    spout: str
    topology_id: str
    redis_url: str
    delta_path: Path
    runs: int = 0
    failed_runs: int = 0  # stopped with an error (exit 1/2), e.g. a sink down too long
    faults: Counter[str] = field(default_factory=Counter)
    injected: int = 0  # exceptions injected by --fail-rate, from the runs' logs
    drained: bool = False


@dataclass(frozen=True)
class Settings:
    spouts: tuple[str, ...]
    tweets: int
    batch: int  # per partition (x3 for the transactional spout)
    faults: int  # per spout
    fail_rate: float
    bad_rate: float
    seed: int
    zookeeper: bool


def _sink_txid(campaign: Campaign) -> int:
    try:
        return redis_txid(campaign.redis_url, "redis", campaign.topology_id)
    except Exception:  # Redis is down (we restarted it): no progress seen
        return -1


def _progress(campaign: Campaign, run: DemoProcess, since: int, timeout: float) -> bool:
    """Wait until the run committed past ``since`` (True) or ended (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.poll() is not None:
            return False
        if _sink_txid(campaign) > since:
            return True
        time.sleep(0.1)
    return False


def _finish(campaign: Campaign, run: DemoProcess, code: int) -> None:
    campaign.injected += run.output().count("error=InjectedFault")
    if code == 0:
        campaign.drained = True
    elif code in (1, 2):
        campaign.failed_runs += 1


def _start(campaign: Campaign, settings: Settings, args: list[str], work: Path) -> DemoProcess:
    """The next run: same arguments, its own seed of injected exceptions."""
    campaign.runs += 1
    seed = settings.seed * 1000 + SPOUTS.index(campaign.spout) * 100 + campaign.runs
    return DemoProcess([*args, "--fail-seed", str(seed)], work / f"run{campaign.runs}.log")


def run_campaign(
    campaign: Campaign,
    settings: Settings,
    args: list[str],
    work: Path,
    rng: random.Random,
    restart: dict[str, Callable[[float], None]],
    say: Callable[[str], None],
) -> None:
    run: DemoProcess | None = None
    fault = 0
    while fault < settings.faults and not campaign.drained:
        if run is None:
            run = _start(campaign, settings, args, work)
        since = max(_sink_txid(campaign), 0)
        if not _progress(campaign, run, since, timeout=600):
            stuck = run.poll() is None  # no commit in 10 minutes: worth a look
            code = run.kill()
            wait_session_gone(run.pid)
            _finish(campaign, run, code)
            what = "was stuck; killed" if stuck else f"ended with {code}"
            say(f"{campaign.spout}: run {campaign.runs} {what} before a fault ({run.log})")
            run = None
            continue
        time.sleep(rng.uniform(0.0, 2.5))
        if run.poll() is not None:  # it drained (or failed) meanwhile: no fault to count
            _finish(campaign, run, run.kill())
            run = None
            continue
        kind = rng.choice([k for k in KINDS if k in restart or k == "sigkill"])
        fault += 1
        campaign.faults[kind] += 1
        say(f"{campaign.spout}: fault {fault}: {kind} (run {campaign.runs})")
        if kind == "sigkill":
            code = run.kill()
            wait_session_gone(run.pid)
            _finish(campaign, run, code)
            run = None
        else:
            restart[kind](rng.uniform(0.2, 3.0))
    for _ in range(10):  # drain: the last run goes on; a failed one is started again
        if campaign.drained:
            break
        if run is None:
            run = _start(campaign, settings, args, work)
        code = run.wait(timeout=1800)
        _finish(campaign, run, code)
        say(f"{campaign.spout}: run {campaign.runs} ended with {code}")
        run = None


def _mismatches(got: Expected, expected: Expected) -> int:
    """Keys whose count differs, plus dead letters missing or extra."""
    wrong = 0
    pairs = Counter({f"{u}:{t}": n for (u, t), n in expected.pairs.items()})
    got_pairs = Counter(
        {k if isinstance(k, str) else f"{k[0]}:{k[1]}": n for k, n in got.pairs.items()}
    )
    for have, want in (
        (got.hashtags, expected.hashtags),
        (got.users, expected.users),
        (got_pairs, pairs),
    ):
        wrong += sum(have.get(k, 0) != want.get(k, 0) for k in set(have) | set(want))
    dead, want_dead = Counter(got.dead_letters), Counter(expected.dead_letters)
    return wrong + sum(((dead - want_dead) + (want_dead - dead)).values())


def report(
    campaigns: Sequence[Campaign], lines: int, expected: Expected, spark: Any, zookeeper: bool
) -> tuple[Any, int]:
    from rich.table import Table

    from tests.e2e.test_demo import delta_contents, redis_contents

    table = Table(title="chaos campaign", title_justify="left")
    for name in (
        "spout",
        "sink",
        "runs",
        "errored",
        "kill -9",
        "redis restart",
        *(["zk restart"] if zookeeper else []),
        "exceptions",
        "records in",
        "bad records",
        "hashtags counted",
        "dead letters",
        "mismatches",
    ):
        table.add_column(name, justify="left" if name in ("spout", "sink") else "right")
    total = 0
    want_tags = sum(expected.hashtags.values())
    for c in campaigns:
        for sink in ("redis", "delta"):
            got = (
                redis_contents(c.redis_url)
                if sink == "redis"
                else delta_contents(spark, c.delta_path)
            )
            wrong = _mismatches(got, expected)
            total += wrong + (0 if c.drained else 1)  # an undrained campaign fails too
            table.add_row(
                c.spout,
                sink,
                str(c.runs),
                str(c.failed_runs),
                str(c.faults["sigkill"]),
                str(c.faults["redis restart"]),
                *([str(c.faults["zookeeper restart"])] if zookeeper else []),
                str(c.injected),
                f"{lines:,}",
                f"{len(expected.dead_letters):,}",
                f"{sum(got.hashtags.values()):,} / {want_tags:,}",
                f"{len(got.dead_letters):,} / {len(expected.dead_letters):,}",
                str(wrong) if c.drained else f"{wrong} (not drained)",
            )
    return table, total


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one spout kind, a small input")
    p.add_argument("--zookeeper", action="store_true", help="state in ZooKeeper, restarted too")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--tweets", type=int, help="input lines (default 200; quick 120)")
    p.add_argument("--faults", type=int, help="faults per spout kind (default 3)")
    p.add_argument("--fail-rate", type=float, default=0.2, help="injected exceptions")
    p.add_argument("--bad-rate", type=float, default=0.03, help="bad input records")
    p.add_argument("--spouts", nargs="+", choices=SPOUTS, help="default: all (quick: opaque)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings(
        spouts=tuple(args.spouts or (("opaque",) if args.quick else SPOUTS)),
        tweets=args.tweets or (120 if args.quick else 200),
        batch=10,
        faults=args.faults if args.faults is not None else 3,
        fail_rate=args.fail_rate,
        bad_rate=args.bad_rate,
        seed=args.seed,
        zookeeper=args.zookeeper,
    )
    from rich.console import Console

    # A table this wide needs room; a pipe or a log file has no width of its own.
    console = Console() if sys.stdout.isatty() else Console(width=160)
    started = time.monotonic()

    def say(text: str) -> None:
        console.log(text)

    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    redis_server = RedisServer(appendonly=True)
    zk = ZooKeeperServer() if settings.zookeeper else None
    spark = None
    try:
        redis_server.start()
        restart: dict[str, Callable[[float], None]] = {"redis restart": _restarter(redis_server)}
        if zk is not None:
            zk.start()
            restart["zookeeper restart"] = _restarter(zk)
        from examples.tweets.cli import main as demo

        data = work / "tweets"
        demo(
            [
                "generate",
                "--count",
                str(settings.tweets),
                "--seed",
                str(settings.seed),
                "--partitions",
                "3",
                "--bad-rate",
                str(settings.bad_rate),
                "--out",
                str(data),
            ],
            out=io.StringIO(),
        )
        expected = expected_counts(data)
        lines = sum(len(lines_of(f)) for f in input_files(data))
        rng = random.Random(settings.seed)
        campaigns = []
        for i, spout in enumerate(settings.spouts):
            base = redis_server.url.rsplit("/", 1)[0]
            c = Campaign(spout, f"chaos-{spout}", f"{base}/{i + 1}", work / spout / "delta")
            batch = settings.batch * (3 if spout == "transactional" else 1)
            run_args = [
                "run",
                "--input",
                str(data),
                "--spout",
                spout,
                "--sink",
                "both",
                "--redis-url",
                c.redis_url,
                "--delta-path",
                str(c.delta_path),
                "--state-dir",
                str(work / spout / "state"),
                "--topology-id",
                c.topology_id,
                "--batch-size",
                str(batch),
                "--max-pending",
                "3",
                "--until-drained",
                "--master",
                "local[2]",
                "--top",
                "0",
                "--fail-rate",
                str(settings.fail_rate),
            ]
            if zk is not None:
                run_args += ["--zookeeper", zk.hosts]
            (work / spout).mkdir(parents=True, exist_ok=True)
            run_campaign(c, settings, run_args, work / spout, rng, restart, say)
            campaigns.append(c)
        say("reading both sinks back")
        from committers.delta import delta_spark_conf
        from transactional.session import create_spark_session

        spark = create_spark_session("local[2]", "chaos", delta_spark_conf())
        table, failures = report(campaigns, lines, expected, spark, settings.zookeeper)
        console.print(table)
        console.print(
            f"seed {settings.seed}, {settings.tweets} tweets, {settings.faults} faults per "
            f"spout kind, fail rate {settings.fail_rate}, bad rate {settings.bad_rate}, "
            f"{time.monotonic() - started:.0f}s; mismatches: {failures} (0 expected)"
        )
        return 0 if failures == 0 else 1
    finally:
        if spark is not None:
            spark.stop()
        redis_server.close()
        if zk is not None:
            zk.close()
        if args.keep:
            console.print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _restarter(server: RedisServer | ZooKeeperServer) -> Callable[[float], None]:
    def restart(down_s: float) -> None:
        server.stop()  # SIGKILL: a crash, not a clean shutdown
        time.sleep(down_s)
        server.start()

    return restart


if __name__ == "__main__":
    sys.exit(main())
