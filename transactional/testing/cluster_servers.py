"""Several-server setups on loopback, for ``make cluster-test``: a ZooKeeper ensemble,
and a Spark standalone master and workers from the PySpark install."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from transactional.testing.servers import ZooKeeperServer, _Server, free_port


class QuorumMember(ZooKeeperServer):
    """One server of a ZooKeeper ensemble (``ZooKeeperEnsemble``): quorum config, its
    own data directory and ``myid``."""

    name = "zookeeper"

    def __init__(self, myid: int, peers: list[tuple[int, int, int]], tick_ms: int) -> None:
        super().__init__(tick_ms)
        self.myid = myid
        self.port = peers[myid - 1][0]
        (self.dir / "data" / "myid").write_text(f"{myid}\n")
        servers = "".join(
            f"server.{i}=127.0.0.1:{peer}:{election}\n"
            for i, (_, peer, election) in enumerate(peers, start=1)
        )
        self.cfg.write_text(
            f"tickTime={tick_ms}\ninitLimit=20\nsyncLimit=10\ndataDir={self.dir / 'data'}\n"
            f"clientPort={self.port}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
            "maxSessionTimeout=60000\nminSessionTimeout=1000\n4lw.commands.whitelist=*\n"
            f"quorumListenOnAllIPs=false\n{servers}"
        )

    def command(self) -> list[str]:
        return [
            *super().command()[:-2],
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.cfg),
        ]

    def mode(self) -> str | None:
        """``leader``, ``follower``, or None (not serving: no quorum, or down)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
                conn.sendall(b"srvr")
                reply = b""
                while chunk := conn.recv(4096):
                    reply += chunk
        except OSError:
            return None
        for line in reply.decode(errors="replace").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None


class ZooKeeperEnsemble:
    """``size`` ZooKeeper servers on loopback forming one ensemble (quorum config,
    separate data directories); each can be stopped (SIGKILL) and started again."""

    def __init__(self, size: int = 3, tick_ms: int = 500) -> None:
        peers = [(free_port(), free_port(), free_port()) for _ in range(size)]
        self.members = [QuorumMember(i, peers, tick_ms) for i in range(1, size + 1)]

    @property
    def hosts(self) -> str:
        return ",".join(m.hosts for m in self.members)

    def start(self, timeout: float = 60.0) -> None:
        for member in self.members:
            member.start()
        self.wait_serving(timeout)

    def wait_serving(self, timeout: float = 60.0) -> QuorumMember:
        """Wait until a quorum serves; its leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = [m for m in self.members if m.proc is not None and m.mode() == "leader"]
            if leaders:
                return leaders[0]
            time.sleep(0.2)
        tails = "\n".join(m.log_tail(10) for m in self.members)
        raise RuntimeError(f"the ensemble elected no leader within {timeout}s:\n{tails}")

    def close(self) -> None:
        for member in self.members:
            member.close()


def spark_home() -> Path:
    """The PySpark install, which ships Spark's launcher (``bin/spark-class``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def _spark_env(directory: Path) -> dict[str, str]:
    """A standalone daemon's environment: bound to loopback, its logs and work in its
    own directory."""
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(directory),
        "SPARK_WORKER_DIR": str(directory / "work"),
        "SPARK_NO_DAEMONIZE": "1",
    }


class SparkMaster(_Server):
    """A Spark standalone master on loopback (``spark://127.0.0.1:PORT``), from PySpark's
    own launcher."""

    name = "spark-master"
    start_timeout_s = 60.0

    def __init__(self) -> None:
        super().__init__("spark-master-")
        self.ui_port = free_port()

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--webui-port", str(self.ui_port),
        ]  # fmt: skip

    def start(self) -> None:
        self.env = _spark_env(self.dir)
        super().start()
        # The UI's port opens before its pages are served (404 until then).
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                self.workers_alive()
                return
            except OSError as exc:  # URLError and HTTPError are OSErrors
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the master's status page did not answer ({exc}); the end of its "
                        f"log:\n{self.log_tail()}"
                    ) from exc
                time.sleep(0.2)

    def workers_alive(self) -> int:
        """Workers the master counts as alive (its JSON status page)."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            status = json.load(r)
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")


class SparkWorker(_Server):
    """A Spark standalone worker on loopback, registered with ``master``; SIGKILLed by
    ``stop`` with its executors (one process group)."""

    name = "spark-worker"
    start_timeout_s = 60.0

    def __init__(self, master: SparkMaster, cores: int = 1, memory: str = "2g") -> None:
        super().__init__("spark-worker-")
        self.master = master
        self.cores = cores
        self.memory = memory
        self.ui_port = free_port()

    def command(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            self.master.url,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--webui-port", str(self.ui_port),
            "--cores", str(self.cores),
            "--memory", self.memory,
            "--work-dir", str(self.dir / "work"),
        ]  # fmt: skip

    def start(self) -> None:
        self.env = _spark_env(self.dir)
        alive = self.master.workers_alive()
        super().start()
        deadline = time.monotonic() + self.start_timeout_s
        while self.master.workers_alive() <= alive:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the worker did not register with {self.master.url}; the end of its "
                    f"log:\n{self.log_tail()}"
                )
            time.sleep(0.2)
