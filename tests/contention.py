"""Live runners of one topology in contention: two or three demo processes (each its own
Spark driver) on one ZooKeeper and one pair of sinks (Redis and Delta, local or in the
S3 stand-in), the leader deposed again and again while the others take over, and the
sinks judged, record by record and from their own histories, for a single write of a
deposed leader.

Each runner reaches ZooKeeper and Redis through proxies of its own (``TcpProxy``) and
Delta directly, so it keeps its sinks while it loses ZooKeeper. The ZooKeeper proxy also
shows which session the server gave each runner (the first reply of each connection),
which is how the test knows who leads (the session that owns the leader node, read with
a client of its own) and how it expires one. Before each fault the leader's next commit
script is held in its Redis proxy (sent, not delivered) and released once a successor
has committed: a deposed leader's write reaches Redis after its successor's, every time.
The faults, each on whoever leads at the time, mid-work (an input file just added):

- ``freeze``: the leader's driver stopped (SIGSTOP) until ZooKeeper has expired its
  session and another runner has committed, then resumed, as after a long GC pause;
- ``partition``: its proxy silent both ways (``black_hole``) while its sink connections
  go on, until the same, then healed;
- ``expiry``: its session closed on the server by a client of the test's, attached to
  it with the session's id and password as the proxy saw them: the runner keeps
  running and connected, and learns on its next request that its session has expired.

Each fault counts only once a witness outside the run has seen it take effect:
ZooKeeper no longer holding the session (and the process stopped, or the proxy having
discarded its requests). The deposed runner must then stop with exit status 1, naming
the lost leadership or a fenced write, and report no commit of a txid the new leader
started; a fresh runner takes its place, so a standby always waits.

The sinks' own histories (``deposed_writes``): every command Redis ran (``MONITOR``,
``tests.monitor``): no commit script that wrote under a fence token below one that had
written; and each Delta table's log (``transactional.testing.history.delta_log``): every
commit that changed rows carries its writer's token, none below a token an earlier
commit carried. And at the end both sinks are judged record by record against the
input files (``tests.history``).

``tests/e2e/test_contention.py`` runs one contest in CI (rotated: the Delta tables local
or in S3, two or three runners, the faults' order); ``python -m tests.contention``
(``make chaos``) runs longer ones.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import signal
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tests.history import judge, read_delta, read_redis
from tests.monitor import ScriptWrites
from tests.processes import DELTA_TABLES, DemoProcess, redis_txid
from tests.reference import Expected, expected_counts
from tests.witness import NotFired, process_state, wait_sessions_expired, waited, zk_owner
from transactional.testing.history import Image, delta_log, delta_root, deposed
from transactional.testing.proxy import TcpProxy

TOPOLOGY = "contest"
LEADER_NODE = f"/transactional/{TOPOLOGY}/leader"
STARTED = rf"runner started topology={TOPOLOGY} currtx=(\d+) .*fence=(\d+)"
#: A start line, or the line of a leadership taken back (step 7), with its new token.
LEADS = (
    rf"(?:runner started|leadership taken back) topology={TOPOLOGY} currtx=(\d+) "
    r".*fence=(\d+)"
)
FAULTS = ("freeze", "partition", "expiry")
#: How many times a fault is made on one leader before it counts as failed to depose
#: it (an expired leader may win the election back: ``Contest.depose``).
TRIES = 3
#: The runners' ZooKeeper session timeout (s): what a freeze or a partition outlasts.
SESSION_S = 4
#: Tweets a txid.
BATCH = 30


def zk_session(greeting: bytes) -> tuple[int, bytes] | None:
    """The session id and password in a ZooKeeper server's first reply on a connection
    (its ``ConnectResponse``: length, protocol version, timeout, session id, password),
    None if it holds none (a refused session's id is 0)."""
    if len(greeting) < 24:
        return None
    _, _, _, session, size = struct.unpack(">iiiqi", greeting[:24])
    password = greeting[24 : 24 + size]
    if session == 0 or size <= 0 or len(password) != size:
        return None
    return session, password


def expire_session(hosts: str, session: int, password: bytes) -> None:
    """Close ``session`` on the ZooKeeper server from a client of the test's own,
    attached to it with its id and password: the server ends it (its ephemeral nodes
    go), and its own client learns so on its next request."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, client_id=(session, password), timeout=10)
    client.start(timeout=15)
    client.stop()
    client.close()


@dataclass(eq=False)
class Contender:
    """One runner of the topology and its proxies to ZooKeeper and to Redis."""

    name: str
    to_zk: TcpProxy
    to_redis: TcpProxy
    run: DemoProcess

    def close(self) -> None:
        for proxy in (self.to_zk, self.to_redis):
            proxy.__exit__(None, None, None)

    def fence(self) -> int:
        """Its fence token, from its start line or, if it took the leadership back since
        (an expired leader re-elected), from the last line saying so, with its new one."""
        self.run.wait_said(STARTED, timeout=1)
        return int(list(re.finditer(LEADS, self.run.output(), re.MULTILINE))[-1].group(2))

    def session(self) -> tuple[int, bytes] | None:
        """The latest session ZooKeeper gave it (id, password), as its proxy saw it."""
        found = [s for g in self.to_zk.greetings if (s := zk_session(g)) is not None]
        return found[-1] if found else None

    def sessions(self) -> set[int]:
        """Every session ZooKeeper gave it."""
        return {found[0] for g in self.to_zk.greetings if (found := zk_session(g)) is not None}


@dataclass
class Deposal:
    """One fault on a leader, as witnessed."""

    fault: str
    leader: str
    successor: str
    #: The sink's txid when the fault took effect, and the successor's first txid.
    held: int
    currtx: int
    #: The deposed leader's fence token and its successor's.
    fence: int
    successor_fence: int


@dataclass
class Contest:
    """The runners, their inputs and their sinks; use as a context manager (every
    runner and proxy is stopped at its end)."""

    zk_hosts: str
    redis_url: str
    #: The Delta tables' directory, or an ``s3://`` URL.
    delta_path: str
    #: Input files not yet given to the runners, in the order they are added.
    staged: list[Path]
    #: The directory the runners read.
    inputs: Path
    workdir: Path
    runners: int = 3
    spout: str = "transactional"
    say: Callable[[str], None] = lambda text: None
    contenders: list[Contender] = field(default_factory=list)
    deposals: list[Deposal] = field(default_factory=list)
    #: Expiries after which the leader's new session won the election again.
    reelected: int = 0
    started: int = 0

    def __enter__(self) -> Contest:
        self.inputs.mkdir(parents=True, exist_ok=True)
        self.add_input()
        for _ in range(self.runners):
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for contender in self.contenders:
            if contender.run.poll() is None:
                os.kill(contender.run.pid, signal.SIGCONT)
                contender.run.kill()
            contender.close()

    # -- the runners -------------------------------------------------------------------

    def start(self) -> Contender:
        """A new runner, through proxies of its own."""
        self.started += 1
        name = f"r{self.started}"
        to_zk = TcpProxy(_port(self.zk_hosts)).__enter__()
        to_redis = TcpProxy(_port(self.redis_url)).__enter__()
        hosts = self.zk_hosts.replace(f":{_port(self.zk_hosts)}", f":{to_zk.port}")
        redis_url = self.redis_url.replace(f":{_port(self.redis_url)}", f":{to_redis.port}")
        args = [
            "-vv", "run", "--input", str(self.inputs), "--spout", self.spout,
            "--sink", "both", "--redis-url", redis_url, "--delta-path", self.delta_path,
            "--zookeeper", hosts, "--topology-id", TOPOLOGY,
            "--zk-session-timeout", str(SESSION_S), "--batch-size", str(BATCH), "--max-pending", "2",
            "--master", "local[1]", "--top", "0", "--record-ids",
            "--state-dir", str(self.workdir / name),
        ]  # fmt: skip
        run = DemoProcess(args, self.workdir / f"{name}.log")
        contender = Contender(name, to_zk, to_redis, run)
        self.contenders.append(contender)
        self.say(f"started {name} (pid {run.pid})")
        return contender

    def live(self) -> list[Contender]:
        return [c for c in self.contenders if c.run.poll() is None]

    def leader(self, timeout: float = 240) -> Contender:
        """The runner whose session owns the leader node, by ZooKeeper's word."""

        def owner() -> Contender | None:
            for contender in self.live():
                assert contender.run.poll() is None, contender.run.tail()
            session = zk_owner(self.zk_hosts, LEADER_NODE)
            return next((c for c in self.live() if session in c.sessions()), None)

        return waited("a runner to lead", owner, timeout, 0.2)

    def committed(self) -> int:
        """The txid the Redis sink holds (the Delta tables commit in the same group)."""
        return redis_txid(self.redis_url, "redis", TOPOLOGY)

    def sink_fence(self) -> int:
        """The token of the latest leader whose commit script ran in Redis (a script
        stores its writer's, a skipped txid's too), by Redis's word."""
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=5)
        try:
            return int(client.get(f"transactional:{TOPOLOGY}:redis:fence") or 0)
        finally:
            client.close()

    def add_input(self) -> bool:
        """The next staged file put in the input directory (written under a hidden name,
        then renamed, as the file source asks); False: none left."""
        if not self.staged:
            return False
        source = self.staged.pop(0)
        hidden = self.inputs / f".{source.name}"
        shutil.copyfile(source, hidden)
        hidden.rename(self.inputs / source.name)
        return True

    # -- a fault -----------------------------------------------------------------------

    def depose(self, fault: str) -> Deposal:
        """``fault`` on the leader while it works, a commit of its held on its way to
        Redis; returns once a successor has committed, the held commit has reached Redis
        after it, and the deposed runner has stopped as it must (and been replaced).

        An expired leader keeps running and asks for the leadership again with a new
        session, as the other runners do: when it wins, it is not deposed (the protocol's
        step 7, a leadership taken back), and the expiry is made again, up to
        ``TRIES`` times. A frozen or partitioned leader cannot win it back."""
        for _ in range(TRIES):
            deposal = self._depose(fault)
            if isinstance(deposal, Deposal):
                return deposal
            self.reelected += 1
            self.say(f"{fault}: the leader's new session won the election; {fault} again")
            # Its held script let go, a script under its new token runs: the proxy then
            # holds nothing of the old session's, and the next script held is a new one.
            waited("the leader's commit again", partial(self._fenced_past, deposal), 240)
        raise AssertionError(f"{fault}: the leader won the election back {TRIES} times in a row")

    def _fenced_past(self, token: int) -> bool | None:
        return self.sink_fence() > token or None

    def _depose(self, fault: str) -> Deposal | int:
        """One ``fault`` on the leader (``depose``); or, if it took the leadership back,
        the fence token it held before."""
        leader = self.leader()
        # Its next commit's script held in its proxy, sent, not delivered: the next file
        # added gives it one to send, however fast it is.
        leader.to_redis.hold(b"EVALSHA")
        self.add_input()
        leader.to_redis.wait_in_flight(b"EVALSHA", timeout_s=240)
        logged = len(leader.run.output())
        credentials = leader.session()
        assert credentials is not None, "the proxy saw no ZooKeeper session given"
        session, password = credentials
        held, fence = self.committed(), leader.fence()
        pid = leader.run.pid
        if fault == "freeze":
            os.kill(pid, signal.SIGSTOP)
        elif fault == "partition":
            leader.to_zk.black_hole()
        elif fault == "expiry":
            expire_session(self.zk_hosts, session, password)
        else:
            raise ValueError(f"no fault {fault!r}: one of {', '.join(FAULTS)}")
        try:
            # The witnesses: ZooKeeper no longer holds the session...
            wait_sessions_expired(self.zk_hosts, {session}, 60)
            if fault == "freeze" and process_state(pid) != "T":  # ...the driver stopped
                raise NotFired(f"freeze: {leader.name} is not stopped")
            if fault == "partition" and leader.to_zk.stats["discarded_up"] == 0:
                raise NotFired(f"partition: nothing {leader.name} sent was discarded")
            if fault == "expiry" and leader.run.poll() is not None:
                raise NotFired(f"expiry: {leader.name} had ended:\n{leader.run.tail()}")
            successor = self.leader()
            if successor is leader:
                assert fault == "expiry", f"{fault}: {leader.name} still leads"
                return fence  # its held script is let go below; it is the leader's own
            currtx = int(successor.run.wait_said(STARTED, timeout=120).group(1))
            # A script of the successor's has run: Redis holds its token. (Not the sink's
            # txid: a script the leader let go before may have committed the successor's
            # first txid already, and then the held one would reach Redis first.)
            token = successor.fence()
            waited("a commit of the successor's", lambda: self.sink_fence() >= token or None, 240)
        finally:
            leader.to_redis.release()  # the old leader's script reaches Redis now
            if fault == "freeze":
                os.kill(pid, signal.SIGCONT)
            elif fault == "partition":
                leader.to_zk.heal()
        # Deposed, it stops with an error; what it reports committed since the fault it
        # had committed before its successor started (SIGSTOP may land between a commit
        # and its log line).
        code = leader.run.wait(timeout=180)
        after = leader.run.output()[logged:]
        assert code == 1, f"{leader.name} ({fault}) exited {code}:\n{after[-3000:]}"
        assert re.search(r"error: (LostLeadershipError|FencedError): ", after), after[-3000:]
        late = [int(t) for t in re.findall(r"txid committed txid=(\d+)", after)]
        assert all(t < currtx for t in late), (leader.name, late, currtx)
        deposal = Deposal(fault, leader.name, successor.name, held, currtx, fence, token)
        self.deposals.append(deposal)
        self.say(
            f"{fault}: {leader.name} deposed at txid {held}, {successor.name} leads from "
            f"txid {currtx}"
        )
        leader.close()
        self.contenders.remove(leader)
        self.start()
        return deposal

    # -- the end -----------------------------------------------------------------------

    def finish(self, expected: Expected) -> None:
        """Every staged file added, the sinks waited on until they hold the whole input,
        then every runner stopped (SIGINT, exit 130)."""
        while self.add_input():
            pass

        def whole(read: Callable[[], Image]) -> Callable[[], bool | None]:
            def exact() -> bool | None:
                image = read()
                midway = judge(image, expected, midway=True)
                assert midway.exact, str(midway)  # what no later commit can mend: at once
                return judge(image, expected).exact or None

            return exact

        # Redis first (cheap to read), then Delta, which commits in the same group.
        waited("Redis to hold the whole input", whole(lambda: read_redis(self.redis_url)), 600)
        waited("Delta to hold it", whole(lambda: read_delta(self.delta_path)), 120, 1.0)
        for contender in self.live():
            contender.run.proc.send_signal(signal.SIGINT)
        for contender in list(self.contenders):
            code = contender.run.wait(timeout=120)
            assert code == 130, f"{contender.name} exited {code}:\n{contender.run.tail()}"


def _port(hosts: str) -> int:
    found = re.search(r":(\d+)(/|$)", hosts)
    assert found, hosts
    return int(found.group(1))


def say(text: str) -> None:
    """Print one line of a contest's progress, with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def deposed_writes(writes: ScriptWrites, delta_path: str) -> list[str]:
    """What the sinks' own histories say a deposed leader wrote: each Redis commit
    script that wrote under a token below one that had, each write to Redis outside a
    script, each Delta commit that changed rows without its writer's token or under a
    token below an earlier commit's."""
    found = writes.deposed() + writes.outside()
    fs, where = delta_root(delta_path)
    for table in DELTA_TABLES:
        log = delta_log(fs, f"{where}/{table}/_delta_log")
        found += [
            f"delta {table} version {c.version}: rows written with no fence token"
            for c in log
            if c.changes and c.fence is None
        ]
        found += [
            f"delta {table} version {c.version}: fence {c.fence} after {above.fence}"
            for c, above in deposed(log)
        ]
    return found


def staged_input(directory: Path, files: int, count: int, seed: int) -> tuple[list[Path], Expected]:
    """``files`` files of ``count`` tweets in all (5% bad records), made by the demo's
    generator under ``directory``, and the answer for all of them."""
    from examples.tweets.cli import main as demo

    out = directory / "staged"
    args = ["generate", "--count", str(count), "--seed", str(seed), "--partitions", str(files)]
    assert demo([*args, "--bad-rate", "0.05", "--out", str(out)], out=io.StringIO()) == 0
    return sorted(p for p in out.iterdir() if p.is_file()), expected_counts(out)


def contest(
    *,
    zk_hosts: str,
    redis_url: str,
    delta_path: str,
    workdir: Path,
    faults: Sequence[str],
    runners: int,
    tweets: int,
    seed: int,
    say: Callable[[str], None] = lambda text: None,
) -> Contest:
    """One contest: ``runners`` runners, ``faults`` in turn on whoever leads, every
    witness seen; then the sinks judged record by record and from their histories
    (an AssertionError says what was wrong). Returns the contest, for its figures."""
    # A file for each fault's commit, each expiry made again included, and two more.
    staged, expected = staged_input(workdir, len(faults) * TRIES + 2, tweets, seed)
    inputs = workdir / "input"
    failed: AssertionError | None = None
    with (
        ScriptWrites(redis_url, workdir / "monitor.log") as writes,
        Contest(
            zk_hosts, redis_url, delta_path, staged, inputs, workdir, runners, say=say
        ) as running,
    ):
        try:
            for fault in faults:
                running.depose(fault)
            running.finish(expected)
        except AssertionError as exc:  # raised after what the sinks' histories say
            failed = exc
    wrong = deposed_writes(writes, delta_path)
    assert wrong == [], wrong[:10]
    if failed is not None:
        raise failed
    for image in (read_redis(redis_url), read_delta(delta_path)):
        verdict = judge(image, expected)
        assert verdict.exact, str(verdict)
    # Each deposed leader's held script reached Redis after its successor's first (and
    # wrote nothing, by ``deposed_writes``).
    fences = writes.fences()
    for deposal in running.deposals:
        assert deposal.successor_fence > deposal.fence, deposal
        later = fences[fences.index(deposal.successor_fence) :]
        assert deposal.fence in later, (deposal, fences)
    return running


def _chroot(hosts: str, path: str) -> str:
    """``hosts`` under the chroot ``path``, made first."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    client.ensure_path(path)
    client.stop()
    client.close()
    return hosts + path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.contention``: contests in a row on servers of its own, each
    with ``--rounds`` faults (the kinds in turn, from a different one each contest),
    two and three runners and the Delta tables local and in the S3 stand-in in turn.
    Exit status 1 if any contest found a deposed write, an inexact sink or a fault
    that did not fire; ``--markdown`` writes the table (``make chaos``:
    tests/CONTENTION.md)."""
    import redis

    from tests.provenance import commit
    from transactional.testing.servers import RedisServer, S3Server, ZooKeeperServer

    parser = argparse.ArgumentParser(prog="python -m tests.contention", description=__doc__)
    parser.add_argument("--contests", type=int, default=6, help="how many (default 6)")
    parser.add_argument("--rounds", type=int, default=6, help="faults a contest (default 6)")
    parser.add_argument("--tweets", type=int, default=4000, help="input of each contest")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--markdown", type=Path, help="write the table here")
    opts = parser.parse_args(argv)

    began = time.monotonic()
    rows: list[str] = []
    tally: Counter[str] = Counter()
    failed = reelected = 0
    root = Path(tempfile.mkdtemp(prefix="contention-"))
    zookeeper, redis_server, s3 = ZooKeeperServer(), RedisServer(), S3Server()
    try:
        for server in (zookeeper, redis_server, s3):
            server.start()
        os.environ.update(s3.settings)
        for n in range(opts.contests):
            order = [FAULTS[(n + i) % len(FAULTS)] for i in range(opts.rounds)]
            where = "s3" if n % 2 else "local"
            delta = f"s3://{s3.bucket()}/delta" if where == "s3" else str(root / f"{n}/delta")
            runners = 2 + n % 2
            say(f"contest {n + 1}: {runners} runners, Delta {where}, faults {', '.join(order)}")
            workdir = root / str(n)
            workdir.mkdir(parents=True, exist_ok=True)
            redis.Redis.from_url(redis_server.url).flushdb()
            started = time.monotonic()
            running: Contest | None = None
            try:
                running = contest(
                    zk_hosts=_chroot(zookeeper.hosts, f"/contest-{n}"),
                    redis_url=redis_server.url,
                    delta_path=delta,
                    workdir=workdir,
                    faults=order,
                    runners=runners,
                    tweets=opts.tweets,
                    seed=opts.seed + n,
                    say=say,
                )
                verdict = "exact, no deposed write"
            except AssertionError as exc:
                failed += 1
                verdict = f"FAILED: {(str(exc).splitlines() or [repr(exc)])[0][:200]}"
            say(f"contest {n + 1}: {verdict}")
            deposals = running.deposals if running is not None else []
            tally.update(d.fault for d in deposals)
            reelected += running.reelected if running is not None else 0
            chain = "; ".join(
                f"{d.fault} {d.leader}->{d.successor} at txid {d.currtx}" for d in deposals
            )
            rows.append(
                f"| {n + 1} | {runners} | {where} | {chain or '-'} | "
                f"{round(time.monotonic() - started)} s | {verdict} |"
            )
    finally:
        for server in (zookeeper, redis_server, s3):
            server.close()
        shutil.rmtree(root, ignore_errors=True)
    summary = (
        f"{opts.contests} contests, {opts.contests - failed} exact with no deposed write; "
        f"leaders deposed: {', '.join(f'{k} {v}' for k, v in sorted(tally.items()))}; "
        f"expiries made again after the leader won the election back: {reelected}"
    )
    say(summary)
    if opts.markdown is not None:
        command = " ".join(["python -m tests.contention", *(argv or sys.argv[1:])])
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        table = "\n".join(
            [
                "| contest | runners | Delta | deposals (fault, leader -> successor, "
                "successor's first txid) | time | verdict |",
                "|---|---|---|---|---|---|",
                *rows,
            ]
        )
        opts.markdown.write_text(
            "# Live runners in contention: the last run\n\n"
            f"`{command}` at commit `{commit()}`, {when}, on {os.cpu_count()} cores in "
            f"{round(time.monotonic() - began) // 60} min. Written by the run itself "
            "(`--markdown`); how it works: tests/contention.py.\n\n"
            f"{summary}.\n\n{table}\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
