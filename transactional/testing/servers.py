"""Real ZooKeeper and Redis servers as plain processes on free loopback ports."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZOOKEEPER_CONF = Path("/etc/zookeeper/conf")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout}s")


class ZooKeeperServer:
    """A standalone ZooKeeper (Debian package ``zookeeper``); stop/start keep its data."""

    def __init__(self, tick_ms: int = 500) -> None:
        if not ZOOKEEPER_JAR.exists():
            raise RuntimeError(
                "ZooKeeper is not installed: run `make deps` (apt-get install zookeeper)"
            )
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="zk-"))
        (self.dir / "data").mkdir()
        self.cfg = self.dir / "zoo.cfg"
        self.cfg.write_text(
            f"tickTime={tick_ms}\ndataDir={self.dir / 'data'}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxSessionTimeout=60000\n"
            "minSessionTimeout=1000\n4lw.commands.whitelist=*\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        classpath = f"{ZOOKEEPER_CONF}:{ZOOKEEPER_JAR}"
        log = open(self.dir / "zookeeper.log", "ab")  # noqa: SIM115 - kept for the process's life
        self.proc = subprocess.Popen(
            [
                "java",
                "-Xmx256m",
                "-Dzookeeper.log.dir=" + str(self.dir),
                "-cp",
                classpath,
                "org.apache.zookeeper.server.ZooKeeperServerMain",
                str(self.cfg),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_port(self.port, self.proc, 60, "ZooKeeper")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisServer:
    """A ``redis-server`` on a free port; ``appendonly`` makes restarts keep the data."""

    def __init__(self, appendonly: bool = False) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError(
                "Redis is not installed: run `make deps` (apt-get install redis-server)"
            )
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="redis-"))
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(self.dir),
        ]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - kept for the process's life
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        _wait_port(self.port, self.proc, 30, "Redis")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
