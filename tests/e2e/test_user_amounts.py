"""A user's topology with fractional sums and aggregate states (``tests/e2e/amounts.py``),
over the library's sources (CSV or Parquet files, Redis Streams, a Delta table), through
``transactional run`` into Redis and Delta: killed at a crash point, run again, and the
sums, counts, minimums, maximums and last values are exact (its bolt plans once, so
each run re-points the plans it kept at its later batches, a replay's too), against answers computed
here with ``math.fsum`` and ``decimal``; every record that does not fit the schema is in
the dead letters once; ``transactional query`` reads the states back."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.jvm import short_lived

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # make test-slow: a crash and a rerun
ROOT = Path(__file__).resolve().parents[2]


#: CSV lines that do not fit ``account STRING, amount DECIMAL(18,3)``: each must reach
#: the dead letters once, with the reason the source gave.
BAD_LINES = ["acct-1,twelve", "acct-2,1.5,extra", "acct-3,0.0001"]


Record = tuple[str, Decimal] | None  # None: a record that goes to the dead letters


def write_input(
    directory: Path, format: str, redis_url: str, seed: int = 11, table: str | None = None
) -> list[list[Record]]:
    """Three partitions of ``account,amount`` records; amounts are multiples of 1/8 (so
    binary doubles hold every partial sum exactly) with three decimals, some negative.
    CSV files have a header and, in partition 1, the ``BAD_LINES``; streams (after
    ``redis_url``), in ``amounts:1``, an amount with four places; a Delta table, a
    version per partition, at ``table`` (default: ``directory/table``). Returns each
    partition's records in order, a bad one as None."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    directory.mkdir()
    partitions: list[list[Record]] = []
    for p in range(3):
        mine = []
        for _ in range(rng.randint(9, 14)):
            account = f"acct-{rng.randint(1, 6)}"
            amount = Decimal(rng.randint(-4000, 40000)) / 8
            mine.append((account, amount.quantize(Decimal("0.001"))))
        records: list[Record] = list(mine)
        partitions.append(records)
        if format == "stream":
            client = redis.Redis.from_url(redis_url)
            for account, amount in mine:
                client.xadd(f"amounts:{p}", {"account": account, "amount": str(amount)})
            if p == 1:
                client.xadd(f"amounts:{p}", {"account": "acct-1", "amount": "0.0001"})
                records.append(None)
            client.close()
            continue
        if format == "delta":  # one appended version per partition's records
            from deltalake import write_deltalake

            records_table = pa.table(
                {
                    "account": pa.array([a for a, _ in mine]),
                    "amount": pa.array([v for _, v in mine], pa.decimal128(18, 3)),
                }
            )
            write_deltalake(table or str(directory / "table"), records_table, mode="append")
            continue
        if format == "parquet":
            table = pa.table(
                {
                    "account": pa.array([a for a, _ in mine]),
                    "amount": pa.array([v for _, v in mine], pa.decimal128(18, 3)),
                }
            )
            pq.write_table(table, directory / f"part-{p}.parquet", row_group_size=5)
            continue
        lines = [f"{account},{amount}" for account, amount in mine]
        if p == 1:
            lines[3:3] = BAD_LINES
            records[3:3] = [None] * len(BAD_LINES)
        (directory / f"part-{p}.csv").write_text("account,amount\n" + "\n".join(lines) + "\n")
    return partitions


def latest(partitions: list[list[Record]], batch: int) -> dict[str, Decimal]:
    """Per account, the greatest amount of the last txid that had one: txid t holds
    records ``[batch * (t - 1), batch * t)`` of every partition (a bad one too)."""
    txids = max(len(p) for p in partitions) // batch + 1
    return latest_of(
        [
            [r for records in partitions for r in records[batch * t : batch * (t + 1)]]
            for t in range(txids)
        ]
    )


def latest_of(txids: list[list[Record]]) -> dict[str, Decimal]:
    """Per account, the greatest amount of the last of ``txids`` (each its records)
    that had one."""
    out: dict[str, Decimal] = {}
    for records in txids:
        best: dict[str, Decimal] = {}
        for record in records:
            if record is not None:
                account, amount = record
                best[account] = max(best.get(account, amount), amount)
        out.update(best)
    return out


def run(
    args: list[str], environ: dict[str, str], command: str = "run"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transactional.cli", command, "tests.e2e.amounts:build", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.rotated  # CI runs one or two of its three a time, all three in two runs
@pytest.mark.parametrize(
    ("format", "crash"),
    [  # one crash per source (the crash matrix kills at every step); CI runs files (CSV),
        # Redis Streams and a Delta table in S3, and Parquet and local Delta in one run of
        # five each (exhaustive: tests/rotation.py; all in make test-exhaustive)
        ("csv", "after_sink_write:3"),
        pytest.param("parquet", "after_sink_write:2", marks=pytest.mark.exhaustive),
        ("stream", "before_sink_write:3"),
        pytest.param("delta", "after_sink_write:2", marks=pytest.mark.exhaustive),
        ("delta-s3", "after_sink_write:2"),  # the table in a bucket of the S3 stand-in
    ],
)
def test_fractional_sums_are_exact_through_a_crash_and_a_rerun(
    spark: Any,
    redis_url: str,
    tmp_path: Path,
    format: str,
    crash: str,
    request: pytest.FixtureRequest,
) -> None:
    settings: dict[str, str] = {}
    table = str(tmp_path / "input" / "table")
    if format == "delta-s3":
        server = request.getfixturevalue("s3_server")
        settings = server.settings
        table, format = f"s3://{server.bucket()}/table", "delta"
    with pytest.MonkeyPatch.context() as patch:  # deltalake writes the table with them
        for name, value in settings.items():
            patch.setenv(name, value)
        partitions = write_input(tmp_path / "input", format, redis_url, table=table)
    rows = [r for records in partitions for r in records if r is not None]
    doubles: dict[str, list[float]] = defaultdict(list)
    exact: dict[str, Decimal] = defaultdict(Decimal)
    for account, amount in rows:
        doubles[account].append(float(amount))
        exact[account] += amount
    expected_double = {a: math.fsum(v) for a, v in doubles.items()}

    environ = {
        **short_lived({k: v for k, v in os.environ.items() if not k.startswith("TRANSACTIONAL_")}),
        "AMOUNTS_INPUT": table if format == "delta" else str(tmp_path / "input"),
        "AMOUNTS_FORMAT": format,
        "AMOUNTS_REDIS_URL": redis_url,
        "AMOUNTS_DELTA": str(tmp_path / "delta"),
        "AMOUNTS_BATCH": "4",
        "AMOUNTS_CALLS": str(tmp_path / "calls"),
        **settings,
    }
    args = [
        "--topology-id",
        "amounts",
        "--state-dir",
        str(tmp_path / "state"),
        "--master",
        "local[2]",
        "--until-drained",
    ]
    killed = run([*args, "--crash-at", crash], environ)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert f"crash_at point={crash.split(':')[0]} txid={crash.split(':')[1]}" in killed.stderr

    # The bolt plans once. The killed run, two txids in flight (the default), asked it
    # for txids 1 and 2, which began before any plans were kept (no warm-up: the batch
    # size is fixed), and re-pointed those at every later txid. The rerun, one in
    # flight, asks for its first txid, the one the crash cut, and re-points the plans
    # at the txids the input holds past it.
    before = calls(tmp_path / "calls")
    done = run([*args, "--max-pending", "1"], environ)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("committed ")
    crashed = int(crash.split(":")[1])
    txids = 3 if format == "delta" else -(-max(len(p) for p in partitions) // 4)
    assert txids > crashed
    assert sorted(before) == [1, 2]
    assert calls(tmp_path / "calls")[len(before) :] == [crashed]

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    stored = {k: float(v) for k, v in client.hgetall("balances").items()}
    bad = [json.loads(v) for v in client.lrange("dead_letters", 0, -1)]
    client.close()
    if format == "stream":
        assert [(json.loads(b["raw"]), b["reason"]) for b in bad] == [
            ({"account": "acct-1", "amount": "0.0001"}, "amount is not a decimal(18,3)")
        ]
    else:
        assert sorted(b["raw"] for b in bad) == (sorted(BAD_LINES) if format == "csv" else [])
        assert all(b["reason"].startswith("not a CSV record of the schema") for b in bad)
    assert stored == expected_double  # exact equality: no value lost, none counted twice

    balances = spark.read.format("delta").load(str(tmp_path / "delta" / "balances"))
    assert balances.schema["count"].dataType.simpleString() == "double"
    assert {r["account"]: r["count"] for r in balances.collect()} == expected_double
    decimals = spark.read.format("delta").load(str(tmp_path / "delta" / "exact_balances"))
    assert decimals.schema["count"].dataType.simpleString() == "decimal(38,3)"
    assert {r["account"]: r["count"] for r in decimals.collect()} == dict(exact)

    # The aggregate states, against folds of the records computed here.
    counts = Counter(account for account, _ in rows)
    largest = {a: max(v for b, v in rows if b == a) for a in counts}
    smallest = {a: min(v for b, v in rows if b == a) for a in counts}
    # A Delta source's txid is one version (each holds more than 4 records).
    last = latest_of(partitions) if format == "delta" else latest(partitions, 4)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    assert {k: int(v) for k, v in client.hgetall("records").items()} == dict(counts)
    assert {k: Decimal(v) for k, v in client.hgetall("largest").items()} == largest
    assert {k: Decimal(v) for k, v in client.hgetall("latest").items()} == last
    client.close()

    def delta(name: str, column: str) -> dict[str, Any]:
        table = spark.read.format("delta").load(str(tmp_path / "delta" / name))
        return {r["account"]: r[column] for r in table.collect()}

    assert delta("records", "count") == dict(counts)
    assert delta("smallest", "min") == smallest
    assert delta("latest", "last") == last

    # ``transactional query`` reads a state from its sink by key; both sinks keep one
    # named "latest", so the committer is named.
    accounts = sorted(counts)[:2]
    ambiguous = run(["latest", accounts[0]], environ, "query")
    assert ambiguous.returncode == 2
    assert "['delta', 'redis'] of tests.e2e.amounts:build each keep" in ambiguous.stderr
    for committer in ("redis", "delta"):
        asked = ["latest", *accounts, "acct-404", "--committer", committer, "--json"]
        queried = run(asked, environ, "query")
        assert queried.returncode == 0, queried.stderr[-3000:]
        document = json.loads(queried.stdout)
        assert [(v["key"], v["value"]) for v in document["values"]] == [
            *[([a], format_decimal(last[a])) for a in accounts],
            (["acct-404"], None),
        ]


def calls(path: Path) -> list[int]:
    """The txids the topology's bolt was called for, in order (``AMOUNTS_CALLS``)."""
    return [int(line) for line in path.read_text().split()]


def format_decimal(value: Decimal) -> str:
    return format(value.quantize(Decimal("0.001")), "f")
