"""A topology for ``transactional run`` over Redis Streams read through a consumer
group: every entry of ``STREAMS_KEYS`` (comma-separated) at ``STREAMS_REDIS_URL``, read
``STREAMS_BATCH`` per stream per txid through group ``STREAMS_GROUP``, counted once per
entry into the Redis hash ``seen`` (field ``"<stream> <id>"``), so that a count of 2 is
an entry counted twice and a missing field an entry lost."""

from __future__ import annotations

import os

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from committers import CounterTable, RedisCommitter
from transactional import Bolt, TopologyBuilder
from transactional.sources.redis_streams import RedisStreamsPartitionedSpout
from transactional.topology import Topology
from transactional.types import TransactionAttempt


class CountEntries(Bolt):
    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> DataFrame:
        entry = F.concat_ws(" ", "stream", "id").alias("entry")
        return batch.select(entry).groupBy("entry").agg(F.count("*").alias("count"))


def build() -> Topology:
    url = os.environ["STREAMS_REDIS_URL"]
    spout = RedisStreamsPartitionedSpout(
        url,
        os.environ["STREAMS_KEYS"].split(","),
        int(os.environ["STREAMS_BATCH"]),
        group=os.environ["STREAMS_GROUP"],
    )
    sink = RedisCommitter(url, {"default": CounterTable("seen", ("entry",))})
    return (
        TopologyBuilder()
        .set_spout(spout)
        .set_bolt("count", CountEntries())
        .set_committer("sink", sink, "count")
        .build()
    )
