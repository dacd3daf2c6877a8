"""The weaker guarantees under SIGKILL: the demo (driver, Spark JVM, Python workers)
killed at every step of the protocol, under ``--guarantee at_least_once`` and
``--guarantee at_most_once``, then started again until drained, writing to Redis and
to Delta (``--sink both``: the step between two committers exists) and counting each
tweet by id (``--record-ids``), in both commit modes: the transactional file spout into
transactional-mode sinks, the opaque one into opaque-mode sinks.

What each promise means is counted exactly, from what the store and the sinks held at
each kill, read directly (SQL on the store's file, Redis, the Delta logs), and from the
input's bytes (``tests.reference``), never from the runner's word:

- ``at_least_once``: a txid the store held as started and a sink held as written was
  applied to that sink again by the next run; so a transactional-mode sink holds the
  whole input, plus exactly those txids' records once more per kill that left them so,
  and an opaque-mode sink, whose replay undoes the earlier write first, holds the whole
  input exactly once. An opaque chain's runs take turns at two batch sizes (an opaque
  spout may change it between runs), so a replay after a sink write reads other records
  than the attempt it undoes: keys only that attempt wrote must be undone too.
- ``at_most_once``: a txid the store held as started that a sink did not hold is never
  written to it; so each sink holds the input less exactly those txids' records (an
  opaque batch's from its partitions' stored ranges), and the runs report as dropped
  exactly the txids that not every sink held.

Under ``at_least_once`` the chain is the crash matrix's (``test_crash_matrix.CHAIN``):
each run dies after the commits of what the run before left, so "applied again by the
next run" holds. Rotated: every chain (guarantee x mode) dies after a sink write in
every run and at a fifth of the other steps, each chain a different fifth, so five
consecutive seeds kill every chain at every step. Under ``at_most_once`` a run never emits again what the one before left
in flight, so each run dies at the next step of the protocol for the first txid it
decides anew (one past the last the store holds), over a longer input.

Overlapping commits (``at_least_once`` with Redis alone, whose commits commute) have a
chain of their own, a commit per txid, through a proxy that delays every request to Redis
so that commits wait on the network and overlap: a later txid's commit may land before
an earlier one's (it did in the runs that made this test), or be cut by the kill. What
each run applied is read from the sink itself, as the difference of the per-tweet counts
before and after it, so the count needs no assumption about which commits a kill let
land. In a rotated run it dies after the write of txid 2 (a written batch to replay) and
at a third of its other steps.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from examples.tweets.cli import main as demo
from tests import rotation
from tests.e2e.test_crash_matrix import fresh_db, steps
from tests.history import Image, assert_exact, read_delta, read_redis, tweet_counts
from tests.processes import (
    DemoProcess,
    adopting_orphans,
    killed,
    reap_session,
    redis_txid,
    run_guarantee,
    store_state,
    stored_metas,
    stored_partition_metas,
)
from tests.processes import delta_txid as delta_sink_txid
from tests.reference import Expected, combined, expected_counts, expected_of_range, without
from transactional.faults import FaultPoint
from transactional.testing.proxy import TcpProxy
from transactional.testing.servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

GUARANTEES = ("at_least_once", "at_most_once")
#: The demo's spout kinds, and with them its committers' mode: the transactional file
#: spout into transactional-mode sinks, the opaque one into opaque-mode sinks.
SPOUTS = ("transactional", "opaque")
CHAINS = [(g, s) for g in GUARANTEES for s in SPOUTS]
#: Each chain's part of the chain's steps under a seed (``test_crash_matrix.steps``): a
#: fifth of the steps besides the one every run kills at, each chain a different fifth,
#: so five consecutive seeds kill each guarantee in each mode at every step.
PHASES = {chain: n for n, chain in enumerate(CHAINS)}
SLICES = 5
#: Each chain's Redis database (the crash matrix and the overlapping chain use others).
DATABASES = dict(zip(CHAINS, (6, 7, 13, 14), strict=True))
SINKS = ("redis", "delta")
DROPPED = re.compile(r"txid dropped guarantee=at_most_once txid=(\d+)")


@dataclass
class Kill:
    """What one run left when it was killed: the store's started txids past ``currtx``
    and their metadata, and the last txid each sink holds."""

    point: str
    returncode: int
    marked: bool  # the run said it reached its crash step
    jvms_killed: bool
    pending: dict[int, Any]
    held: dict[str, int]
    #: The opaque spout's partition metadata of each pending txid the store holds.
    parts: dict[int, dict[int, Any]] = field(default_factory=dict)


@dataclass
class Chain:
    guarantee: str
    spout: str
    input: Path
    expected: Expected
    redis_url: str
    delta_path: Path
    kills: list[Kill] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    final_returncode: int = -1


#: Lines per txid, and the txids of input beyond those a chain's kills may drop:
#: at_most_once drops up to ``MAX_PENDING`` txids a kill, so its input grows with them.
SIZES = {"at_least_once": (30, 4), "at_most_once": (10, 5)}
MAX_PENDING = 3
#: An opaque chain's runs read with this part of its batch size every other run (so the
#: final run too has the size the last killed run did not): an opaque spout may change
#: it between runs, so a replay after a sink write reads other records than the attempt
#: it undoes, and the undo must remove what the earlier attempt alone wrote.
SHRUNK = 3


def batch_sizes(spout: str, per_txid: int, runs: int) -> list[int]:
    """The batch size of each run of a chain (its last run is the final one)."""
    if spout != "opaque":
        return [per_txid] * runs
    return [per_txid if k % 2 == 0 else per_txid // SHRUNK for k in range(runs)]


def tweets(directory: Path, count: int) -> tuple[Path, Expected]:
    out = directory / "tweets"
    args = ["generate", "--count", str(count), "--seed", "37", "--partitions", "1"]
    assert demo([*args, "--bad-rate", "0.04", "--out", str(out)], out=io.StringIO()) == 0
    expected = expected_counts(out)
    assert expected.dead_letters and expected.pairs
    return out, expected


@pytest.fixture(scope="module", params=CHAINS, ids=[f"{g}-{s}" for g, s in CHAINS])
def chain(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Chain:
    guarantee, spout = request.param
    work = tmp_path_factory.mktemp(f"chain-{guarantee}-{spout}")
    kills = steps(rotation.of(request.config), PHASES[request.param], SLICES)
    per_txid, txids = SIZES[guarantee]
    dropped = MAX_PENDING * len(kills) if guarantee == "at_most_once" else 0
    path, expected = tweets(work, per_txid * (txids + dropped))
    result = Chain(
        guarantee,
        spout,
        path,
        expected,
        fresh_db(redis_server, DATABASES[request.param]),
        work / "delta",
    )
    state = work / "state"
    args = [
        "run",
        "--input",
        str(path),
        "--spout",
        spout,
        "--sink",
        "both",
        "--record-ids",
        "--guarantee",
        guarantee,
        "--redis-url",
        result.redis_url,
        "--delta-path",
        str(result.delta_path),
        "--state-dir",
        str(state),
        "--max-pending",
        str(MAX_PENDING),
        "--max-group",
        "3",
        "--group-wait",
        "60",
        "--until-drained",
        "--master",
        "local[2]",
        "--top",
        "0",
    ]
    sizes = [["--batch-size", str(n)] for n in batch_sizes(spout, per_txid, len(kills) + 1)]
    with adopting_orphans():
        for k, (point, txid) in enumerate(kills):
            if guarantee == "at_most_once":  # the first txid this run decides anew
                txid = max(stored_metas(state), default=0) + 1
            crash = ["--crash-at", f"{point.value}:{txid}"]
            run = DemoProcess([*args, *sizes[k], *crash], work / f"r{k}.log")
            code = run.wait()
            exits = reap_session(run.pid)
            output = run.output()
            result.outputs.append(output)
            currtx, _ = store_state(state)
            metas = stored_metas(state)
            parts = stored_partition_metas(state)
            jvms = [status for command, status in exits.values() if command == "java"]
            result.kills.append(
                Kill(
                    point.value,
                    code,
                    output.count(f"crash_at point={point.value} txid={txid} ") == 1,
                    bool(jvms) and all(killed(s) for s in jvms),
                    {t: m for t, m in metas.items() if t >= currtx},
                    {
                        "redis": redis_txid(result.redis_url, "redis"),
                        "delta": delta_sink_txid(
                            result.delta_path, "delta", opaque=spout == "opaque"
                        ),
                    },
                    {t: p for t, p in parts.items() if t >= currtx},
                )
            )
        final = DemoProcess([*args, *sizes[-1]], work / "final.log")
        result.final_returncode = final.wait()
        reap_session(final.pid)
    result.outputs.append(final.output())
    return result


def records_of(directory: Path, meta: Any) -> Expected:
    """The records a transactional file batch of the input ``directory`` holds: its byte
    ranges, read here."""
    return combined(
        *(
            expected_of_range(directory / s["file"], s["offset"], s["length"])
            for s in meta["segments"]
        )
    )


def batch_of(chain: Chain, kill: Kill, txid: int) -> Expected:
    """The records txid ``txid`` held when ``kill`` happened: its stored metadata's byte
    ranges (the transactional spout), or its partitions' (the opaque spout; none stored
    yet if it died before its emit)."""
    if chain.spout == "transactional":
        return records_of(chain.input, kill.pending[txid])
    ranges = kill.parts.get(txid, {}).values()
    return combined(
        *(expected_of_range(chain.input / r["file"], r["offset"], r["length"]) for r in ranges)
    )


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("sink", SINKS)
def test_killed_at_every_step_keeps_the_guarantees_promise_exactly(
    chain: Chain, sink: str, spark: Any
) -> None:
    for kill in chain.kills:  # every kill happened, at its step, and took the JVM along
        assert (kill.returncode, kill.marked, kill.jvms_killed) == (-9, True, True), kill
    assert chain.final_returncode == 0, chain.outputs[-1][-3000:]
    assert run_guarantee(chain.outputs[-1]) == chain.guarantee  # the run says what it gave
    got = read_redis(chain.redis_url) if sink == "redis" else read_delta(chain.delta_path)
    written = [
        {t: m for t, m in kill.pending.items() if t <= kill.held[sink]} for kill in chain.kills
    ]
    if chain.guarantee == "at_least_once":
        assert any(written)  # a kill after a sink write happened: the replay is real
        if chain.spout == "opaque":  # its replays undo the earlier write: never twice
            assert_exact(got, chain.expected, ids=True)
            assert max(tweet_counts(got).values()) == 1
            return
        again = [
            batch_of(chain, kill, t)
            for kill, w in zip(chain.kills, written, strict=True)
            for t in w
        ]
        assert_exact(got, combined(chain.expected, *again), ids=True)
        assert max(tweet_counts(got).values()) == 2  # counted twice, never more, in this chain
    else:
        lost = [
            batch_of(chain, kill, t)
            for kill, w in zip(chain.kills, written, strict=True)
            for t in kill.pending
            if t not in w
        ]
        assert any(batch.ids for batch in lost)  # some kill left records that no sink held
        assert_exact(got, without(chain.expected, combined(*lost)), ids=True)
        assert max(tweet_counts(got).values()) == 1  # nothing twice
        reported = {int(t) for out in chain.outputs for t in DROPPED.findall(out)}
        not_everywhere = {
            t
            for kill in chain.kills
            for t in kill.pending
            if any(t > held for held in kill.held.values())
        }
        assert reported == not_everywhere


#: Where overlapping commits are killed: the first commit not yet written while the next
#: may be landing, after a write with later commits in flight, before a later write, and
#: after an advance. Before the first commit starts nothing is in flight to overlap, so
#: the earlier steps are the chain above's.
OVERLAP_CHAIN = [
    (FaultPoint.BEFORE_SINK_WRITE, 1),
    (FaultPoint.AFTER_SINK_WRITE, 2),
    (FaultPoint.BEFORE_SINK_WRITE, 4),
    (FaultPoint.AFTER_ADVANCE, 4),
]
#: The overlapping chain's kill in every run: a written batch the next run replays.
OVERLAP_ALWAYS = (FaultPoint.AFTER_SINK_WRITE, 2)


def overlap_steps(chosen: rotation.Rotation) -> list[tuple[FaultPoint, int]]:
    """The overlapping chain's kills in this run: ``OVERLAP_ALWAYS`` and a third of the
    others, in ``OVERLAP_CHAIN``'s order."""
    return rotation.kills(chosen, OVERLAP_CHAIN, OVERLAP_ALWAYS, phase=0, slices=3)


#: Each request to Redis waits this long: a commit takes longer than processing a batch.
REDIS_DELAY_S = 0.4


@dataclass
class Overlapped:
    input: Path
    expected: Expected
    kills: list[tuple[int, bool, bool]] = field(default_factory=list)  # (code, marked, jvms)
    final_returncode: int = -1
    pending: list[dict[int, Any]] = field(default_factory=list)  # past currtx, at each kill
    snapshots: list[Image] = field(default_factory=list)  # the sink after each run
    outputs: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def overlapped(
    redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
    pytestconfig: pytest.Config,
) -> Overlapped:
    work = tmp_path_factory.mktemp("overlapped")
    path, expected = tweets(work, 150)
    result = Overlapped(path, expected)
    direct = fresh_db(redis_server, 8)
    state = work / "state"
    with TcpProxy(redis_server.port, delay_s=REDIS_DELAY_S) as proxy, adopting_orphans():
        args = [
            "-v",  # the runner's start line says how many commits overlap
            "run",
            "--input",
            str(path),
            "--spout",
            "transactional",
            "--sink",
            "redis",
            "--record-ids",
            "--guarantee",
            "at_least_once",
            "--redis-url",
            direct.replace(f":{redis_server.port}/", f":{proxy.port}/"),  # through the proxy
            "--state-dir",
            str(state),
            "--batch-size",
            "25",
            "--max-pending",
            "3",
            "--max-group",
            "1",  # a commit per txid: each after the first may overlap the one before
            "--until-drained",
            "--master",
            "local[2]",
            "--top",
            "0",
        ]
        for k, (point, txid) in enumerate(overlap_steps(rotation.of(pytestconfig))):
            run = DemoProcess([*args, "--crash-at", f"{point.value}:{txid}"], work / f"r{k}.log")
            code = run.wait()
            exits = reap_session(run.pid)
            proxy.wait_idle(60)  # what the dead run sent has reached Redis
            output = run.output()
            result.outputs.append(output)
            jvms = [status for command, status in exits.values() if command == "java"]
            currtx, _ = store_state(state)
            result.kills.append(
                (
                    code,
                    output.count(f"crash_at point={point.value} txid={txid} ") == 1,
                    bool(jvms) and all(killed(s) for s in jvms),
                )
            )
            result.pending.append({t: m for t, m in stored_metas(state).items() if t >= currtx})
            result.snapshots.append(read_redis(direct))
        final = DemoProcess(args, work / "final.log")
        result.final_returncode = final.wait()
        reap_session(final.pid)
        proxy.wait_idle(60)
        result.outputs.append(final.output())
        result.snapshots.append(read_redis(direct))
    return result


@pytest.mark.timeout(1200)
def test_overlapping_commits_killed_at_every_step_count_again_exactly_what_was_replayed(
    overlapped: Overlapped,
) -> None:
    for code, marked, jvms in overlapped.kills:  # every kill happened, at its step, with the JVM
        assert (code, marked, jvms) == (-9, True, True), overlapped.outputs
    assert overlapped.final_returncode == 0, overlapped.outputs[-1][-3000:]
    for output in overlapped.outputs:  # every run let its commits overlap
        assert "guarantee=at_least_once commits_at_once=3" in output
    again = []
    before: Counter[int] = Counter()
    for pending, after in zip(overlapped.pending, overlapped.snapshots, strict=False):
        held = tweet_counts(after)  # none if no commit has landed yet
        applied = held - before  # what this run wrote, per tweet
        for meta in pending.values():  # a batch the store had not moved past ...
            batch = records_of(overlapped.input, meta)
            landed = {applied[i] for i in batch.ids}
            assert landed in ({0}, {1}), (meta, landed)  # whole, once, or not at all
            if landed == {1}:  # ... written by the run, so replayed and written again
                again.append(batch)
        before = held
    assert again  # some kill left a written batch to replay: the double count is real
    got = overlapped.snapshots[-1]
    assert_exact(got, combined(overlapped.expected, *again), ids=True)
    assert tweet_counts(got).keys() == overlapped.expected.ids.keys()  # every tweet, none lost
