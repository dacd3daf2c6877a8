"""A batch's records read over its decided ranges by Spark's own Kafka RDD, with no
Kafka relation planned for it.

Spark's batch reader (``spark.read.format("kafka")``) plans each read anew: its
relation builds an offset reader, which connects to the broker to resolve offsets the
spout has already decided, then builds a ``KafkaSourceRDD`` over them. A txid pays
that on the driver (about 25 ms of a 10-record txid here; ``benchmarks/analysis.md``).
``DirectRead`` builds the same RDD, with the same executor parameters and the same
row converter, over the ranges the spout decided: the same rows, read by the same
consumers, and no broker asked while planning. The spout still asks the broker for its
offsets and checks that a replayed range is held (``_spouts.py``).

Classic sessions only (a Spark Connect client has no JVM to build it in), and only for
options it honours the same way (``kafka.*`` parameters, the consumer's poll timeout,
``failOnDataLoss``); anything else, or a Spark whose Kafka classes differ, reads through Spark's
reader as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("transactional.sources.kafka")

#: Source options of Spark's reader (its option names are case-insensitive) that the
#: direct read honours as the reader's RDD does.
POLL_TIMEOUT = "kafkaconsumer.polltimeoutms"
FAIL_ON_DATA_LOSS = "failondataloss"
#: Source options that only Spark's driver-side offset reader uses: none of them is
#: needed where the offsets are already decided.
DRIVER_ONLY = frozenset({"fetchoffset.numretries", "fetchoffset.retryintervalms"})
HONOURED = frozenset({POLL_TIMEOUT, FAIL_ON_DATA_LOSS}) | DRIVER_ONLY


class DirectRead:
    """Frames over decided offset ranges of one topic (see the module)."""

    def __init__(self, spark: SparkSession, options: Mapping[str, str]) -> None:
        jvm = spark._jvm
        assert jvm is not None
        kafka = jvm.org.apache.spark.sql.kafka010
        scala = jvm.scala
        self._spark = spark
        self._kafka = kafka
        specified = {k[len("kafka.") :]: v for k, v in options.items() if _is_kafka(k)}
        self._params = _module(kafka, "KafkaSourceProvider").kafkaParamsForExecutors(
            _scala_map(jvm, specified), "transactional"
        )
        sc = spark._jsc.sc()
        self._sc = sc
        source = {k.lower(): v for k, v in options.items() if not _is_kafka(k)}
        self._fail_on_data_loss = source.get(FAIL_ON_DATA_LOSS, "true").strip().lower() == "true"
        timeout = source.get(POLL_TIMEOUT)
        self._poll_ms = (
            int(timeout)
            if timeout is not None
            else sc.conf().getTimeAsSeconds("spark.network.timeout", "120s") * 1000
        )
        self._to_row = kafka.KafkaRecordToRowConverter().toInternalRowWithoutHeaders()
        self._schema = _module(kafka, "KafkaRecordToRowConverter").kafkaSchema(False)
        self._tag = scala.reflect.ClassTag.apply(
            jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.InternalRow")
        )
        self._none = _module(scala, "None")
        self._sql = spark._jsparkSession.sqlContext()
        # Looked up once: each lookup of a JVM class is a py4j round trip, every txid.
        self._partition = jvm.org.apache.kafka.common.TopicPartition
        self._list = jvm.java.util.ArrayList
        self._converters = jvm.scala.jdk.javaapi.CollectionConverters

    @classmethod
    def of(cls, spark: SparkSession, options: Mapping[str, str], who: str) -> DirectRead | None:
        """The direct read on a classic session (the caller's to know), or None where
        reads must go through Spark's reader."""
        from py4j.protocol import Py4JError

        others = sorted(k for k in options if not _is_kafka(k) and k.lower() not in HONOURED)
        if others:
            log.debug("kafka reads by spark's reader spout=%s options=%s", who, others)
            return None
        try:
            return cls(spark, options)
        except Py4JError as e:  # another Spark's Kafka classes: its reader still reads
            log.debug("kafka reads by spark's reader spout=%s error=%r", who, e)
            return None

    def frame(self, topic: str, ranges: Mapping[int, tuple[int, int]]) -> DataFrame:
        """The records of ``ranges`` (partition -> ``(start, end)``, end exclusive), in
        Spark's Kafka columns, one RDD partition per range."""
        from pyspark.sql import DataFrame

        pieces = self._list()
        for partition, (start, end) in sorted(ranges.items()):
            where = self._partition(topic, partition)
            pieces.add(self._kafka.KafkaOffsetRange(where, start, end, self._none))
        offsets = self._converters.asScala(pieces).toSeq()
        rdd = self._kafka.KafkaSourceRDD(
            self._sc, self._params, offsets, self._poll_ms, self._fail_on_data_loss
        )
        rows = rdd.map(self._to_row, self._tag).setName("kafka")
        return DataFrame(self._sql.internalCreateDataFrame(rows, self._schema, False), self._spark)


def _is_kafka(option: str) -> bool:
    return option.lower().startswith("kafka.")


def _module(package: Any, name: str) -> Any:
    """A Scala object's instance (``name$.MODULE$``)."""
    return getattr(getattr(package, f"{name}$"), "MODULE$")


def _scala_map(jvm: Any, values: Mapping[str, str]) -> Any:
    """An immutable Scala ``Map[String, String]``."""
    java = jvm.java.util.HashMap()
    for key, value in values.items():
        java.put(key, value)
    converted = jvm.scala.jdk.javaapi.CollectionConverters.asScala(java)
    return getattr(_module(jvm.scala.collection.immutable, "Map"), "from")(converted)
