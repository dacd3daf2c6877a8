"""``transactional`` as a user runs it: a factory from the current directory, settings
from flags, a config file and the environment, the exit codes "Running a topology"
(docs/how-to/run.md) gives, Ctrl-C and SIGTERM, and ``status``/``list`` that never write."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from coordinators import SQLiteStateStore
from tests.jvm import driver_opts, short_lived
from tests.witness import zk_owner

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "transactional.cli"]
TOPOLOGIES = Path(__file__).with_name("cli_topologies.py")


def buckets(total: int) -> dict[str, int]:
    return dict(Counter(f"k{n % 7}" for n in range(total)))


def held(url: str) -> dict[str, int]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return {str(k): int(v) for k, v in client.hgetall("buckets").items()}
    finally:
        client.close()


def env(redis_url: str, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRANSACTIONAL_")}
    clean.pop("PYTHONPATH", None)  # the factory is found from the current directory
    return short_lived({**clean, "CLI_REDIS_URL": redis_url, **extra})


def cli(
    *args: str, cwd: Path = ROOT, environ: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout
    )


def run_args(state: Path, *extra: str) -> list[str]:
    return [
        "run",
        "tests.e2e.cli_topologies:numbers",
        "--topology-id",
        "numbers",
        "--state-dir",
        str(state),
        "--master",
        "local[2]",
        "--until-drained",
        *extra,
    ]


def currtx(state: Path, topology_id: str = "numbers") -> int:
    store = SQLiteStateStore(state / "state.db")
    store.open(topology_id, read_only=True)
    try:
        return store.read_state().currtx
    finally:
        store.close()


def test_a_factory_from_the_current_directory_with_a_fixed_batch_size(
    redis_url: str, tmp_path: Path
) -> None:
    """Run from a directory holding the user's module, without PYTHONPATH: the module
    is a copy of ``cli_topologies`` (it imports installed packages only)."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(TOPOLOGIES, project / "my_topology.py")
    environ = env(redis_url, CLI_TOTAL="230")
    assert "PYTHONPATH" not in environ
    done = cli(
        "run",
        "my_topology:numbers",
        "--topology-id",
        "numbers",
        "--state-dir",
        str(tmp_path / "state"),
        "--master",
        "local[2]",
        "--until-drained",
        "--batch-size",
        "100",
        cwd=project,
        environ=environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "committed 3 txids, 230 records, 0 failures"
    assert held(redis_url) == buckets(230)
    assert currtx(tmp_path / "state") == 4  # 100 + 100 + 30: --batch-size, not the default 50


def test_a_module_that_cannot_be_found_or_is_not_a_factory_exits_2(
    redis_url: str, tmp_path: Path
) -> None:
    missing = cli("run", "no_such_module:build", "--topology-id", "x", environ=env(redis_url))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"error: cannot import the topology module 'no_such_module': not found from {ROOT} or "
        "the installed packages; run from the directory that holds it, or install it"
    ]
    wrong = cli(
        "run",
        "tests.e2e.cli_topologies:not_a_topology",
        "--topology-id",
        "x",
        "--state-dir",
        str(tmp_path),
        environ=env(redis_url),
    )
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        "error: topology factory 'tests.e2e.cli_topologies:not_a_topology' returned dict, "
        "not a Topology: return TopologyBuilder()...build()"
    ]
    # The module is there but imports something missing: that import is what is named.
    (tmp_path / "my_job.py").write_text("import my_missing_dependency\n")
    broken = cli("run", "my_job:build", "--topology-id", "x", cwd=tmp_path, environ=env(redis_url))
    assert broken.returncode == 2
    assert broken.stderr.strip().splitlines() == [
        "error: the topology module 'my_job' failed to import: ModuleNotFoundError: No module "
        "named 'my_missing_dependency'; install what it imports"
    ]
    # A module named like one of Python's own would hide it: refused, naming both.
    (tmp_path / "numbers.py").write_text("def build():\n    pass\n")
    # (The installed ``transactional`` command: ``python -m`` itself would put the
    # directory first, and Python would break before the CLI could say anything.)
    shadowed = subprocess.run(
        [
            str(Path(sys.executable).with_name("transactional")),
            "run",
            "numbers:build",
            "--topology-id",
            "x",
        ],
        cwd=tmp_path,
        env=env(redis_url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shadowed.returncode == 2
    assert shadowed.stderr.strip().splitlines() == [
        "error: the topology module 'numbers' is named like Python's own module 'numbers', "
        "which it would hide from everything imported after it: rename numbers.py"
    ]
    assert not (tmp_path / ".transactional").exists()


@pytest.mark.parametrize(
    ("args", "environ", "line"),
    [
        (
            ["--max-pending", "0"],
            {},
            "error: runner setting max_pending='0' (from --max-pending): Input should be greater "
            "than or equal to 1",
        ),
        (
            ["--conf", "max_pending=many"],
            {},
            "error: runner setting max_pending='many' (from --conf): Input should be a valid "
            "integer, unable to parse string as an integer",
        ),
        (
            [],
            {"TRANSACTIONAL_POLL_INTERVAL_S": "-1"},
            "error: runner setting poll_interval_s='-1' (from TRANSACTIONAL_POLL_INTERVAL_S): "
            "Input should be greater than 0",
        ),
        (
            ["--conf", "spark_sql=1"],
            {},
            "error: --conf 'spark_sql=1': 'spark_sql' is neither a Spark setting (spark.*) nor a "
            "runner setting",
        ),
        (
            ["--batch-size", "lots"],
            {},
            "error: setting batch_size='lots' (from --batch-size): expected a number or 'auto', "
            "not 'lots'",
        ),
        (
            ["--conf", "spark.sql.shuffle.partitions"],
            {},
            "error: --conf 'spark.sql.shuffle.partitions': expected key=value",
        ),
        (
            ["--config", "{config}"],
            {},
            "error: config file {config}: unknown setting 'max_pendng' (did you mean "
            "'max_pending', under [runner]?)",
        ),
        (
            ["--config", "{config}", "--conf", "spark.sql.shuffle.partitions=2"],
            {"CONFIG": "[runner]\nmax_pendng = 2\n"},
            "error: config file {config}: unknown setting in [runner]: 'max_pendng' (did you "
            "mean 'max_pending'?)",
        ),
        (
            ["--config", "{config}"],
            {"CONFIG": "max_pending = \n"},
            "error: config file {config} cannot be read as TOML: ",
        ),
    ],
    ids=[
        "max-pending-0",
        "conf-not-int",
        "env-negative",
        "conf-unknown",
        "batch-size",
        "conf-malformed",
        "file-unknown-key",
        "file-unknown-runner-key",
        "file-not-toml",
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2_before_anything_starts(
    redis_url: str, tmp_path: Path, args: list[str], environ: dict[str, str], line: str
) -> None:
    config = tmp_path / "topology.toml"
    config.write_text(environ.pop("CONFIG", "max_pendng = 2\n"))
    args = [a.format(config=config) for a in args]
    line = line.format(config=config)
    done = cli(*run_args(tmp_path / "state", *args), environ=env(redis_url, **environ))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.strip().startswith(line)
    assert not (tmp_path / "state").exists()  # nothing was touched


def test_a_config_file_under_env_under_flags(redis_url: str, tmp_path: Path) -> None:
    config = tmp_path / "topology.toml"
    config.write_text(
        'topology_id = "numbers"\nmaster = "local[2]"\nbatch_size = 20\nuntil_drained = true\n'
        f'state_dir = "{tmp_path / "from-file"}"\n'
        "[runner]\nmax_pending = 3\n"
        '[spark]\n"spark.sql.shuffle.partitions" = "2"\n'
    )
    environ = env(redis_url, CLI_TOTAL="90", TRANSACTIONAL_BATCH_SIZE="30")
    done = cli(
        "run",
        "tests.e2e.cli_topologies:numbers",
        "--config",
        str(config),
        "--state-dir",
        str(tmp_path / "from-flag"),
        environ=environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # batch 30 from the environment over the file's 20; the flag's state dir over the file's.
    assert done.stdout.strip() == "committed 3 txids, 90 records, 0 failures"
    assert currtx(tmp_path / "from-flag") == 4 and not (tmp_path / "from-file").exists()
    assert held(redis_url) == buckets(90)


def test_a_poison_batch_exits_1_and_the_fixed_rerun_resumes(redis_url: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    failing = cli(
        *run_args(state, "--max-attempts", "2", "--conf", "backoff_max_s=0.2"),
        environ=env(redis_url, CLI_TOTAL="200", CLI_FAIL_TXID="3"),
    )
    assert failing.returncode == 1, failing.stderr[-3000:]
    assert "error: txid 3 failed on all 2 attempts; metadata=Range(start=100, count=50)" in (
        failing.stderr
    )
    assert "RuntimeError: cannot bucket txid 3" in failing.stderr
    assert "Traceback" not in failing.stderr
    assert currtx(state) == 3 and held(redis_url) == buckets(100)
    fixed = cli(*run_args(state), environ=env(redis_url, CLI_TOTAL="200"))
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert held(redis_url) == buckets(200)


@pytest.mark.parametrize(
    "signum",
    [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM],
    ids=["sigint", "sigterm"],
)
def test_an_interrupt_stops_cleanly_with_130_and_the_rerun_is_exact(
    redis_url: str, tmp_path: Path, signum: int
) -> None:
    state = tmp_path / "state"
    total = 5000
    args = [
        "run",
        "tests.e2e.cli_topologies:numbers",
        "--topology-id",
        "numbers",
        "--state-dir",
        str(state),
        "--master",
        "local[2]",
        "--batch-size",
        "50",
        "--max-pending",
        "1",
    ]
    proc = subprocess.Popen(
        [*CLI, *args],
        cwd=ROOT,
        env=env(redis_url, CLI_TOTAL=str(total)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        deadline = time.monotonic() + 240
        while int(client.get("transactional:numbers:sink:txid") or 0) < 2:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no commit within 240 s"
            time.sleep(0.2)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        client.close()
    assert proc.returncode == 130, err[-3000:]
    # One line of ours; Spark's JVM writes its WARN lines to the same stderr at any time.
    said = re.findall(
        r"interrupted \((\w+)\): committed (\d+) txids \(last (\d+)\); txids in flight "
        r"were abandoned and replay on the next run",
        err,
    )
    assert [s[0] for s in said] == [signal.Signals(signum).name], err
    others = [line for line in err.splitlines() if "WARN" not in line and line.strip()]
    assert [line for line in others if "interrupted (" not in line] == [], err
    assert "Traceback" not in err and out == ""
    assert int(said[0][1]) >= 2 and int(said[0][2]) >= 2, err
    stopped_at = currtx(state)
    assert 2 < stopped_at <= total // 50  # stopped mid-run, advanced past its commits
    done = cli(*run_args(state), environ=env(redis_url, CLI_TOTAL=str(total)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert held(redis_url) == buckets(total)


# ---------------------------------------------------------------------- status and list


def test_status_and_list_on_sqlite_never_write(redis_url: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    missing = cli("status", "--topology-id", "numbers", "--state-dir", str(state))
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"error: there is no SQLite state store at {state / 'state.db'} (no such file); check "
        "--state-dir: a run creates the store there"
    )
    assert not state.exists()

    done = cli(*run_args(state), environ=env(redis_url, CLI_TOTAL="120"))
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in state.iterdir())
    unknown = cli("status", "--topology-id", "numbres", "--state-dir", str(state))
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        f"error: no topology 'numbres' in the SQLite state store {state / 'state.db'}; "
        "topologies there: numbers. Check --topology-id and the store's location "
        "(--state-dir or --zookeeper)"
    )
    known = cli("status", "--topology-id", "numbers", "--state-dir", str(state))
    assert known.returncode == 0, known.stderr
    shown = known.stdout.splitlines()
    assert shown[0] == "topology numbers: currtx=4"
    assert shown[-2:] == [
        "  kept for rewinds: 2 committed txids (1..2); `transactional status --json` shows "
        "the metadata of each",
        "  txid 3 (committed): {'count': 20, 'start': 100}",
    ]
    assert shown[1].startswith("  runner: stopped at ")
    assert shown[2] == "  txids: last committed 3, last stored 3; 3 committed by its run"
    assert shown[3].startswith("  records: 120 committed by all runs; lag ")
    scripted = cli("status", "--topology-id", "numbers", "--state-dir", str(state), "--json")
    assert scripted.returncode == 0, scripted.stderr
    document = json.loads(scripted.stdout)
    assert (document["currtx"], document["last_committed"]) == (4, 3)
    assert document["stored"] == {  # 1 and 2 kept for rewinds: with their metadata too
        "1": {"committed": True, "meta": {"count": 50, "start": 0}, "partitions": {}},
        "2": {"committed": True, "meta": {"count": 50, "start": 50}, "partitions": {}},
        "3": {"committed": True, "meta": {"count": 20, "start": 100}, "partitions": {}},
    }
    assert document["rewind_targets"] == [0, 1, 2, 3]
    assert document["sinks"] is None  # no factory given: the sinks are not read
    runner = document["runner"]
    assert (runner["running"], runner["in_flight"], runner["last_error"]) == (False, [], None)
    assert (runner["committed_txids"], runner["records"], runner["last_committed"]) == (3, 120, 3)
    assert (runner["retries"], runner["failures"]) == (0, {})
    with_sinks = cli(
        *("status", "tests.e2e.cli_topologies:numbers", "--topology-id", "numbers"),
        *("--state-dir", str(state), "--json"),
        environ=env(redis_url),
    )
    assert with_sinks.returncode == 0, with_sinks.stderr
    assert json.loads(with_sinks.stdout)["sinks"] == {
        "sink": {"committer": "RedisCommitter", "txid": 3}
    }
    client = redis.Redis.from_url(redis_url)
    client.set("transactional:numbers:sink:txid", 5)  # as if the store lagged a group
    client.close()
    ahead = cli(
        *("status", "tests.e2e.cli_topologies:numbers", "--topology-id", "numbers"),
        *("--state-dir", str(state)),
        environ=env(redis_url),
    )
    assert (
        "  sink sink (RedisCommitter): holds txid 5, ahead of the store's 3: replayed as held"
        in ahead.stdout.splitlines()
    ), ahead.stdout
    screen = tmp_path / "watch.out"
    with screen.open("w") as sink:  # its live display on, as on a terminal
        watching = subprocess.Popen(
            [
                *(sys.executable, "-m", "transactional.cli", "status", "--topology-id", "numbers"),
                *("--state-dir", str(state), "--watch", "--interval", "0.2"),
            ],
            cwd=ROOT,
            env={**os.environ, "TTY_COMPATIBLE": "1"},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while "stopped at" not in screen.read_text() and watching.poll() is None:
        assert time.monotonic() < deadline, screen.read_text()
        time.sleep(0.1)
    watching.send_signal(signal.SIGINT)  # once it has screen the status: Ctrl-C
    assert watching.wait(timeout=30) == 0, screen.read_text()
    out = screen.read_text()
    assert "topology numbers" in out and "runner" in out and "stopped at" in out
    listed = cli("list", "--state-dir", str(state))
    assert (listed.returncode, listed.stdout) == (0, "numbers\n")
    after = sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in state.iterdir())
    assert after == files  # status and list wrote nothing


def zk_tree(hosts: str) -> list[str]:
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    try:
        found: list[str] = []

        def walk(path: str) -> None:
            for child in sorted(client.get_children(path)):
                found.append(f"{path.rstrip('/')}/{child}")
                walk(f"{path.rstrip('/')}/{child}")

        walk("/")
        return found
    finally:
        client.stop()
        client.close()


def test_status_and_list_on_zookeeper_never_write(
    redis_url: str, zk_hosts: str, tmp_path: Path
) -> None:
    empty = cli("list", "--zookeeper", zk_hosts)
    assert (empty.returncode, empty.stdout) == (0, "")
    before = zk_tree(zk_hosts)
    unknown = cli("status", "--topology-id", "ghost", "--zookeeper", zk_hosts)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        f"error: no topology 'ghost' in ZooKeeper at {zk_hosts}; topologies there: none. "
        "Check --topology-id and the store's location (--state-dir or --zookeeper)"
    )
    assert zk_tree(zk_hosts) == before  # no znode created for the unknown id

    done = cli(*run_args(tmp_path, "--zookeeper", zk_hosts), environ=env(redis_url, CLI_TOTAL="60"))
    assert done.returncode == 0, done.stderr[-3000:]
    before = zk_tree(zk_hosts)
    listed = cli("list", "--zookeeper", zk_hosts)
    assert (listed.returncode, listed.stdout) == (0, "numbers\n")
    known = cli("status", "--topology-id", "numbers", "--zookeeper", zk_hosts)
    assert known.returncode == 0 and known.stdout.startswith("topology numbers: currtx=3\n")
    assert "  txids: last committed 2, last stored 2; 2 committed by its run" in known.stdout
    again = cli("status", "--topology-id", "ghost", "--zookeeper", zk_hosts)
    assert again.returncode == 2 and "topologies there: numbers." in again.stderr
    assert zk_tree(zk_hosts) == before


def raw_report(state: Path, hosts: str | None) -> dict[str, object] | None:
    """The runner's status document as stored, read without the code under test."""
    if hosts is None:
        db = state / "state.db"
        if not db.exists():
            return None
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)) as conn:
            try:
                row = conn.execute(
                    "SELECT doc FROM runner_status WHERE topology_id = 'numbers'"
                ).fetchone()
            except sqlite3.OperationalError:  # no table yet
                return None
        return None if row is None else dict(json.loads(row[0]))
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    try:
        data, _ = client.get("/transactional/numbers/status")
        return dict(json.loads(data))
    except NoNodeError:
        return None
    finally:
        client.stop()
        client.close()


@pytest.mark.parametrize("kind", ["sqlite", "zookeeper"])
@pytest.mark.rotated
def test_status_of_a_killed_run_of_every_run_and_after_a_rewind(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    """A run SIGKILLed while txid 4 fails and is retried: ``status`` says it is not
    running once its ZooKeeper session has ended, or at once on SQLite (its lock went
    with it), since its last report, and that txid 4 replays. After a second run, the
    records of both (250: every number once) and the spout's own batch size (50, no
    ``--batch-size``); after ``rewind --to 2``, txid 2 as the last committed."""
    state, delta = tmp_path / "state", tmp_path / "delta"
    hosts = request.getfixturevalue("zk_hosts") if kind == "zookeeper" else None
    where = ["--topology-id", "numbers", "--state-dir", str(state)]
    where += ["--zookeeper", hosts] if hosts else []
    environ = env(
        "redis://unused",
        CLI_DELTA=str(delta),
        CLI_TOTAL="250",
        SPARK_SUBMIT_OPTS=driver_opts(quick=True),
        SPARK_LOCAL_DIRS=str(tmp_path / "spark"),
    )
    factory = "tests.e2e.cli_topologies:numbers_in_delta"
    run = ["run", factory, *where, "--master", "local[1]", "--max-pending", "1"]
    retrying = [*run, "--status-interval", "0.2", "--max-attempts", "1000"]
    retrying += ["--conf", "backoff_max_s=0.5", *(["--zk-session-timeout", "4"] if hosts else [])]
    log = tmp_path / "first.log"
    with log.open("w") as out:
        first = subprocess.Popen(
            [*CLI, *retrying],
            cwd=ROOT,
            env={**environ, "CLI_FAIL_TXID": "4"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        # Txids 1..3 committed, txid 4 failed once at least: it is retried for ever.
        while not ((raw_report(state, hosts) or {}).get("failures")):
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "txid 4 did not fail within 240 s"
            time.sleep(0.2)
        live = json.loads(cli("status", *where, "--json").stdout)["runner"]
        assert first.poll() is None, log.read_text()[-3000:]
        assert live["running"] is True, live
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    if hosts:  # its session outlives it by the session timeout, 4 s
        deadline = time.monotonic() + 60
        while zk_owner(hosts, "/transactional/numbers/leader") is not None:
            assert time.monotonic() < deadline, "the killed run's session did not end"
            time.sleep(0.2)
        gone = "its ZooKeeper session ended: no session holds /transactional/numbers/leader"
    else:  # its lock went with it
        gone = f"no process holds its lock file {state / 'state.db'}.numbers.lock"
    scripted = cli("status", *where, "--json")
    assert scripted.returncode == 0, scripted.stderr
    document = json.loads(scripted.stdout)
    killed = document["runner"]
    assert killed["running"] is False, killed
    assert killed["liveness"] == {"why": gone, "since": killed["updated_at"]}
    assert live["liveness"] == {"why": "it holds the leadership", "since": None}
    leader = killed["leader"]
    assert (leader["host"], leader["pid"]) == (socket.gethostname(), first.pid)
    assert (document["currtx"], killed["last_committed"], killed["batch_size"]) == (4, 3, 50)
    assert (killed["records"], killed["records_total"]) == (150, 150)
    shown = cli("status", *where).stdout.splitlines()
    assert shown[1:3] == [
        f"  runner: NOT RUNNING since {killed['updated_at']}, its last report: {gone}; it "
        f"ran on {leader['host']} pid {first.pid}, fence {leader['fence']}, from "
        f"{killed['started_at']}",
        "  txids: last committed 3, last stored 4; 3 committed by its run",
    ]
    assert "  not committed: txid 4 stored; the next run replays it" in shown
    assert not [line for line in shown if line.startswith("  in flight: ")]

    second = cli(*run, "--until-drained", environ=environ)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.strip() == "committed 2 txids, 100 records, 0 failures"
    from deltalake import DeltaTable

    rows = DeltaTable(str(delta / "buckets")).to_pyarrow_table().to_pylist()
    assert {r["key"]: r["count"] for r in rows} == buckets(250)
    stopped = json.loads(cli("status", *where, "--json").stdout)["runner"]
    assert (stopped["running"], stopped["liveness"]) == (
        False,
        {"why": "it stopped", "since": stopped["updated_at"]},
    )
    figures = ("records", "records_total", "uncounted_txids", "batch_size")
    assert [stopped[f] for f in figures] == [100, 250, 0, 50]
    records = cli("status", *where).stdout.splitlines()[3]
    assert records.startswith("  records: 250 committed by all runs; lag "), records
    assert records.endswith("; batch size 50"), records

    back = cli("rewind", factory, *where, "--to", "2", environ=environ)
    assert back.returncode == 0, back.stderr[-3000:]
    rewound = cli("status", *where)
    assert rewound.stdout.splitlines()[:3] == [
        "topology numbers: currtx=3",
        f"  runner: stopped at {stopped['updated_at']}; it ran on {socket.gethostname()} pid "
        f"{stopped['leader']['pid']}, fence {stopped['leader']['fence']}, from "
        f"{stopped['started_at']}",
        "  txids: last committed 2, last stored 2; 2 committed by its run",
    ]
    assert json.loads(cli("status", *where, "--json").stdout)["last_committed"] == 2
