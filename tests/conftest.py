"""Session-scoped real servers and one shared local SparkSession; each test gets its own
ZooKeeper chroot, Redis database keys prefix, Kafka topics and Delta directory."""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.jvm import driver_opts, made
from transactional.errors import ConfigurationError
from transactional.testing.servers import KafkaServer, RedisServer, ZooKeeperServer


def pytest_collection_finish(session: pytest.Session) -> None:
    """Resolve the jars the selected tests load before the first of them runs, where the
    line a first resolution prints (``transactional.jars``: a one-time download of a
    minute or two) shows: pytest keeps what a fixture or a test's child process prints
    until a test fails, and the suite would seem to hang in silence. Resolved already:
    nothing to do, nothing said. A failure is left to the fixture, which reports it."""
    if session.config.option.collectonly:
        return
    from committers.delta import delta_spark_conf
    from transactional.jars import resolved_jars
    from transactional.sources.kafka import kafka_spark_conf
    from transactional.testing.servers import KAFKA_BROKER

    names = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    # e2e and cluster tests run the demo and the CLI as processes, Delta their default sink.
    demos = any(item.get_closest_marker(m) for item in session.items for m in ("e2e", "cluster"))
    wanted: list[Callable[[], object]] = []
    if "spark" in names or demos:
        wanted.append(delta_spark_conf)
    if "spark" in names or "kafka" in names:
        wanted.append(kafka_spark_conf)
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
def spark():  # type: ignore[no-untyped-def]
    from tests.jvm import driver_conf
    from transactional.session import create_spark_session

    session = create_spark_session("local[2]", "tests", driver_conf())
    yield session
    session.stop()


@pytest.fixture(scope="session")
def transactional_spark(spark):  # type: ignore[no-untyped-def]
    """The plugin's session is this suite's one session (with Delta): Spark keeps one
    session configuration per process, so a second one would lose Delta's."""
    return spark
