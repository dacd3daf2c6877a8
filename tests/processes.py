"""The demo as a real process, and what a crash leaves behind: the helpers of the crash
tests and of the chaos campaign (``python -m tests.chaos``).

State is read here without the code under test: the SQLite store with plain SQL, the
Redis committer's txid key with redis-py, and the Delta txid markers from the JSON
commit files of each table's ``_delta_log``.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tests.jvm import short_lived
from tests.reference import Expected, expected_counts

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY_ID = "tweets"
#: The Delta tables the demo writes (counters, then dead letters).
DELTA_TABLES = ("hashtags", "users", "users_hashtags", "dead_letters")
#: Opaque-mode Delta markers are ``txid * ATTEMPT_SLOTS + rewrite``.
ATTEMPT_SLOTS = 1_000_000


#: Demo processes started and killed (SIGKILL, by a crash plan or by a test) in this
#: process: what a planted run reports had happened by the time a test caught its bug.
DEMO_RUNS = {"started": 0, "killed": 0}


def demo_command(env: dict[str, str]) -> list[str]:
    """How to start the demo under ``env``: ``python -m examples.tweets``, or, in a
    planted run (``tests.mutation``), its launcher, which plants the bug first."""
    from tests.mutation import PLANTED

    module = "tests.mutation.launch" if env.get(PLANTED) else "examples.tweets"
    return [sys.executable, "-m", module]


def demo_env(**extra: str) -> dict[str, str]:
    """The environment of a demo process: this checkout importable, no crash plan or
    executors' Python inherited, Spark on loopback only, and a JVM tuned for short lives
    (``tests.jvm``: Spark starts on about a third less CPU, which is most of what a crash
    test spends)."""
    # Nor the executors' Python this process may have set for its own session: a run
    # on a cluster must get it from its own settings.
    inherited = ("TRANSACTIONAL_CRASH_AT", "PYSPARK_PYTHON")
    env = short_lived({k: v for k, v in os.environ.items() if k not in inherited})
    env["PYTHONPATH"] = str(ROOT)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # bind and advertise loopback only
    env.update(extra)
    return env


class DemoProcess:
    """``python -m examples.tweets ARGS`` in a session of its own, output to ``log``.

    Its Spark scratch space (``SPARK_LOCAL_DIRS``: shuffle and block files, the copies
    of the jars its executors fetch: 14 MB for the demo) is a directory of its own,
    removed once the run has ended: a SIGKILLed JVM cannot remove its own, and the crash
    tests kill hundreds."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._out: IO[bytes] = log.open("wb")
        self.scratch = Path(tempfile.mkdtemp(prefix="demo-spark-"))
        self._remove_scratch = weakref.finalize(self, shutil.rmtree, self.scratch, True)
        env = env or demo_env()
        self.proc = subprocess.Popen(
            [*demo_command(env), *args],
            cwd=ROOT,
            env={**env, "SPARK_LOCAL_DIRS": str(self.scratch)},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        DEMO_RUNS["started"] += 1

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float = 600) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"demo run did not end within {timeout}s:\n{self.tail()}"
            ) from None
        self._ended()
        return code

    def kill(self) -> int:
        """SIGKILL the whole session's group, as a power cut would."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        code = self.proc.wait()
        self._ended()
        return code

    def _ended(self) -> None:
        if not self._out.closed and self.proc.returncode == -signal.SIGKILL:
            DEMO_RUNS["killed"] += 1
        self._out.close()
        self._remove_scratch()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_said(self, pattern: str, timeout: float, since: int = 0) -> re.Match[str]:
        """Wait until the run's output past its first ``since`` characters matches
        ``pattern`` (the first match), the run still going; an AssertionError past
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.output()[since:], re.MULTILINE)) is None:
            assert self.poll() is None, f"the run ended before saying {pattern!r}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"not said in {timeout:.0f}s: {pattern!r}"
            time.sleep(0.05)
        return found

    def tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]


def _session(sid: int) -> list[tuple[int, str, str, int]]:
    """``(pid, command, state, ppid)`` of every process of session ``sid``, zombies
    included: a run's JVM and Python workers keep its session even after their group
    or parent changed."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        head, _, tail = stat.rpartition(")")
        fields = tail.split()
        if int(fields[3]) == sid:
            members.append((int(entry.name), head.split("(", 1)[1], fields[0], int(fields[1])))
    return members


def alive_in_session(sid: int) -> list[int]:
    return [pid for pid, _, state, _ in _session(sid) if state not in ("Z", "X")]


def wait_session_gone(sid: int, timeout: float = 30) -> list[int]:
    """Wait until nothing of session ``sid`` lives; returns what still does."""
    deadline = time.monotonic() + timeout
    while (alive := alive_in_session(sid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


_PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """Make this process the reaper of its descendants' orphans (Linux ``prctl``), so a
    killed run's JVM and workers become its children and ``reap_session`` can read how
    each ended: killed, or exited on its own after its driver died."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def reap_session(sid: int, timeout: float = 60) -> dict[int, tuple[str, int]]:
    """Wait for every process left of session ``sid`` (adopted, see ``adopting_orphans``)
    and return ``pid -> (command, wait status)``. Raises ``AssertionError`` if some
    process still lives after ``timeout`` seconds."""
    reaped: dict[int, tuple[str, int]] = {}
    deadline = time.monotonic() + timeout
    while members := _session(sid):
        for pid, command, _, ppid in members:
            if ppid == os.getpid():
                with contextlib.suppress(ChildProcessError):  # reaped meanwhile
                    reaped[pid] = (command, os.waitpid(pid, 0)[1])
        if time.monotonic() > deadline:
            raise AssertionError(f"session {sid} outlived its kill: {_session(sid)}")
        time.sleep(0.02)
    return reaped


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def store_state(state_dir: Path, topology_id: str = TOPOLOGY_ID) -> tuple[int, list[int]]:
    """``(currtx, txids with stored metadata)`` from the SQLite store."""
    db = state_dir / "state.db"
    if not db.exists():
        return 1, []
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(
            "SELECT txid FROM currtx WHERE topology_id = ?", (topology_id,)
        ).fetchone()
        metas = conn.execute(
            "SELECT txid FROM coordinator_meta WHERE topology_id = ? ORDER BY txid",
            (topology_id,),
        ).fetchall()
    except sqlite3.OperationalError:  # the first run died before creating the tables
        return 1, []
    finally:
        conn.close()
    return (int(row[0]) if row else 1), [int(t) for (t,) in metas]


def stored_metas(state_dir: Path, topology_id: str = TOPOLOGY_ID) -> dict[int, Any]:
    """Each txid's stored coordinator metadata (JSON) in the SQLite store, read with plain
    SQL: what a batch holds, as the runner decided it."""
    rows = _store_rows(state_dir, "SELECT txid, meta FROM coordinator_meta", topology_id)
    return {int(t): json.loads(meta) for t, meta in rows}


def stored_partition_metas(
    state_dir: Path, topology_id: str = TOPOLOGY_ID
) -> dict[int, dict[int, Any]]:
    """Each txid's stored partition metadata (JSON) in the SQLite store (txid ->
    partition -> metadata), read with plain SQL: what a partitioned or opaque spout's
    batch held, partition by partition."""
    sql = "SELECT txid, partition, meta FROM partition_meta"
    out: dict[int, dict[int, Any]] = {}
    for txid, partition, meta in _store_rows(state_dir, sql, topology_id):
        out.setdefault(int(txid), {})[int(partition)] = json.loads(meta)
    return out


def _store_rows(state_dir: Path, select: str, topology_id: str) -> list[Any]:
    """The rows of ``select`` (a query of one table, without its WHERE) for
    ``topology_id`` in the SQLite store; none before the store was created."""
    db = state_dir / "state.db"
    if not db.exists():
        return []
    conn = sqlite3.connect(db)
    try:
        return conn.execute(f"{select} WHERE topology_id = ?", (topology_id,)).fetchall()
    except sqlite3.OperationalError:  # the first run died before creating the tables
        return []
    finally:
        conn.close()


def store_group(state_dir: Path, topology_id: str = TOPOLOGY_ID) -> tuple[int, int] | None:
    """The commit group the SQLite store holds (``record_group``), if any."""
    db = state_dir / "state.db"
    if not db.exists():
        return None
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(
            "SELECT first, last FROM commit_group WHERE topology_id = ?", (topology_id,)
        ).fetchone()
    except sqlite3.OperationalError:  # the first run died before creating the tables
        return None
    finally:
        conn.close()
    return None if row is None else (int(row[0]), int(row[1]))


def redis_txid(
    url: str,
    committer: str,
    topology_id: str = TOPOLOGY_ID,
    prefix: str = "",
    cluster: bool = False,
) -> int:
    """The last txid the Redis committer named ``committer`` applied (0: none), its keys
    behind ``prefix`` (``cluster``: read through redis-py's Redis Cluster client)."""
    import redis
    import redis.cluster

    key = f"{prefix}transactional:{topology_id}:{committer}:txid"
    client: Any = (
        redis.cluster.RedisCluster.from_url(url, socket_connect_timeout=5)
        if cluster
        else redis.Redis.from_url(url, socket_connect_timeout=5)
    )
    try:
        return int(client.get(key) or 0)
    finally:
        client.close()


def _log_texts(root: Path | str, table: str) -> list[str]:
    """The JSON commit files of a table's log under ``root`` (a directory, or an
    ``s3://``/``s3a://`` URL read by pyarrow with the standard AWS settings)."""
    if "://" not in str(root):
        return [c.read_text() for c in sorted((Path(root) / table / "_delta_log").glob("*.json"))]
    import pyarrow.fs as pa_fs

    where = str(root).split("://", 1)[1].rstrip("/")
    s3 = pa_fs.FileSystem.from_uri(f"s3://{where.split('/', 1)[0]}")[0]
    selector = pa_fs.FileSelector(f"{where}/{table}/_delta_log", allow_not_found=True)
    texts = []
    for info in sorted(s3.get_file_info(selector), key=lambda i: i.path):
        if info.path.endswith(".json"):
            with s3.open_input_stream(info.path) as stream:
                texts.append(stream.read().decode())
    return texts


def delta_txid(
    path: Path | str, committer: str, opaque: bool, topology_id: str = TOPOLOGY_ID
) -> int:
    """The txid every Delta table under ``path`` (a directory or an S3 URL) holds (the
    lowest over the tables; 0: none), from the ``txn`` actions of the committed log
    files. A commit file appears atomically, so a commit cut short by a kill is simply
    not there."""
    held = []
    for table in DELTA_TABLES:
        app_id = f"{topology_id}:{committer}:{table}" + (":opaque" if opaque else "")
        version = 0
        for text in _log_texts(path, table):
            for line in text.splitlines():
                txn = json.loads(line).get("txn") if line.strip() else None
                if txn and txn.get("appId") == app_id:
                    version = max(version, int(txn["version"]))
        held.append(version // ATTEMPT_SLOTS if opaque else version)
    return min(held)


def printed_tops(text: str) -> dict[tuple[str, str], list[tuple[str, int]]]:
    """The rows of the rich tables the demo prints, by (sink header, table title); the
    sink header is "" when only one sink is shown."""
    tables: dict[tuple[str, str], list[tuple[str, int]]] = {}
    sink, title = "", ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in ("redis:", "delta:"):
            sink = stripped[:-1]
        elif stripped.startswith("top "):
            title = stripped
            tables[(sink, title)] = []
        elif stripped.startswith("│") and title:
            cells = [c.strip() for c in stripped.strip("│").split("│")]
            if len(cells) == 2 and cells[1].replace(",", "").isdigit():
                tables[(sink, title)].append((cells[0], int(cells[1].replace(",", ""))))
    return tables


def run_summary(text: str) -> dict[str, int]:
    """The figures of the demo's one ``run_done`` line (``committed_txids``, ``records``,
    ``failures``, and ``dropped_txids``/``dropped_records`` when some were dropped; its
    ``guarantee`` is ``run_guarantee``'s); an AssertionError when the line is missing or
    printed twice."""
    fields = _run_done(text)
    return {k: int(v) for k, v in fields.items() if k != "guarantee"}


def run_guarantee(text: str) -> str:
    """The guarantee the demo's ``run_done`` line names."""
    return _run_done(text)["guarantee"]


def _run_done(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line.startswith("run_done ")]
    assert len(lines) == 1, f"expected one run_done line, found {len(lines)}:\n{text[-2000:]}"
    return dict(item.split("=", 1) for item in lines[0].split()[1:])


def generated_tweets(directory: Path, count: int, seed: int) -> tuple[Path, Expected]:
    """``count`` tweets (5% bad records) in three partition files under ``directory``,
    made by the demo's generator, and the answers ``tests.reference`` computes from
    them (which must hold dead letters and user-hashtag pairs to check)."""
    from examples.tweets.cli import main as demo

    out = directory / "tweets"
    args = ["generate", "--count", str(count), "--seed", str(seed), "--partitions", "3"]
    assert demo([*args, "--bad-rate", "0.05", "--out", str(out)], out=io.StringIO()) == 0
    expected = expected_counts(out)
    assert expected.dead_letters and expected.pairs
    return out, expected
