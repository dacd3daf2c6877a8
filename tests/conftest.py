"""Session-scoped real servers and one shared local SparkSession; each test gets its own
ZooKeeper chroot, Redis database keys prefix, Kafka topics and Delta directory."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests import rotation
from tests.jvm import driver_opts, executors_python, made
from transactional.errors import ConfigurationError
from transactional.testing.servers import (
    KafkaServer,
    RedisServer,
    S3Server,
    SparkConnectServer,
    ZooKeeperServer,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--connect",
        action="store_true",
        help="run the tests marked connect on a Spark Connect session (a server the "
        "suite starts, with Delta's, Kafka's and the s3a jars); the others are deselected. "
        "A process is in Connect mode or classic mode, never both: PySpark's functions "
        "build Connect columns once a Connect session exists.",
    )
    parser.addoption(
        "--rotation",
        default="all",
        help="which part of the rotated cases to run (tests/rotation.py): a seed, auto "
        "(the number in .ci/seed: what the make targets and CI give) or all (the default)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[rotation.KEY] = rotation.parse(config.getoption("rotation"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The rotation's seed, last in the output (``-q`` shows no header), when not all."""
    chosen = rotation.of(terminalreporter.config)
    if chosen.seed is not None:
        config = terminalreporter.config
        marks = config.getoption("markexpr", "")
        from transactional.spark.connect import client_only

        if config.getoption("connect") and client_only():
            target = "make connect-client-test"
        elif config.getoption("connect"):
            target = "make connect-test"
        elif marks.startswith("slow"):
            target = "make test-slow"
        elif marks == "cluster":
            target = "make cluster-test"
        else:
            target = "make test"
        terminalreporter.write_line(chosen.describe(target))


@pytest.hookimpl(trylast=True)  # after -m and -k: the halves are of what would run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Which of the collected tests run. With ``--connect``, the tests marked ``connect``
    and not ``classic``, and of those none that uses the S3 stand-in: its settings reach
    a classic session per bucket (``s3_bucket``), a Connect server only when it starts.
    Without it, all but those that need a Connect session (``connect_only``). The tests
    marked ``client_only`` run only in an install with PySpark's Connect client alone
    (``make connect-client-test``). In a
    rotated run (``--rotation``: ``tests/rotation.py``), a fifth of the occasional cases
    (``exhaustive``, and ``connect_full`` on Connect), and half of the variations of
    each other Connect test, or of each test marked ``rotated``."""
    from transactional.spark.connect import client_only

    connect = config.getoption("connect")
    alone = client_only()

    def on_connect(item: pytest.Item) -> bool:
        return (
            item.get_closest_marker("connect") is not None
            and item.get_closest_marker("classic") is None
            and "s3_bucket" not in getattr(item, "fixturenames", ())
        )

    def runs(item: pytest.Item) -> bool:
        if item.get_closest_marker("client_only") is not None and not alone:
            return False
        return on_connect(item) if connect else item.get_closest_marker("connect_only") is None

    kept = [item for item in items if runs(item)]
    chosen = rotation.of(config)
    if chosen.seed is not None:

        def rare(item: pytest.Item) -> bool:
            return item.get_closest_marker("exhaustive") is not None or (
                connect and item.get_closest_marker("connect_full") is not None
            )

        out = {id(item) for item in rotation.occasional([i for i in kept if rare(i)], chosen)[1]}
        rest = [item for item in kept if not rare(item)]
        halved = rest if connect else [item for item in rest if item.get_closest_marker("rotated")]
        out |= {id(item) for item in rotation.variations(halved, chosen)[1]}
        kept = [item for item in kept if id(item) not in out]
    if len(kept) < len(items):
        left = {id(item) for item in kept}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in left])
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    """Resolve the jars the selected tests load before the first of them runs, where the
    line a first resolution prints (``transactional.spark.jars``: a one-time download of a
    minute or two) shows: pytest keeps what a fixture or a test's child process prints
    until a test fails, and the suite would seem to hang in silence. Resolved already:
    nothing to do, nothing said. A failure is left to the fixture, which reports it."""
    if session.config.option.collectonly:
        return
    from committers.delta import delta_spark_conf
    from transactional.sources.kafka import kafka_spark_conf
    from transactional.spark.jars import resolved_jars
    from transactional.spark.storage import s3_spark_conf
    from transactional.testing.servers import KAFKA_BROKER

    names = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    # e2e and cluster tests run the demo and the CLI as processes, Delta their default sink.
    demos = any(item.get_closest_marker(m) for item in session.items for m in ("e2e", "cluster"))
    wanted: list[Callable[[], object]] = []
    if "spark" in names or demos:
        wanted.append(delta_spark_conf)
    if "spark" in names or "kafka" in names:
        wanted.append(kafka_spark_conf)
    if "spark" in names:
        wanted.append(lambda: s3_spark_conf({}))
    if "kafka" in names:
        wanted.append(lambda: resolved_jars([KAFKA_BROKER]))
    capture = session.config.pluginmanager.getplugin("capturemanager")
    for resolve in wanted:
        with (
            capture.global_and_fixture_disabled() if capture else contextlib.nullcontext(),
            contextlib.suppress(ConfigurationError),
        ):
            resolve()
    if ("spark" in names or demos) and "SPARK_SUBMIT_OPTS" not in os.environ:
        # Every driver the tests start, this process's and its children's, maps the
        # classes it loads from one archive (tests.jvm), made here the first time.
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            if not made():
                print("\ntests.jvm: making the Spark driver's class archive (once, ~1 min)")
            os.environ["SPARK_SUBMIT_OPTS"] = driver_opts(quick=False)


@pytest.fixture(scope="session", autouse=True)
def _spark_scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The Spark scratch space (``SPARK_LOCAL_DIRS``) of this process's session and of
    every driver the tests start, under the run's temporary directory and removed at its
    end: a SIGKILLed driver leaves its own (its executors' copies of the jars: 14 MB for
    the demo), and a suite kills hundreds (``DemoProcess`` removes each of its runs'
    sooner)."""
    if "SPARK_LOCAL_DIRS" in os.environ:  # the user's choice
        yield
        return
    scratch = tmp_path_factory.mktemp("spark-scratch")
    os.environ["SPARK_LOCAL_DIRS"] = str(scratch)
    try:
        yield
    finally:
        del os.environ["SPARK_LOCAL_DIRS"]
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(autouse=True)
def _command_logging_undone() -> Iterator[None]:
    """A command run in-process (``main([...])``) points the root logger at the test's
    captured stderr, which is closed once the test ends, and lets py4j log at info: undo
    both after the test, or a library logging later (py4j closing a connection when it
    is collected) writes a "Logging error" to a closed file."""
    from transactional.cli.logs import LIBRARY_LOGGERS

    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler]:
        root.removeHandler(handler)  # configure_logging's (pytest's are subclasses)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def zk_hosts(zookeeper_server: ZooKeeperServer) -> str:
    """A connection string with a fresh chroot, so tests never see each other's znodes."""
    from kazoo.client import KazooClient

    chroot = f"/test-{uuid.uuid4().hex[:12]}"
    client = KazooClient(hosts=zookeeper_server.hosts)
    client.start(timeout=30)
    client.ensure_path(chroot)
    client.stop()
    client.close()
    return zookeeper_server.hosts + chroot


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    server.start()
    yield server
    server.close()


@pytest.fixture
def s3_bucket(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> str:
    """A new bucket of the test's own in the S3 stand-in, reached as a user reaches S3:
    this process through the standard AWS environment variables (delta-rs, pyarrow), and
    the suite's Spark session, whose JVM started before the store, through the s3a
    connector's settings for that one bucket (``fs.s3a.bucket.<name>.*``) and, for its
    Python tasks (the file source's readers), the same variables in the environment
    PySpark gives its workers (``SparkContext.environment``)."""
    bucket = s3_server.bucket()
    for name, value in s3_server.settings.items():
        monkeypatch.setenv(name, value)
    if "spark" in request.fixturenames:
        spark = request.getfixturevalue("spark")
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        per_bucket = {
            "endpoint": s3_server.endpoint_url,
            "endpoint.region": s3_server.region,
            "path.style.access": "true",
            "connection.ssl.enabled": "false",
            "access.key": s3_server.settings["AWS_ACCESS_KEY_ID"],
            "secret.key": s3_server.settings["AWS_SECRET_ACCESS_KEY"],
        }
        for key, value in per_bucket.items():
            hadoop.set(f"fs.s3a.bucket.{bucket}.{key}", value)
        for name, value in s3_server.settings.items():
            monkeypatch.setitem(spark.sparkContext.environment, name, value)
    return bucket


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.close()


#: The password of ``guarded_redis`` (tests search outputs for it).
REDIS_PASSWORD = "redis-Pw-7f3a9c"


@pytest.fixture(scope="session")
def guarded_redis() -> Iterator[RedisServer]:
    """A Redis that requires ``REDIS_PASSWORD`` of every client."""
    server = RedisServer(password=REDIS_PASSWORD)
    server.start()
    yield server
    server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The server's URL, with its database flushed before the test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.close()
    yield redis_server.url


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaServer]:
    """One KRaft broker for the session; each test creates its own topics. A test that
    stops it starts it again before it ends."""
    server = KafkaServer()
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """The suite's session: classic on ``local[2]``, or with ``--connect`` a Spark Connect
    session on ``spark_connect`` (its own server, on ``local[2]``)."""
    from tests.jvm import driver_conf
    from transactional.spark.session import create_spark_session

    os.environ["PYSPARK_PYTHON"] = executors_python(os.environ)  # tests/jvm.py
    if request.config.getoption("connect"):
        server = request.getfixturevalue("spark_connect")
        session = create_spark_session(app_name="tests", remote=server.remote)
    else:
        session = create_spark_session("local[2]", "tests", driver_conf())
    yield session
    session.stop()


#: With PySpark's Connect client alone installed (``make connect-client-test``): the
#: Python of another install, one with PySpark's JVM, that runs the suite's server.
SERVER_PYTHON = "TRANSACTIONAL_TEST_SERVER_PYTHON"


@pytest.fixture(scope="session")
def spark_connect() -> Iterator[SparkConnectServer]:
    """A Spark Connect server on ``local[2]`` with the suite's jars and Delta's settings;
    its Python workers import this checkout; its UI's REST API answers on
    ``spark.ui.port`` (``tests.witness.server_persisted``). From a Connect-only install,
    the server is ``$TRANSACTIONAL_TEST_SERVER_PYTHON``'s install's: its Spark, its
    jars (as its own ``driver_conf`` names them) and its Python workers."""
    from tests.jvm import driver_conf
    from transactional.spark.connect import client_only
    from transactional.testing.servers import free_port

    ui = {"spark.ui.enabled": "true", "spark.ui.port": str(free_port())}  # its REST API
    if client_only():
        python = os.environ.get(SERVER_PYTHON)
        if not python:
            raise pytest.UsageError(
                f"this install has only PySpark's Connect client: set {SERVER_PYTHON} to "
                "the Python of an install with PySpark's JVM, which runs the server"
            )
        conf, home = _server_install(python)
        server = SparkConnectServer(
            conf={**conf, **ui}, python_path=ROOT, spark_home=home, python=python
        )
    else:
        server = SparkConnectServer(conf={**driver_conf(), **ui}, python_path=ROOT)
    server.start()
    yield server
    server.close()


def _server_install(python: str) -> tuple[dict[str, str], str]:
    """The suite's server settings and Spark home as the install of ``python`` has them."""
    script = (
        "import json, pathlib, pyspark\n"
        "from tests.jvm import driver_conf\n"
        "print(json.dumps([driver_conf(), str(pathlib.Path(pyspark.__file__).parent)]))\n"
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise pytest.UsageError(f"{SERVER_PYTHON}={python}: {done.stderr.strip()[-2000:]}")
    conf, home = json.loads(done.stdout.strip().splitlines()[-1])
    return conf, home


@pytest.fixture(scope="session")
def transactional_spark(spark):  # type: ignore[no-untyped-def]
    """The plugin's session is this suite's one session (with Delta): Spark keeps one
    session configuration per process, so a second one would lose Delta's."""
    return spark
