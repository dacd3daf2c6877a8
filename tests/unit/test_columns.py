"""``transactional.spark.columns``: columns built once per Spark context, rebuilt for a new
one (the cache logic only; the tweet bolts' tests run the columns on Spark)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace
from typing import Any

from transactional.spark import columns
from transactional.spark.columns import Prebuilt, prebuilt


def frame_of(context: object) -> Any:
    """A stand-in for a DataFrame: what the cache reads of it."""
    return SimpleNamespace(sparkSession=SimpleNamespace(sparkContext=SimpleNamespace(_jsc=context)))


class Builds:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> list[int]:
        self.calls += 1
        return [self.calls]


def test_built_once_per_context_and_again_for_a_new_one() -> None:
    build = Builds()
    cached = Prebuilt(build)
    first, second = object(), object()
    assert cached(frame_of(first)) == [1]
    assert cached(frame_of(first)) == [1]
    assert build.calls == 1
    assert cached(frame_of(second)) == [2]  # a new SparkContext: new JVM objects
    assert cached(frame_of(first)) == [3]  # the old one's columns were not kept
    assert build.calls == 3


def test_a_pickled_prebuilt_carries_no_columns() -> None:
    cached = Prebuilt(list)
    context = object()
    cached(frame_of(context))
    copy = pickle.loads(pickle.dumps(cached))
    assert copy._value is None and copy._owner is None


def test_keyed_columns_are_kept_per_key_and_context_up_to_the_bound(monkeypatch: Any) -> None:
    monkeypatch.setattr(columns, "_BUILT", type(columns._BUILT)())
    monkeypatch.setattr(columns, "_BUILT_MAX", 3)
    context = object()
    build = Builds()
    assert prebuilt(frame_of(context), "a", build) == [1]
    assert prebuilt(frame_of(context), "a", build) == [1]
    assert prebuilt(frame_of(context), "b", build) == [2]
    assert prebuilt(frame_of(object()), "b", build) == [3]  # another context
    prebuilt(frame_of(context), "c", build)  # 4
    prebuilt(frame_of(context), "a", build)  # still kept: used most recently but one
    prebuilt(frame_of(context), "d", build)  # 5: "b" is the least recently used
    assert list(columns._BUILT) == ["c", "a", "d"]
    assert build.calls == 5
