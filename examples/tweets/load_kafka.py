"""Put JSON Lines files into a Kafka topic, the layout the demo's ``--source kafka``
reads: the lines of partition file ``p`` (a single file is partition 0; a directory's
files in sorted name order, as the file spouts number them) become the messages of
Kafka partition ``p``, in order, each the raw line bytes without the newline.

A missing topic is created with one partition per file (the broker's replication
factor). Loading into a topic that already holds messages is refused
(``AlreadyLoaded``) unless ``append``: a second load would send every line again,
silently doubling the input. The producer is idempotent and waits for every message
to be acknowledged by all in-sync replicas; a message the broker refused fails the
load, naming it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from examples.tweets.load import CHUNK_LINES, AlreadyLoaded, read_lines
from transactional.errors import ConfigurationError
from transactional.secrets import redact_url
from transactional.sources.files import FilesPartitionedSpout

__all__ = ["load_kafka"]

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0


def _topic_partitions(admin: Any, topic: str, where: str) -> int | None:
    """The topic's partition count, None if it does not exist."""
    from confluent_kafka import KafkaException

    try:
        found = admin.list_topics(topic=topic, timeout=TIMEOUT_S).topics.get(topic)
    except KafkaException as e:
        raise ConfigurationError(
            f"cannot reach Kafka at {where} ({e}): start the broker or fix --kafka"
        ) from e
    if found is None or found.error is not None:
        return None
    return len(found.partitions)


def _held(admin: Any, topic: str, partitions: int) -> dict[int, int]:
    """Messages each partition holds now (end offset less start offset)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    def offsets(spec: OffsetSpec) -> dict[int, int]:
        futures = admin.list_offsets(
            {TopicPartition(topic, p): spec for p in range(partitions)},
            request_timeout=TIMEOUT_S,
        )
        return {tp.partition: int(f.result().offset) for tp, f in futures.items()}

    ends, starts = offsets(OffsetSpec.latest()), offsets(OffsetSpec.earliest())
    return {p: ends[p] - starts[p] for p in range(partitions)}


def load_kafka(
    input_path: str | os.PathLike[str],
    bootstrap_servers: str,
    topic: str = "tweets",
    append: bool = False,
) -> dict[int, int]:
    """Send every line of ``input_path`` to its partition of ``topic``; returns lines per
    partition. Refuses (``AlreadyLoaded``) if the topic holds messages, unless ``append``."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    files = FilesPartitionedSpout(input_path)
    names = files.names()
    where = redact_url(bootstrap_servers)
    config: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": log}
    admin = AdminClient(config)
    partitions = _topic_partitions(admin, topic, where)
    if partitions is None:
        for future in admin.create_topics([NewTopic(topic, max(1, len(names)))]).values():
            future.result(TIMEOUT_S)
        log.info("created topic=%s partitions=%d", topic, max(1, len(names)))
    elif partitions < len(names):
        raise ConfigurationError(
            f"topic {topic!r} on {where} has {partitions} partitions, fewer than the "
            f"{len(names)} input files (a file a partition): load into another --topic, "
            "or add partitions to it"
        )
    else:
        held = {p: n for p, n in _held(admin, topic, partitions).items() if n}
        if held and not append:
            raise AlreadyLoaded(
                f"topic {topic!r} already holds {sum(held.values())} messages "
                f"({', '.join(f'partition {p}: {n}' for p, n in held.items())}); loading "
                "again would send every line a second time. Pass --append to add them "
                "anyway, or load into another --topic"
            )
    refused: list[str] = []

    def delivered(error: object, message: object) -> None:
        if error is not None and len(refused) < 5:
            refused.append(str(error))

    producer = Producer({**config, "enable.idempotence": True, "acks": "all"})
    loaded: dict[int, int] = {}
    for partition, name in enumerate(names):
        loaded[partition] = 0
        for line in read_lines(Path(files.resolve(name))):
            while True:
                try:
                    producer.produce(topic, line, partition=partition, on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.1)
            loaded[partition] += 1
            if loaded[partition] % CHUNK_LINES == 0:
                producer.poll(0)
        log.info("loaded partition=%d file=%s lines=%d", partition, name, loaded[partition])
    left = producer.flush(TIMEOUT_S * 4)
    if left or refused:
        raise ConfigurationError(
            f"Kafka at {where} did not take every line of {input_path} into {topic!r} "
            f"({left} unsent; refused: {'; '.join(refused) or 'none'}): check the broker "
            "and load again into a new --topic"
        )
    return loaded
