"""The Redis commit script (``committers/redis/_commit.lua``) against a Python model, on a
real Redis, without Spark: batches of up to 1,300 fields (the script reads and writes
fields in chunks of 500; a staged commit's fields come in JSON chunks), LONG values near
every bound the script's arithmetic changes method at (2^52, 2^53, 2^63), opaque
replays with other records, and groups whose total passes 64 bits."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import committers.redis._send
from committers import CounterTable, RedisCommitter
from committers.redis._batch import RedisBatch
from transactional.committer import CommitterContext
from transactional.errors import ContractError, FencedError
from transactional.types import CommitMode, CommitOutcome, TransactionAttempt

TABLE = CounterTable("h", ("k",))
TOP, BOTTOM = 2**63 - 1, -(2**63)
EDGES = [2**52 - 1, 2**52, 2**52 + 1, 2**53 - 1, 2**53, 2**53 + 1, 2**62, TOP - 1, TOP]
EDGES += [-e for e in EDGES] + [BOTTOM, BOTTOM + 1]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    yield conn
    conn.close()


def opened(url: str, mode: CommitMode) -> RedisCommitter:
    sink = RedisCommitter(url, {"in": TABLE}, mode=mode, namespace="ns")
    sink.open(CommitterContext(None, "t", "sink", fence_token=1))
    return sink


def increments(rng: random.Random) -> dict[str, int]:
    """Up to 1,300 fields of a pool of 2,000: mostly small increments, some at the
    bounds, so that stored values reach them too."""
    fields = rng.sample(range(2000), rng.choice([0, 1, 499, 500, 501, rng.randrange(1, 1300)]))
    out = {}
    for f in fields:
        if rng.random() < 0.1:
            out[f"f{f}"] = rng.choice(EDGES)
        else:
            out[f"f{f}"] = rng.randrange(-1000, 1000)
    return out


def applied(model: dict[str, int], batch: dict[str, int]) -> dict[str, int] | None:
    """``model`` with ``batch`` added; None if any new value leaves 64 bits."""
    out = dict(model)
    for f, inc in batch.items():
        out[f] = out.get(f, 0) + inc
        if not BOTTOM <= out[f] <= TOP:
            return None
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mode=st.sampled_from(list(CommitMode)), seed=st.integers(0, 2**32), staged=st.booleans())
def test_commits_and_replays_match_a_python_model(
    redis_url: str, client: redis.Redis, mode: CommitMode, seed: int, staged: bool
) -> None:
    client.flushdb()
    rng = random.Random(seed)
    chunk = committers.redis._send.STAGE_CHUNK
    committers.redis._send.STAGE_CHUNK = 150 if staged else chunk  # staged above 300 fields
    sink = opened(redis_url, mode)
    try:
        model: dict[str, int] = {}
        before: dict[str, int] = {}  # the model before the last committed txid
        txid = 0
        for _ in range(rng.randrange(2, 6)):
            replay = mode is CommitMode.OPAQUE and txid > 0 and rng.random() < 0.4
            if not replay:
                txid += 1
            base = before if replay else model
            batch = increments(rng)
            want = applied(base, batch)
            attempt = TransactionAttempt(txid, rng.randrange(1, 9))
            if want is None:
                with pytest.raises(ContractError, match="beyond long"):
                    sink.commit(attempt, RedisBatch.of(txid, {"h": batch}))
                if not replay:
                    txid -= 1
            else:
                outcome = sink.commit(attempt, RedisBatch.of(txid, {"h": batch}))
                assert outcome is (CommitOutcome.REAPPLIED if replay else CommitOutcome.APPLIED)
                before, model = base, want
            # Exactly the model, as the plain digits HINCRBY writes; nothing staged left.
            assert client.hgetall("h") == {f: str(v) for f, v in model.items()}
            assert not client.keys("ns:stage:*")
    finally:
        committers.redis._send.STAGE_CHUNK = chunk
        sink.close()


def test_a_group_total_past_64_bits_is_stored_when_the_new_value_fits(
    redis_url: str, client: redis.Redis
) -> None:
    for mode in CommitMode:
        client.flushdb()
        sink = opened(redis_url, mode)
        assert sink.commit(TransactionAttempt(1, 1), RedisBatch.of(1, {"h": {"a": BOTTOM}}))
        parts = [RedisBatch.of(2, {"h": {"a": TOP}}), RedisBatch.of(3, {"h": {"a": 2**62}})]
        attempts = [TransactionAttempt(2, 1), TransactionAttempt(3, 1)]
        assert sink.commit_group(attempts, parts) is CommitOutcome.APPLIED
        assert client.hgetall("h") == {"a": str(BOTTOM + TOP + 2**62)}
        # One more and the stored value would leave 64 bits: refused, nothing written.
        parts = [RedisBatch.of(4, {"h": {"a": TOP, "b": 1}}), RedisBatch.of(5, {"h": {"a": 1}})]
        attempts = [TransactionAttempt(4, 1), TransactionAttempt(5, 1)]
        with pytest.raises(ContractError, match=r"key \{'k': 'a'\} holds .* adding "):
            sink.commit_group(attempts, parts)
        assert client.hgetall("h") == {"a": str(BOTTOM + TOP + 2**62)}
        assert sink.committed_txid() == 3
        sink.close()


@pytest.mark.parametrize("stored", ["", "12a", "007", "-0", "1.5", " 1"])
def test_a_stored_value_that_is_not_a_long_is_refused_before_any_write(
    redis_url: str, client: redis.Redis, stored: Any
) -> None:
    client.hset("h", "b", stored)
    sink = opened(redis_url, CommitMode.TRANSACTIONAL)
    with pytest.raises(ContractError, match=rf"key \{{'k': 'b'\}} holds {stored!r}, which is not"):
        sink.commit(TransactionAttempt(1, 1), RedisBatch.of(1, {"h": {"a": 1, "b": 1}}))
    assert client.hgetall("h") == {"b": stored} and sink.committed_txid() is None
    sink.close()


def test_the_servers_account_shows_every_commit_write_in_the_script(
    redis_url: str, client: redis.Redis, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tests.monitor``, the Redis side of the crash chains' judgement: the committer's
    writes, a staged commit's included, come from its script, or are staging lists; a
    write of the sink's keys by a client is named. A commit of a deposed leader (a
    lower fence token) is seen sent and writing nothing."""
    from tests.monitor import ScriptWrites

    monkeypatch.setattr(committers.redis._send, "STAGE_CHUNK", 2)  # stage 3 fields
    sink = opened(redis_url, CommitMode.TRANSACTIONAL)  # fence token 1
    successor = RedisCommitter(redis_url, {"in": TABLE}, namespace="ns")
    successor.open(CommitterContext(None, "t", "sink", fence_token=2))
    with ScriptWrites(redis_url, tmp_path / "monitor.log") as writes:
        batch = RedisBatch.of(1, {"h": {"a": 1, "b": 2, "c": 3}}, ["{bad"])
        assert sink.commit(TransactionAttempt(1, 1), batch) is CommitOutcome.APPLIED
        batch = RedisBatch.of(2, {"h": {"a": 1}})
        assert successor.commit(TransactionAttempt(2, 2), batch) is CommitOutcome.APPLIED
        with pytest.raises(FencedError):
            sink.commit(TransactionAttempt(3, 3), RedisBatch.of(3, {"h": {"a": 1}}))
        client.hset("h", "a", 5)  # a write outside any commit
    sink.close()
    successor.close()
    assert client.hgetall("h") == {"a": "5", "b": "2", "c": "3"}
    log = (tmp_path / "monitor.log").read_text()
    assert '"RPUSH"' in log and ":stage:" in log  # the staging list was written, and left out
    assert [w.split(" (from ")[0] for w in writes.outside()] == ["HSET h"]
    fences = writes.fences()  # each script sent, in order (a NOSCRIPT one sent again)
    assert fences[-1] == 1 and 2 in fences[:-1]  # the deposed commit was sent...
    assert writes.deposed() == []  # ...and wrote nothing
