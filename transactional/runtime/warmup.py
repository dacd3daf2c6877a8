"""The warm-up before a run's first txid (``RunnerConfig.warm_up``): the spout's
``sample_batch`` through the steps of an attempt as txid 0, never stored or committed,
once per Spark application and topology, so that the session's cold start is not paid
by the first txids. What it does and why: docs/architecture.md, "A txid's path".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from transactional import contracts
from transactional.errors import ConfigurationError
from transactional.runtime.pipeline import Pipeline
from transactional.spark.connect import is_connect
from transactional.topology import Topology

log = logging.getLogger("transactional.runner")


#: The (Spark application, topology) pairs warmed up in this process (``_warmth``).
_WARMED: set[tuple[str, ...]] = set()


def _warmth(engine: Any, topology: Topology, topology_id: str) -> tuple[str, ...] | None:
    """What a warm-up warms: the engine's Spark application and the topology, by id and
    by the type of each of its components, wired as they are. None for an engine that
    is not on Spark (nothing is kept warm between its runs)."""
    spark = getattr(engine, "spark", None)
    app: object
    if is_connect(spark):  # no SparkContext: the server's session stands for it
        app = f"connect:{spark.session_id}"  # type: ignore[union-attr]
    else:
        app = getattr(getattr(spark, "sparkContext", None), "applicationId", None)
    if not isinstance(app, str):
        return None

    named = contracts.qualified
    return (
        app,
        topology_id,
        named(topology.spout),
        *(f"{n.name}<-{n.input}:{named(n.bolt)}" for n in topology.bolts),
        *(
            f"{n.name}<-{sorted(n.inputs.items())}:{named(n.committer)}"
            for n in topology.committers
        ),
    )


def warm_up(
    pipeline: Pipeline,
    topology: Topology,
    topology_id: str,
    group: str,
    timeout_s: float | None,
    stopping: Callable[[], bool],
) -> int | None:
    """Run the spout's sample through ``pipeline`` (``topology``'s) in Spark job group
    ``group``, cancelled after ``timeout_s``, unless this Spark application already
    warmed ``topology_id`` up. Returns the sample's records, or None if there was no
    warm-up (already warm, no sample, a stop asked for, or a failure other than a
    ``ConfigurationError``)."""
    spout, engine = pipeline.driver.spout, pipeline.engine
    warmth = _warmth(engine, topology, topology_id)
    if warmth is not None and warmth in _WARMED:
        log.info("warm-up skipped: this Spark application already warmed topology=%s", topology_id)
        return None
    began = time.perf_counter()
    timer = threading.Timer(timeout_s, engine.cancel, (group,)) if timeout_s else None
    try:
        frame: Any = spout.sample_batch()
        if frame is None or stopping():
            return None
        contracts.check_frame(frame, engine.is_frame, pipeline.driver.name, "sample_batch", 0)
        if timer is not None:
            timer.start()
        with engine.job_group(group):
            engine.describe(f"{pipeline.label} warm-up (txid 0, not stored)".strip())
            records = pipeline.warm_up(frame)
    except ConfigurationError as exc:
        exc.add_note(
            "Found by the warm-up, which runs the spout's sample_batch through the "
            "topology as txid 0 before the first txid: nothing was stored or committed."
        )
        raise
    except Exception as exc:
        log.warning("warm-up failed; the first txid will meet this error itself error=%r", exc)
        return None
    finally:
        if timer is not None:
            timer.cancel()
    log.info("warm-up records=%d seconds=%.2f", records, time.perf_counter() - began)
    if records and warmth is not None:
        _WARMED.add(warmth)
    return records
