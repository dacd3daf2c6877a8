"""The warm-up before a run's first txid (``RunnerConfig.warm_up``).

A fresh Spark session pays once for what every later txid reuses: the JVM's first jobs,
PySpark's Python workers and their imports, the code generation of each plan shape.
Left to the first txids, that cost makes them several times slower than the rest (the
tweet demo's first two txids took 11 s where the next three took 1.5 to 3 s each),
which also misleads ``--batch-size auto``: it reads those latencies as the batch
size's. So the runner first runs the spout's ``sample_batch`` through the same steps
as an attempt (materialise, bolts, every committer's ``prepare``) as txid 0, which is
never stored or committed. Nothing it does touches the store or a sink.

A ``ConfigurationError`` (a broken contract: a bolt returning something that is not a
frame, a committer's input of the wrong type) stops the run here, before any txid is
stored. Any other failure only costs the warm-up: it is logged, and the first txid
meets the error itself under the usual retry rules.
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

log = logging.getLogger("transactional.runner")


def warm_up(
    pipeline: Pipeline,
    group: str,
    timeout_s: float | None,
    stopping: Callable[[], bool],
) -> int | None:
    """Run the spout's sample through ``pipeline`` in Spark job group ``group``, cancelled
    after ``timeout_s``. Returns the sample's records, or None if there was no warm-up
    (no sample, a stop asked for, or a failure other than a ``ConfigurationError``)."""
    spout, engine = pipeline.driver.spout, pipeline.engine
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
    return records
