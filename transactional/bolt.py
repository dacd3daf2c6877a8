"""Bolts: DataFrame transforms of one batch, with named output streams."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from transactional.types import TransactionAttempt

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DEFAULT_STREAM = "default"


class Bolt(ABC):
    """Transforms the batch of one attempt.

    The runner guarantees that ``process`` sees the whole batch of one attempt as one
    DataFrame, already materialised (a non-deterministic source is read once), and
    that ``finish_batch`` runs after it for the same attempt. Both may be called from
    several threads at once for different txids, so keep no per-batch state on
    ``self``. A bolt must not write anywhere: side effects belong in committers.
    """

    #: The streams ``process``/``finish_batch`` produce. Committers and other bolts
    #: subscribe to ``"<bolt name>:<stream>"``, or to ``"<bolt name>"`` for the default.
    outputs: ClassVar[tuple[str, ...]] = (DEFAULT_STREAM,)

    #: The bolt accounts for every record it is given (``transactional.ledger``): each
    #: goes on in an output that keeps its ``ledger.ID`` (a row-wise transform, a
    #: dead-letter stream), is folded into an aggregate (``agg(..., *ledger.folded())``)
    #: or is dropped on purpose (``ledger.drop_where``, ``ledger.drop``). Its input then holds
    #: ``ledger.ID``, and the runner checks, before each commit, that no record was lost
    #: or duplicated. False (the default): the bolt runs as it always did, unchecked,
    #: and never sees the ledger's columns.
    accounts: ClassVar[bool] = False
    #: With ``accounts``: groups of output streams among which each input record is
    #: accounted for exactly once. None: one group of all ``outputs`` (a record goes to
    #: exactly one stream, as a parse bolt's records go to its tweets or its dead
    #: letters). A bolt that sends each record to several streams lists one group per
    #: stream, e.g. ``(("hashtags",), ("users",))``.
    routes: ClassVar[tuple[tuple[str, ...], ...] | None] = None
    #: ``process`` and ``finish_batch`` build the same plan for every batch of one
    #: schema: they use neither ``attempt`` nor anything else that changes between txids
    #: (the time, a random number, a table re-read on the driver). The runner may then
    #: call them once and run their plan again over each later batch, as Structured
    #: Streaming re-plans one query per micro-batch, instead of building it through
    #: py4j every txid (about 50 ms less a small txid: "Plans built once" in
    #: docs/concepts/topologies.md). Only when every bolt and committer of the topology
    #: says so, on a classic session; the ledger checks every txid either way.
    plan_once: ClassVar[bool] = False

    @abstractmethod
    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> Any:
        """Return one DataFrame (the single declared stream) or a mapping with exactly
        the declared stream names as keys."""

    def finish_batch(
        self, attempt: TransactionAttempt, outputs: Mapping[str, DataFrame]
    ) -> Mapping[str, DataFrame]:
        """Whole-batch step after ``process`` (e.g. an aggregation); identity by default."""
        return outputs


def route_problem(bolt: Any) -> str | None:
    """Why an accounting bolt's ``routes`` are not a partition of its outputs."""
    outputs = list(bolt.outputs)
    routes = getattr(bolt, "routes", None)
    if routes is None:
        return None
    if isinstance(routes, str) or not all(
        isinstance(r, tuple) and r and all(isinstance(s, str) for s in r) for r in routes
    ):
        return f"routes must be a tuple of non-empty tuples of stream names, got {routes!r}"
    named = [s for r in routes for s in r]
    if sorted(named) != sorted(outputs):
        return (
            f"routes {list(routes)} must name each of its outputs {outputs} exactly once "
            "(each route: streams among which a record is accounted once)"
        )
    return None
