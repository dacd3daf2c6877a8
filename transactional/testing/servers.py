"""Real ZooKeeper, Redis and Kafka servers as plain processes on free loopback ports
(several-server setups: ``transactional.testing.cluster_servers``)."""

from __future__ import annotations

import base64
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "KafkaServer",
    "RedisServer",
    "S3Server",
    "SparkConnectServer",
    "ZooKeeperServer",
    "free_port",
]

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
ZOOKEEPER_CONF = Path("/etc/zookeeper/conf")
#: A logging binding for ZooKeeper (Debian's ``libslf4j-java``, which ``zookeeper``
#: depends on): without one ZooKeeper says nothing, not even why it exited.
SLF4J_SIMPLE = Path("/usr/share/java/slf4j-simple.jar")


def free_port() -> int:
    """A loopback port free now, drawn at random below the kernel's ephemeral range: a
    port a stopped server frees is then never given to another process's connection or
    ``bind(0)`` while the server is down, and two test processes (pytest-xdist workers)
    seldom draw the same one (``_wait_port`` finds it if they do)."""
    low = _ephemeral_low()
    ports = range(max(1024, low - 12_000), low)
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.randrange(ports.start, ports.stop)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {ports.start}..{ports.stop - 1}")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    """Wait until ``proc`` (or a process of its session) listens on ``port``. A listener
    of another process does not count: a test would talk to another test's server."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
        except OSError:
            time.sleep(0.1)
            continue
        if _session_listens(proc.pid, port):
            return
        time.sleep(0.1)
    if not _session_listens(proc.pid, port) and _listening_sockets(port):
        raise RuntimeError(f"{what}: port {port} is held by another process")
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout}s")


def _listening_sockets(port: int) -> set[str]:
    """The inodes of the sockets listening on ``port`` (``/proc/net/tcp``, ``tcp6``)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            listening = fields[3] == "0A"  # TCP_LISTEN
            if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def session_processes(sid: int) -> Iterator[Path]:
    """The ``/proc`` entries of the processes of session ``sid`` (a server started in a
    session of its own, and what it started); one that exits meanwhile is skipped."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rpartition(")")[2].split()[3]) == sid:
                yield entry
        except (OSError, ValueError, IndexError):
            continue


def _session_listens(sid: int, port: int) -> bool:
    """Whether a process of session ``sid`` (a server started in a session of its own)
    holds a socket listening on ``port``."""
    inodes = _listening_sockets(port)
    for entry in session_processes(sid):
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return True
    return False


class _Server:
    """A server process on a free loopback port, in its own directory and session (so a
    SIGKILL takes all of it); ``stop`` and ``start`` again keep its data."""

    name = "server"
    start_timeout_s = 30.0

    def __init__(self, prefix: str) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.proc: subprocess.Popen[bytes] | None = None
        #: The process's environment (None: this process's).
        self.env: dict[str, str] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def log_path(self) -> Path:
        """The server's output, appended to across its starts."""
        return self.dir / f"{self.name}.log"

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept for its life
        self.proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self.env,
        )
        try:
            _wait_port(self.port, self.proc, self.start_timeout_s, self.name)
        except RuntimeError as e:
            self.stop()
            raise RuntimeError(f"{e}; the end of its log:\n{self.log_tail()}") from e

    def log_tail(self, lines: int = 40) -> str:
        path = self.log_path
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGKILL: the server loses what it had not written, as in a power cut."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class ZooKeeperServer(_Server):
    """A standalone ZooKeeper (Debian package ``zookeeper``); stop/start keep its data."""

    name = "zookeeper"
    start_timeout_s = 60.0

    def __init__(self, tick_ms: int = 500) -> None:
        if not ZOOKEEPER_JAR.exists():
            raise RuntimeError(
                "ZooKeeper is not installed: run `make deps` (apt-get install zookeeper)"
            )
        super().__init__("zk-")
        (self.dir / "data").mkdir()
        self.cfg = self.dir / "zoo.cfg"
        self.cfg.write_text(
            f"tickTime={tick_ms}\ndataDir={self.dir / 'data'}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\nmaxSessionTimeout=60000\n"
            "minSessionTimeout=1000\n4lw.commands.whitelist=*\n"
        )

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            "java",
            "-Xmx256m",
            "-Dzookeeper.log.dir=" + str(self.dir),
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=error",
            "-cp",
            f"{ZOOKEEPER_CONF}:{ZOOKEEPER_JAR}:{SLF4J_SIMPLE}",
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(self.cfg),
        ]


class RedisServer(_Server):
    """A ``redis-server`` on a free port; ``appendonly`` makes restarts keep the data."""

    name = "redis"

    def __init__(
        self, appendonly: bool = False, password: str | None = None, tls: bool = False
    ) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError(
                "Redis is not installed: run `make deps` (apt-get install redis-server)"
            )
        super().__init__("redis-")
        self.appendonly = appendonly
        #: Required of every client (AUTH) when set; given to the server in its config
        #: file, so that it shows in no process list.
        self.password = password
        #: TLS only (no plain port), with a certificate for 127.0.0.1 signed by a CA of
        #: its own (``ca.crt`` in its directory, named in ``url``).
        self.tls = tls
        if tls:
            _certificates(self.dir)

    @property
    def url(self) -> str:
        auth = "" if self.password is None else f"default:{self.password}@"
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.dir / 'ca.crt'}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        args = ["redis-server"]
        if self.password is not None:
            config = self.dir / "redis.conf"
            config.write_text(f'requirepass "{self.password}"\n')
            config.chmod(0o600)
            args.append(str(config))
        if self.tls:
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            args += ["--tls-cert-file", str(self.dir / "server.crt")]
            args += ["--tls-key-file", str(self.dir / "server.key")]
            args += ["--tls-ca-cert-file", str(self.dir / "ca.crt")]
        else:
            args += ["--port", str(self.port)]
        args += ["--bind", "127.0.0.1", "--save", "", "--dir", str(self.dir)]
        if self.appendonly:
            return [*args, "--appendonly", "yes", "--appendfsync", "always"]
        return [*args, "--appendonly", "no"]


def _certificates(directory: Path) -> None:
    """A CA (``ca.crt``) and a server certificate for 127.0.0.1 it signed
    (``server.crt``, ``server.key``), made with the ``openssl`` command."""
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is not installed: run `make deps` (apt-get install openssl)")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=transactional test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=127.0.0.1")  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "san.ext")  # fmt: skip


def _pyspark_home() -> Path:
    """The installed PySpark's directory, which holds Spark's launchers and jars."""
    import pyspark

    return Path(pyspark.__file__).parent


def _pyspark_jars(prefix: str) -> list[Path]:
    return sorted((_pyspark_home() / "jars").glob(f"{prefix}*.jar"))


#: The broker the tests and the demo run: KRaft only (no ZooKeeper), Java 17.
KAFKA_BROKER = "org.apache.kafka:kafka_2.13:4.1.1"


class KafkaServer(_Server):
    """A single-node Kafka broker in KRaft mode (broker and controller in one process),
    from the broker's jars resolved from Maven Central once (``transactional.spark.jars``);
    stop/start keep its log. Topics are not created on first use: tests create them."""

    name = "kafka"
    start_timeout_s = 90.0

    def __init__(
        self, ivy_dir: str | Path | None = None, advertised_port: int | None = None
    ) -> None:
        """``advertised_port``: the port the broker tells its clients to connect to (its
        own by default), e.g. a ``TcpProxy``'s in front of it, so that every connection a
        client makes after bootstrapping goes through the proxy too."""
        from transactional.spark.jars import resolved_jars

        # Spark's resolver leaves out the Scala library (Spark has its own): the broker
        # takes PySpark's, the same Scala 2.13.
        self.jars = [*resolved_jars([KAFKA_BROKER], ivy_dir), *_pyspark_jars("scala-library-")]
        super().__init__("kafka-")
        self.controller_port = free_port()
        self.config = self.dir / "server.properties"
        self.config.write_text(
            "process.roles=broker,controller\nnode.id=1\n"
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}\n"
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}\n"
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{advertised_port or self.port}\n"
            "controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n"
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
            f"log.dirs={self.dir / 'log'}\nauto.create.topics.enable=false\n"
            "offsets.topic.replication.factor=1\ntransaction.state.log.replication.factor=1\n"
            "transaction.state.log.min.isr=1\ngroup.initial.rebalance.delay.ms=0\n"
            # A write is on disk before it is acknowledged, so a SIGKILL loses nothing
            # acknowledged (a single node has no replica to recover it from).
            "log.flush.interval.messages=1\n"
        )
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        # One id in 64 starts with "-": given as a separate argument, the tool would take
        # it for an option and refuse to format.
        self._java(
            "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(self.config)
        )

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, main: str, *args: str) -> None:
        done = subprocess.run(
            [*self._jvm(), main, *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{main} {' '.join(args)} failed: {done.stdout}{done.stderr}")

    def _jvm(self) -> list[str]:
        return [
            "java",
            "-Xmx512m",
            f"-Dkafka.logs.dir={self.dir}",
            "-cp",
            ":".join(str(jar) for jar in self.jars),
        ]

    def command(self) -> list[str]:
        return [*self._jvm(), "kafka.Kafka", str(self.config)]


class S3Server(_Server):
    """An S3-compatible object store: moto's server (``moto[server]``, in the project's
    ``dev`` extras), in memory, so a restart starts it empty. Clients reach it only
    through the settings a user sets for real S3 (``settings``: endpoint, region,
    credentials and ``AWS_ALLOW_HTTP`` for a plain-HTTP endpoint), as environment
    variables; ``bucket`` makes a bucket.

    moto keeps S3's conditional writes (``If-None-Match: *`` answered 412 when the key
    exists), which delta-rs's commits rely on for their mutual exclusion."""

    name = "s3"
    start_timeout_s = 60.0
    region = "us-east-1"

    def __init__(self) -> None:
        super().__init__("s3-")

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def settings(self) -> dict[str, str]:
        """The standard AWS environment variables for this store (any key is accepted)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_ALLOW_HTTP": "true",
        }

    def command(self) -> list[str]:
        import sys

        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]

    def bucket(self, name: str | None = None) -> str:
        """A new, empty bucket (a fresh name by default); its name."""
        import urllib.request

        name = name or f"b-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(f"{self.endpoint_url}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as reply:
            if reply.status != 200:
                raise RuntimeError(f"moto refused the bucket {name}: HTTP {reply.status}")
        return name


class SparkConnectServer(_Server):
    """A Spark Connect server (the ``spark-connect`` jar PySpark ships) on a free
    loopback port, its own driver on ``master`` (``local[2]`` by default) with ``conf``
    (Delta's jars and settings, say: a Connect client cannot give the server jars).
    Spark is ``spark_home``'s (default: the installed PySpark's); its Python workers run
    ``python`` (default: this interpreter) with ``python_path`` on their path, so the
    clients' UDFs may import the project. Both may belong to another install than this
    process's: a client with PySpark's Connect client alone has no Spark to start.
    Its JVM's options are ``java_options`` (default: this process's
    ``SPARK_SUBMIT_OPTS``). On a local master its JVM has the collector of the
    framework's own local sessions (``transactional.spark.session.LOCAL_JAVA_OPTIONS``,
    added to any ``spark.driver.extraJavaOptions`` of ``conf``).
    Clients reach it at ``remote`` (``sc://127.0.0.1:<port>``). ``stop`` kills it;
    ``start`` again starts an empty server on the same port (a Connect server keeps no
    state across a restart)."""

    name = "spark-connect"
    start_timeout_s = 180.0

    def __init__(
        self,
        conf: dict[str, str] | None = None,
        master: str = "local[2]",
        python_path: str | None = None,
        spark_home: str | Path | None = None,
        python: str | None = None,
        java_options: str | None = None,
    ) -> None:
        super().__init__("spark-connect-")
        self.conf = dict(conf or {})
        self.master = master
        self.spark_home = Path(spark_home) if spark_home is not None else _pyspark_home()
        self.env = {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            "PYSPARK_PYTHON": python or sys.executable,
            "SPARK_LOG_DIR": str(self.dir),
            "SPARK_LOCAL_DIRS": str(self.dir / "local"),
            # Its temporary files (the artifact directories of its sessions, which a
            # killed server cannot remove) in its own directory, removed by ``close``.
            "SPARK_SUBMIT_OPTS": " ".join(
                o
                for o in (
                    os.environ.get("SPARK_SUBMIT_OPTS") if java_options is None else java_options,
                    f"-Djava.io.tmpdir={self.dir}",
                )
                if o
            ),
        }
        if python_path:
            self.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (python_path, os.environ.get("PYTHONPATH")) if p
            )
        self.env.pop("SPARK_REMOTE", None)
        self.env.pop("SPARK_CONNECT_MODE_ENABLED", None)

    @property
    def remote(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        from transactional.spark.session import LOCAL_JAVA_OPTIONS, is_local

        submit = self.spark_home / "bin" / "spark-submit"
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "4",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            **self.conf,
        }
        if is_local(self.master):  # the collector of a local session (LOCAL_JAVA_OPTIONS)
            given = settings.get("spark.driver.extraJavaOptions", "")
            settings["spark.driver.extraJavaOptions"] = f"{given} {LOCAL_JAVA_OPTIONS}".strip()
        conf = [arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]
        return [
            str(submit),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            self.master,
            *conf,
            "spark-internal",
        ]
