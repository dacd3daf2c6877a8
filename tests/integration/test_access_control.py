"""Access control against real servers: ZooKeeper digest ACLs on a topology's znodes
(another client, unauthenticated or with other credentials, can neither read nor change
``currtx`` or the metadata; a topology made before credentials were configured is
protected when they are), Redis AUTH (no password, a wrong one, the right one), and
Redis over TLS with AUTH, at the committer and through the demo end to end. No message
names a password."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl_credential

from committers import CounterTable, RedisCommitter
from committers.redis._batch import RedisBatch
from coordinators import ZooKeeperStateStore
from examples.tweets.cli import main as demo
from tests.conftest import REDIS_PASSWORD
from tests.history import judge, read_redis
from tests.processes import generated_tweets
from transactional.committer import CommitterContext
from transactional.errors import ConfigurationError
from transactional.testing.servers import RedisServer
from transactional.types import CommitOutcome, TransactionAttempt

pytestmark = pytest.mark.integration

SECRET = "s3cret-Pa55:with-colon"
CREDENTIALS = f"alice:{SECRET}"
ROOT = "/transactional/guarded"


@contextmanager
def client(hosts: str, credentials: str | None = None) -> Iterator[KazooClient]:
    """A started client, stopped and closed on the way out (a client left running keeps
    its connection thread pinging for the rest of the test session)."""
    auth = [] if credentials is None else [("digest", credentials)]
    zk = KazooClient(hosts=hosts, auth_data=auth)
    zk.start(timeout=15)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def led(hosts: str, credentials: str | None) -> ZooKeeperStateStore:
    """An open store of topology ``guarded`` that leads it, with txids 1 and 2 started
    and 1 committed."""
    store = ZooKeeperStateStore(hosts, credentials=credentials)
    store.open("guarded")
    store.acquire_leadership(timeout=10)
    store.start_transaction(1, {"from": 0}, {0: {"o": 1}})
    store.advance(1)
    store.start_transaction(2, {"from": 10}, {0: {"o": 2}})
    return store


def tree(zk: KazooClient, path: str) -> list[str]:
    return [path, *(n for c in zk.get_children(path) for n in tree(zk, f"{path}/{c}"))]


def assert_closed(hosts: str, credentials: str | None) -> None:
    """A client with ``credentials`` (None: none) can neither read nor change the
    topology: currtx, a txid's metadata, its partition metadata."""
    with client(hosts, credentials) as other:
        currtx = f"{ROOT}/coordinator/currtx"
        meta = f"{ROOT}/coordinator/meta/{2:020d}"
        for attempt in (
            lambda: other.set(currtx, b"1"),
            lambda: other.get(currtx),
            lambda: other.set(meta, b'{"from": 99}'),
            lambda: other.delete(meta),
            lambda: other.create(f"{ROOT}/coordinator/meta/{3:020d}", b"{}"),
            lambda: other.delete(f"{ROOT}/partition/0/{2:020d}"),
        ):
            with pytest.raises(NoAuthError):
                attempt()


def test_credentials_close_every_node_of_the_topology_to_other_clients(zk_hosts: str) -> None:
    store = led(zk_hosts, CREDENTIALS)
    try:
        assert_closed(zk_hosts, None)
        assert_closed(zk_hosts, f"alice:not-{SECRET}")
        assert_closed(zk_hosts, f"mallory:{SECRET}")
        # Every node carries exactly "alice may do anything" (the digest ZooKeeper
        # computes from the credentials: kazoo's own function, not the store's).
        digest = make_digest_acl_credential("alice", SECRET)
        with client(zk_hosts, CREDENTIALS) as owner:
            for path in tree(owner, ROOT):
                acls, _ = owner.get_acls(path)
                assert [(a.id.scheme, a.id.id, a.perms) for a in acls] == [("digest", digest, 31)]
        # The parent stays listable, and open to other topologies.
        with client(zk_hosts) as anyone:
            assert "guarded" in anyone.get_children("/transactional")
        # The store itself goes on as before.
        store.advance(2)
        assert store.read_state().currtx == 3
    finally:
        store.close()


@pytest.mark.parametrize("credentials", [None, f"alice:wrong-{SECRET}", f"bob:{SECRET}"])
def test_opening_a_protected_topology_without_its_credentials_is_refused(
    zk_hosts: str, credentials: str | None
) -> None:
    led(zk_hosts, CREDENTIALS).close()
    for read_only in (False, True):
        store = ZooKeeperStateStore(zk_hosts, credentials=credentials)
        with pytest.raises(ConfigurationError) as refused:
            store.open("guarded", read_only=read_only)
        message = str(refused.value)
        assert "are protected by a ZooKeeper ACL, and" in message
        assert "TRANSACTIONAL_ZOOKEEPER_AUTH=user:password" in message
        if credentials is not None:
            assert f"credentials given (user {credentials.split(':')[0]!r})" in message
        assert SECRET not in message and "wrong" not in message
    # Nothing changed: the owner finds the same state.
    owner = ZooKeeperStateStore(zk_hosts, credentials=CREDENTIALS)
    owner.open("guarded", read_only=True)
    try:
        assert owner.read_state().currtx == 2
    finally:
        owner.close()


def test_credentials_protect_a_topology_made_without_them(zk_hosts: str) -> None:
    led(zk_hosts, None).close()
    with client(zk_hosts) as anyone:
        assert anyone.get(f"{ROOT}/coordinator/currtx")[0] == b"2"  # open to everyone so far
    store = ZooKeeperStateStore(zk_hosts, credentials=CREDENTIALS)
    store.open("guarded")
    try:
        assert_closed(zk_hosts, None)
        store.acquire_leadership(timeout=10)
        assert store.read_state().metas == {1: {"from": 0}, 2: {"from": 10}}
    finally:
        store.close()


@pytest.mark.parametrize("given", ["alice", "alice:", ":pw", ""])
def test_credentials_without_a_user_or_a_password_are_refused_at_once(given: str) -> None:
    with pytest.raises(ConfigurationError, match="must be 'user:password'"):
        ZooKeeperStateStore("127.0.0.1:1", credentials=given)


def test_the_store_shows_no_password() -> None:
    store = ZooKeeperStateStore("127.0.0.1:1", credentials=CREDENTIALS)
    assert SECRET not in repr(store._credentials) and SECRET not in repr(vars(store))


# -- Redis AUTH ---------------------------------------------------------------------


def url(server: RedisServer, password: str | None) -> str:
    credentials = "" if password is None else f"default:{password}@"
    return f"redis://{credentials}127.0.0.1:{server.port}/0"


TABLE = CounterTable("words", ("word",))


def opened(target: str) -> RedisCommitter:
    sink = RedisCommitter(target, {"in": TABLE}, socket_timeout=5)
    sink.open(CommitterContext(None, "guarded", "sink", fence_token=1))
    return sink


@pytest.mark.parametrize("password", [None, f"not-{REDIS_PASSWORD}"], ids=["none", "wrong"])
def test_redis_without_the_password_is_refused_at_open_and_names_no_password(
    guarded_redis: RedisServer, password: str | None
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        opened(url(guarded_redis, password))
    message = str(refused.value)
    assert f"127.0.0.1:{guarded_redis.port}" in message and "password" in message
    assert REDIS_PASSWORD not in message
    if password is not None:
        assert "default:***@" in message  # the URL shown, its password masked


def test_redis_with_the_password_commits_and_reads(guarded_redis: RedisServer) -> None:
    sink = opened(url(guarded_redis, REDIS_PASSWORD))
    try:
        batch = RedisBatch.of(1, {"words": {"a": 2, "b": 1}})
        assert sink.commit(TransactionAttempt(1, 1), batch) is CommitOutcome.APPLIED
    finally:
        sink.close()
    direct: Any = redis.Redis(
        port=guarded_redis.port, password=REDIS_PASSWORD, decode_responses=True
    )
    assert direct.hgetall("words") == {"a": "2", "b": "1"}
    reader = RedisCommitter(url(guarded_redis, REDIS_PASSWORD), {"in": TABLE})
    assert reader.read("words") == {("a",): 2, ("b",): 1}
    direct.close()


def test_redis_over_tls_with_a_rediss_url() -> None:
    """TLS only (the server has no plain port), its CA given in the URL's query; the
    password travels inside TLS."""
    server = RedisServer(password=SECRET, tls=True)
    server.start()
    try:
        assert server.url.startswith("rediss://default:")
        sink = opened(server.url)
        try:
            batch = RedisBatch.of(1, {"words": {"tls": 3}})
            assert sink.commit(TransactionAttempt(1, 1), batch) is CommitOutcome.APPLIED
        finally:
            sink.close()
        assert RedisCommitter(server.url, {"in": TABLE}).read("words") == {("tls",): 3}
        # A plain client is refused by the TLS port, with nothing written.
        plain = server.url.replace("rediss://", "redis://").split("?")[0]
        with pytest.raises(ConfigurationError) as refused:
            opened(plain)
        assert SECRET not in str(refused.value)
    finally:
        server.close()


def test_the_demo_loads_runs_and_shows_exactly_over_tls_with_a_password(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """End to end through one ``rediss://`` URL with AUTH, to a server with no plain
    port: the demo loads its tweets into Redis queues, reads them in Spark tasks, counts
    them into Redis and shows them. Judged record by record with redis-py over TLS."""
    path, expected = generated_tweets(tmp_path / "input", count=200, seed=21)
    server = RedisServer(password=SECRET, tls=True)
    server.start()
    out = io.StringIO()
    try:
        assert demo(["load", "--input", str(path), "--redis-url", server.url], out=out) == 0
        sink = ["--sink", "redis", "--redis-url", server.url, "--state-dir", str(tmp_path / "s")]
        run = ["run", "--source", "redis", "--spout", "partitioned", *sink, "--batch-size", "25"]
        with caplog.at_level("DEBUG"):
            code = demo([*run, "--until-drained", "--record-ids", "--top", "0"], out=out)
        assert code == 0, out.getvalue()
        assert demo(["show", *sink, "--top", "3"], out=out) == 0, out.getvalue()
        verdict = judge(read_redis(server.url, inputs="tweets:*"), expected)
        assert verdict.exact, str(verdict)
        top, count = expected.hashtags.most_common(1)[0]
        assert re.search(rf"{re.escape(top)}\s+│\s+{count} ", out.getvalue()), out.getvalue()
        assert SECRET not in out.getvalue() + caplog.text
    finally:
        server.close()
