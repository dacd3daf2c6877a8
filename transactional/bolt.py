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

    @abstractmethod
    def process(self, attempt: TransactionAttempt, batch: DataFrame) -> Any:
        """Return one DataFrame (the single declared stream) or a mapping with exactly
        the declared stream names as keys."""

    def finish_batch(
        self, attempt: TransactionAttempt, outputs: Mapping[str, DataFrame]
    ) -> Mapping[str, DataFrame]:
        """Whole-batch step after ``process`` (e.g. an aggregation); identity by default."""
        return outputs
