"""OpenLineage run events of a run (``RunnerConfig.lineage``; docs/how-to/lineage.md).

Each attempt of a txid is a run of the topology's job: START once its metadata is
stored and its batch is out, then COMPLETE once it is committed (or found already held
by the sinks), FAIL when it failed, ABORT when it was retracted (an empty batch) or
cancelled. The spout's datasets are the inputs, each with the txid's stored positions
in a facet; the committers' are the outputs.

The events leave on a thread of their own, through the OpenLineage client configured
by its own settings (``OPENLINEAGE_URL``, ``openlineage.yml``,
``OPENLINEAGE__TRANSPORT__*``): a slow or failing endpoint delays no txid, and an event
it refuses is logged and dropped, never a reason to fail a commit. A runner killed
between a commit and its event leaves that event unsent.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

from transactional.errors import ConfigurationError
from transactional.lineage import Dataset
from transactional.runtime import messages as m
from transactional.runtime.probes import Probe
from transactional.types import BatchMetadata, TransactionAttempt, dump_meta

log = logging.getLogger("transactional.lineage")

#: Where the producer and its facets are described.
PRODUCER = "https://pypi.org/project/transactional-spark/"
#: Seconds ``close`` waits for the events still queued.
FLUSH_S = 10.0


def jsonable(value: Any) -> Any:
    """A txid's stored metadata (``BatchMetadata``, or a partitioned spout's
    ``{"meta", "partitions"}``) as JSON values."""
    if isinstance(value, BatchMetadata):
        return dump_meta(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


@functools.cache
def _facets() -> tuple[type, type]:
    """The two facets of this producer, made once OpenLineage is imported."""
    import attr
    from openlineage.client.generated.base import InputDatasetFacet, RunFacet

    @attr.define
    class TransactionalRunFacet(RunFacet):
        """The txid and attempt a run is."""

        topology: str
        txid: int
        attempt: str

        @staticmethod
        def _get_schema() -> str:
            return f"{PRODUCER}#TransactionalRunFacet"

    @attr.define
    class TransactionalPositionsInputDatasetFacet(InputDatasetFacet):
        """What the txid reads of the input: its stored metadata."""

        txid: int
        positions: Any

        @staticmethod
        def _get_schema() -> str:
            return f"{PRODUCER}#TransactionalPositionsInputDatasetFacet"

    return TransactionalRunFacet, TransactionalPositionsInputDatasetFacet


class Lineage(Probe):
    """The run events of topology ``topology_id``: its job named so, in
    ``$OPENLINEAGE_NAMESPACE`` (``default``); ``inputs`` and ``outputs`` the spout's and
    the committers' datasets; ``positions(txid)`` a txid's stored metadata."""

    def __init__(
        self,
        topology_id: str,
        inputs: Sequence[Dataset],
        outputs: Sequence[Dataset],
        positions: Callable[[int], Any],
    ) -> None:
        try:
            from openlineage.client import OpenLineageClient
        except ImportError:
            raise ConfigurationError(
                "RunnerConfig.lineage (--lineage): openlineage-python is not installed: "
                "pip install 'transactional-spark[lineage]'"
            ) from None
        self.topology_id = topology_id
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.positions = positions
        self.namespace = os.environ.get("OPENLINEAGE_NAMESPACE", "default")
        self.client = OpenLineageClient()
        self.producer = f"{PRODUCER}{version('transactional-spark')}"
        #: Each attempt started here: its run id and the txid's positions, read then (a
        #: commit group's advance forgets the metadata of all but its last txid).
        self._runs: dict[TransactionAttempt, tuple[str, Any]] = {}
        self._queue: queue.Queue[Any] = queue.Queue()
        self._sender = threading.Thread(target=self._send, name="lineage", daemon=True)
        self._sender.start()

    def on_event(self, event: m.Event, now: float) -> None:
        match event:
            case m.Started(attempt):
                self._start(attempt)
            case m.Failed(attempt=attempt, error=error):
                self._end(attempt, "FAIL", error)
            case m.Retracted(attempt):
                self._end(attempt, "ABORT")

    def on_command(self, command: m.Command, now: float) -> None:
        match command:
            case m.Acknowledge(attempt=attempt):
                self._end(attempt, "COMPLETE", always=True)
            case m.Skip(attempt=attempt, in_sink=True):
                self._end(attempt, "COMPLETE", always=True)
            case m.Skip(attempt=attempt) | m.Cancel(attempt=attempt):
                self._end(attempt, "ABORT")

    def close(self) -> None:
        """Send what is queued (for up to ``FLUSH_S``), then close the client."""
        self._queue.put(None)
        self._sender.join(FLUSH_S)
        if self._sender.is_alive():
            log.warning("lineage events left unsent after %.0f s", FLUSH_S)
            return
        try:
            self.client.close(FLUSH_S)
        except Exception as exc:
            log.warning("lineage client close error=%s: %s", type(exc).__name__, exc)

    def _start(self, attempt: TransactionAttempt) -> None:
        from openlineage.client.uuid import generate_new_uuid

        run = str(generate_new_uuid()), jsonable(self.positions(attempt.txid))
        self._runs[attempt] = run
        self._queue.put(self._event(attempt, run, "START"))

    def _end(
        self,
        attempt: TransactionAttempt,
        state: str,
        error: BaseException | None = None,
        *,
        always: bool = False,
    ) -> None:
        """The run of ``attempt`` ends in ``state``: only a run this runner started,
        unless ``always`` (a commit: its own run when it started before this runner)."""
        run = self._runs.pop(attempt, None)
        if run is None and not always:
            return
        if run is None:
            from openlineage.client.uuid import generate_new_uuid

            run = str(generate_new_uuid()), jsonable(self.positions(attempt.txid))
        self._queue.put(self._event(attempt, run, state, error))

    def _event(
        self,
        attempt: TransactionAttempt,
        run: tuple[str, Any],
        state: str,
        error: BaseException | None = None,
    ) -> Any:
        from openlineage.client.event_v2 import (
            InputDataset,
            Job,
            OutputDataset,
            Run,
            RunEvent,
            RunState,
        )
        from openlineage.client.facet_v2 import error_message_run

        run_facet, positions_facet = _facets()
        facets: dict[str, Any] = {
            "transactional": run_facet(
                topology=self.topology_id,
                txid=attempt.txid,
                attempt=attempt.attempt_id,
                producer=self.producer,
            )
        }
        if error is not None:
            facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=f"{type(error).__name__}: {error}",
                programmingLanguage="python",
                producer=self.producer,
            )
        run_id, positions = run
        inputs = [
            InputDataset(
                namespace,
                name,
                inputFacets={
                    "transactionalPositions": positions_facet(
                        txid=attempt.txid, positions=positions, producer=self.producer
                    )
                },
            )
            for namespace, name in self.inputs
        ]
        return RunEvent(
            eventType=RunState[state],
            eventTime=datetime.now(UTC).isoformat(),
            run=Run(runId=run_id, facets=facets),
            job=Job(namespace=self.namespace, name=self.topology_id),
            inputs=inputs,
            outputs=[OutputDataset(namespace, name) for namespace, name in self.outputs],
            producer=self.producer,
        )

    def _send(self) -> None:
        while (event := self._queue.get()) is not None:
            try:
                self.client.emit(event)
            except Exception as exc:  # lineage is reported, never a reason to stop a run
                log.warning(
                    "lineage event not sent state=%s error=%s: %s",
                    event.eventType.value,
                    type(exc).__name__,
                    exc,
                )
