"""The Redis Streams source's consumer-group mode through ``transactional run``, the
process SIGKILLed (driver, JVM and Python workers) between txid 2's commit and its
``XACK`` (``--crash-at after_advance:2``), then run again until drained: no entry lost,
none counted twice, and every entry acknowledged in the end. Observed with redis-py
(``XPENDING``, ``XINFO GROUPS``, ``XINFO CONSUMERS``, the sink's hash) against the ids
this test's ``XADD`` returned."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.jvm import short_lived
from tests.processes import ROOT, store_state

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-slow: a kill and a rerun

STREAMS = ("k:a", "k:b")
BATCH = 4
GROUP = "counters"
TOPOLOGY = "streams-kill"


def run(args: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transactional.cli", "run", "tests.e2e.streams_group:build", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_runner_killed_between_commit_and_ack_loses_nothing_and_counts_nothing_twice(
    redis_url: str, tmp_path: Path
) -> None:
    client: Any = redis.Redis.from_url(redis_url, decode_responses=True)
    ids = {
        s: [client.xadd(s, {"kind": "x"}) for _ in range(n)]
        for s, n in zip(STREAMS, (10, 6), strict=True)
    }
    environ = {
        **short_lived({k: v for k, v in os.environ.items() if not k.startswith("TRANSACTIONAL_")}),
        "STREAMS_REDIS_URL": redis_url,
        "STREAMS_KEYS": ",".join(STREAMS),
        "STREAMS_BATCH": str(BATCH),
        "STREAMS_GROUP": GROUP,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    args = [
        "--topology-id",
        TOPOLOGY,
        "--state-dir",
        str(tmp_path / "state"),
        "--master",
        "local[2]",
        "--max-pending",
        "1",
        "--until-drained",
    ]

    def pending() -> dict[str, list[tuple[str, str]]]:
        return {
            s: [
                (r["message_id"], r["consumer"])
                for r in client.xpending_range(s, GROUP, "-", "+", 100)
            ]
            for s in STREAMS
        }

    killed = run([*args, "--crash-at", "after_advance:2"], environ)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert "crash_at point=after_advance txid=2" in killed.stderr
    assert store_state(tmp_path / "state", TOPOLOGY)[0] == 3  # txid 2 committed
    assert {k: int(v) for k, v in client.hgetall("seen").items()} == {
        f"{s} {e}": 1 for s in STREAMS for e in ids[s][: 2 * BATCH]
    }
    # Txid 1 was acknowledged; txid 2's entries are pending with the killed runner.
    (dead,) = {c for rows in pending().values() for _, c in rows}
    assert dead.startswith(f"{TOPOLOGY}:")
    assert pending() == {s: [(e, dead) for e in ids[s][BATCH : 2 * BATCH]] for s in STREAMS}

    done = run(args, environ)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {k: int(v) for k, v in client.hgetall("seen").items()} == {
        f"{s} {e}": 1 for s in STREAMS for e in ids[s]
    }
    assert pending() == {s: [] for s in STREAMS}
    for s in STREAMS:
        (info,) = client.xinfo_groups(s)
        assert (info["pending"], info["last-delivered-id"], info["entries-read"]) == (
            0,
            ids[s][-1],
            len(ids[s]),
        )
        assert client.xinfo_consumers(s, GROUP) == []  # the dead one claimed and removed
    client.close()
