"""Several-server setups on loopback, for ``make cluster-test``: a ZooKeeper ensemble,
a Redis Cluster, and a Spark standalone master and workers from the PySpark install."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

from transactional.testing.servers import RedisServer, ZooKeeperServer, _Server, free_port


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
        self.size = size
        self.tick_ms = tick_ms
        self.members = self._draw()

    def _draw(self) -> list[QuorumMember]:
        """Members on ports drawn afresh (three each: client, quorum, election)."""
        ports: set[int] = set()
        while len(ports) < 3 * self.size:
            ports.add(free_port())
        drawn = iter(ports)
        peers = [(next(drawn), next(drawn), next(drawn)) for _ in range(self.size)]
        return [QuorumMember(i, peers, self.tick_ms) for i in range(1, self.size + 1)]

    @property
    def hosts(self) -> str:
        return ",".join(m.hosts for m in self.members)

    def start(self, timeout: float = 60.0, attempts: int = 3) -> None:
        """Start every member and wait for a leader. A port free when it was drawn may
        be taken before its member binds it (by another test process drawing ports):
        the ensemble, never started yet, is then drawn again on other ports."""
        for attempt in range(1, attempts + 1):
            try:
                for member in self.members:
                    member.start()
            except RuntimeError as e:
                if "BindException" not in str(e) or attempt == attempts:
                    raise
                self.close()
                self.members = self._draw()
                continue
            break
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


class ClusterNode(RedisServer):
    """One ``redis-server`` of a ``RedisCluster``: cluster mode, its own node file, and
    every write fsynced to its append-only file before the reply (``appendfsync
    always``), so a node restarted after SIGKILL keeps what it acknowledged."""

    def __init__(self, node_timeout_ms: int) -> None:
        super().__init__(appendonly=True)
        self.node_timeout_ms = node_timeout_ms
        #: The cluster bus (by default the port + 10000, which a free port may not allow).
        self.bus_port = free_port()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.dir / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-port", str(self.bus_port),
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip

    def reply(self, *command: str) -> str:
        """The reply of ``command`` as ``redis-cli`` prints it ("": no answer)."""
        try:
            return subprocess.run(
                ["redis-cli", "-p", str(self.port), *command],
                capture_output=True, text=True, timeout=5, check=True,
            ).stdout  # fmt: skip
        except (subprocess.SubprocessError, OSError):
            return ""

    def info(self, *command: str) -> dict[str, str]:
        """The reply of ``INFO`` or ``CLUSTER INFO`` (``command``) as a dict ({}: the
        node does not answer)."""
        pairs = (line.split(":", 1) for line in self.reply(*command).splitlines() if ":" in line)
        return {key: value.strip() for key, value in pairs}


class RedisCluster:
    """A Redis Cluster on loopback: ``masters`` masters with ``replicas`` replicas each,
    created with ``redis-cli --cluster create``. A master stopped with SIGKILL is
    replaced by its replica after ``node_timeout_ms`` (the cluster's failover); started
    again, it rejoins as a replica."""

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 2000) -> None:
        self.replicas = replicas
        self.nodes = [ClusterNode(node_timeout_ms) for _ in range(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        """A URL of one node; a cluster client learns the rest from it."""
        return self.nodes[0].url

    def start(self, timeout: float = 60.0) -> None:
        for node in self.nodes:
            node.start()
        create = ["redis-cli", "--cluster", "create", *(n.address for n in self.nodes)]
        create += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        self.wait_ok(timeout)

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Wait until every running node sees the cluster whole (every slot served) and
        every running replica is in sync with its master (a replica that never synced
        cannot take over)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = [n for n in self.nodes if n.proc is not None]
            infos = [n.info("cluster", "info") for n in running]
            roles = [n.info("info", "replication") for n in running]
            if (
                all(i.get("cluster_state") == "ok" for i in infos)
                and all(i.get("cluster_slots_ok") == "16384" for i in infos)
                and all(r.get("master_link_status", "up") == "up" for r in roles)
            ):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Redis Cluster was not whole within {timeout}s")

    def master_of(self, key: str) -> ClusterNode:
        """The node that is the master of ``key``'s slot now: of the running nodes that
        say of themselves (``CLUSTER NODES``, their ``myself`` line) that they are a
        master serving the slot, the one with the newest config epoch. Right after a
        failover the promoted replica says so at once, while the other nodes' slot maps
        may still name the old master."""
        running = [n for n in self.nodes if n.proc is not None]
        slot = int(running[0].reply("CLUSTER", "KEYSLOT", key))
        claims: list[tuple[int, ClusterNode]] = []
        for node in running:
            # id address flags master ping pong epoch link slot...
            lines = [line.split() for line in node.reply("CLUSTER", "NODES").splitlines()]
            fields = next((f for f in lines if len(f) > 7 and "myself" in f[2].split(",")), None)
            if fields is None or "master" not in fields[2].split(","):
                continue
            for served in fields[8:]:
                low, _, high = served.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    claims.append((int(fields[6]), node))
        if not claims:
            raise RuntimeError(f"no running node says it is the master of slot {slot} ({key!r})")
        return max(claims, key=lambda claim: claim[0])[1]

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def spark_home() -> Path:
    """The PySpark install, which ships Spark's launcher (``bin/spark-class``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def _spark_env(directory: Path) -> dict[str, str]:
    """A standalone daemon's environment: bound to loopback, its logs, work and scratch
    (a worker's executors' shuffle and block files) in its own directory, which
    ``close`` removes even after a SIGKILL."""
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(directory),
        "SPARK_WORKER_DIR": str(directory / "work"),
        "SPARK_LOCAL_DIRS": str(directory / "local"),
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
        #: Starts so far (each leaves a line in the log naming its UI's port).
        self._starts = 0

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
        self._starts += 1
        super().start()
        # The UI's port opens before its pages are served (404, or an empty page, until
        # then).
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                self._read_ui_port()
                self.alive_workers()
                return
            except (OSError, ValueError) as exc:  # URLError, HTTPError; JSON not yet there
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the master's status page did not answer ({exc}); the end of its "
                        f"log:\n{self.log_tail()}"
                    ) from exc
                time.sleep(0.2)

    def _read_ui_port(self) -> None:
        """The port the UI bound, from the master's log: when the one asked for was taken
        meanwhile, Spark binds the next one (and the one asked for answers another
        process's requests; a CI run of 2026-12-05 polled it for a minute)."""
        path = self.log_path
        text = path.read_text(errors="replace") if path.exists() else ""
        # The log is appended to across restarts: the last start's line counts.
        bound = re.findall(r"started service 'MasterUI' on port (\d+)", text)
        if len(bound) < self._starts:
            raise ValueError("the master's UI has not started yet")
        self.ui_port = int(bound[-1])

    def alive_workers(self) -> set[tuple[str, int]]:
        """The ``(host, port)`` of each worker the master counts as alive."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            status = json.load(r)
        return {
            (w["host"], int(w["port"]))
            for w in status.get("workers", [])
            if w.get("state") == "ALIVE"
        }


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
        super().start()
        # Wait for this worker by its address, not for one more worker alive: a worker
        # SIGKILLed just before may still count as alive, or stop counting meanwhile.
        deadline = time.monotonic() + self.start_timeout_s
        while ("127.0.0.1", self.port) not in self.master.alive_workers():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the worker did not register with {self.master.url}; the end of its "
                    f"log:\n{self.log_tail()}"
                )
            time.sleep(0.2)
