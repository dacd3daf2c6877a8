"""The trial ZooKeeper of docs/getting-started.md, run as printed, as a user runs it: a
script that prints where its ZooKeeper answers and stops it on Enter. What it prints
is a real ZooKeeper (kazoo writes and reads a node there), and Enter leaves nothing
listening."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.docs import ROOT, example

pytestmark = pytest.mark.integration


def _line(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
        if ready:
            return proc.stdout.readline()
    raise AssertionError("the docs' ZooKeeper printed nothing within 90 s")


def test_the_docs_trial_zookeeper_answers_until_enter(tmp_path: Path) -> None:
    script = tmp_path / "zookeeper_trial.py"
    script.write_text(example("docs/getting-started.md", "ZooKeeperServer()").code)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = _line(proc, time.monotonic() + 90)
        assert line.startswith("ZooKeeper at 127.0.0.1:"), line
        hosts = line.split()[2].rstrip(":")
        assert line == f"ZooKeeper at {hosts}: run with --zookeeper {hosts}; Enter stops it\n"
        client = KazooClient(hosts=hosts, timeout=10)
        client.start(timeout=60)  # a server just started, beside CI's other lane
        try:
            client.create("/docs-trial", b"written")
            assert client.get("/docs-trial")[0] == b"written"
        finally:
            client.stop()
            client.close()
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    host, port = hosts.split(":")
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), 2):
        pass  # closed: nothing listens on its port any more
