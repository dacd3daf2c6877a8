"""Spark columns built once and reused by every txid.

Each ``F.col``, ``F.when`` or ``F.filter`` is a round trip to the JVM, so a bolt that
builds its expressions in ``process`` pays for them in every txid: 130 ms of the tweet
bolts' 460 ms of planning per txid on the demo machine (benchmarks/analysis.md). A
column is an unresolved expression, immutable and resolved against each plan it is
used in, so the same columns serve every batch; only a new Spark session (tests stop
and start them) needs new ones.

::

    class Tokens(Bolt):
        _columns = Prebuilt(lambda: [F.split("text", " ").alias("tokens")])

        def process(self, attempt, batch):
            return batch.select(*self._columns(batch))
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Prebuilt", "prebuilt"]

T = TypeVar("T")


class Prebuilt(Generic[T]):
    """What ``build`` returns (columns, or any structure of them), built at the first
    call and again only when the frame belongs to another Spark session's JVM."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._owner: object | None = None
        self._value: T | None = None

    def __call__(self, frame: DataFrame) -> T:
        owner = _owner(frame)
        with self._lock:
            if self._owner is not owner or self._value is None:
                self._value = self._build()
                self._owner = owner
            return self._value

    def __getstate__(self) -> dict[str, Any]:
        return {"_build": self._build}  # columns live in one JVM: never pickled

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_build"])  # type: ignore[misc]


#: Columns built for a key (``prebuilt``), most recently used last.
_BUILT: OrderedDict[Hashable, tuple[object, Any]] = OrderedDict()
_BUILT_LOCK = threading.Lock()
_BUILT_MAX = 256


def prebuilt(frame: DataFrame, key: Hashable, build: Callable[[], T]) -> T:
    """``Prebuilt`` for columns that depend on arguments: what ``build`` returns, kept
    under ``key`` (which must name everything ``build`` depends on) for the session of
    ``frame``; the 256 most recently used keys are kept."""
    owner = _owner(frame)
    with _BUILT_LOCK:
        found = _BUILT.get(key)
        if found is not None and found[0] is owner:
            _BUILT.move_to_end(key)
            return found[1]  # type: ignore[no-any-return]
        value = build()
        _BUILT[key] = (owner, value)
        _BUILT.move_to_end(key)
        while len(_BUILT) > _BUILT_MAX:
            _BUILT.popitem(last=False)
        return value


def _owner(frame: DataFrame) -> object:
    from transactional.spark.connect import is_connect

    session = frame.sparkSession
    if is_connect(session):
        return session  # one per Connect session
    return session.sparkContext._jsc  # one per running SparkContext
