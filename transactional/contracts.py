"""What each component must hand back to the runner, checked on the first occurrence.

A spout, bolt or committer that returns the wrong thing (``None``, a pandas frame, a
bare DataFrame where a pair is due, a stream it never declared) does so on every
attempt: retrying it would only delay the same failure ``max_attempts`` times. So each
breach is a ``ContractError`` (a ``ConfigurationError``: the runner stops at once, the
command exits 2) whose message names the component as the topology knows it and its
class, what it returned, and what it must return.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from transactional.errors import ContractError
from transactional.spout import PARTITION_COLUMN
from transactional.types import BatchMetadata, CommitOutcome, dump_meta

#: What the runner calls "a DataFrame", for messages.
FRAME = "a pyspark.sql.DataFrame of the runner's session"


def qualified(obj: object) -> str:
    """``pandas.core.frame.DataFrame``, not ``DataFrame``: two classes of one name must
    not read alike in an error."""
    if obj is None:
        return "None"
    cls = obj if isinstance(obj, type) else type(obj)
    module = public_module(cls)
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def public_module(cls: type) -> str:
    """Where ``cls`` is imported from: the package of the private module that defines
    it, when the package exports it (``committers.redis``, not
    ``committers.redis._committer``)."""
    parts = cls.__module__.split(".")
    while len(parts) > 1 and parts[-1].startswith("_"):
        package = sys.modules.get(".".join(parts[:-1]))
        if getattr(package, cls.__name__, None) is not cls:
            break
        parts.pop()
    return ".".join(parts)


def component(role: str, name: str, obj: object) -> str:
    """``bolt 'count' (mypkg.bolts.CountWords)``."""
    return f"{role} {name!r} ({qualified(obj)})"


def frame_problem(value: object, is_frame: Callable[[object], bool]) -> str | None:
    """Why ``value`` is not a frame the runner can use; None if it is."""
    if is_frame(value):
        return None
    module = type(value).__module__
    if module.startswith("pyspark.sql.connect"):
        return (
            f"a Spark Connect DataFrame ({qualified(value)}) on a classic session; the "
            f"runner needs {FRAME}: build it with the SparkSession the runner gives at open"
        )
    if module.startswith("pyspark.sql"):
        return (
            f"a classic DataFrame ({qualified(value)}) on a Spark Connect session; the "
            f"runner needs {FRAME}: build it with the SparkSession the runner gives at open"
        )
    if module.startswith("pandas") or module.startswith("pyarrow") or module.startswith("polars"):
        return (
            f"{qualified(value)}, not {FRAME}: convert it with "
            "spark.createDataFrame(...) on the SparkSession the runner gives at open"
        )
    return f"{qualified(value)}, not {FRAME}"


def check_frame(
    value: object, is_frame: Callable[[object], bool], who: str, method: str, txid: int
) -> Any:
    problem = frame_problem(value, is_frame)
    if problem is not None:
        raise ContractError(f"{who}.{method} returned {problem} (txid {txid})")
    return value


def check_tagged_frame(
    value: object, is_frame: Callable[[object], bool], who: str, method: str, txid: int
) -> Any:
    """``check_frame``, and a Spark frame must have the partition column."""
    check_frame(value, is_frame, who, method, txid)
    columns = getattr(value, "columns", None)
    if columns is not None and PARTITION_COLUMN not in columns:
        raise ContractError(
            f"{who}.{method} returned a frame without the column {PARTITION_COLUMN!r} "
            f"(txid {txid}): tag each row with its partition number "
            "(transactional.spout.PARTITION_COLUMN), or return None to emit per partition"
        )
    return value


def check_opaque_pair(
    value: object,
    metadata_type: type[BatchMetadata],
    is_frame: Callable[[object], bool],
    who: str,
    txid: int,
    partition: int,
) -> tuple[BatchMetadata, Any]:
    """``emit_partition_batch`` of an opaque spout returns ``(metadata, DataFrame)``."""
    must = (
        f"it must return a pair (metadata, DataFrame): ({metadata_type.__name__}(...), "
        "the partition's batch)"
    )
    if not isinstance(value, tuple) or len(value) != 2:
        shape = f"a tuple of {len(value)}" if isinstance(value, tuple) else f"{qualified(value)}"
        raise ContractError(
            f"{who}.emit_partition_batch returned {shape} for txid {txid} partition "
            f"{partition}; {must}"
        )
    meta, frame = value
    if not isinstance(meta, metadata_type):
        raise ContractError(
            f"{who}.emit_partition_batch returned ({qualified(meta)}, ...) for txid {txid} "
            f"partition {partition}; {must}"
        )
    problem = frame_problem(frame, is_frame)
    if problem is not None:
        raise ContractError(
            f"{who}.emit_partition_batch returned (metadata, {problem}) for txid {txid} "
            f"partition {partition}; {must}"
        )
    return meta, frame


def bolt_streams(
    value: object,
    outputs: tuple[str, ...],
    is_frame: Callable[[object], bool],
    who: str,
    method: str,
    txid: int,
) -> dict[str, Any]:
    """The streams a bolt's ``process``/``finish_batch`` returned, as a mapping with
    exactly its declared names, each a frame."""
    must = (
        f"it must return a DataFrame (only when it declares one stream) or a mapping "
        f"with exactly its declared streams {list(outputs)}, each {FRAME}"
    )
    if isinstance(value, Mapping):
        streams = dict(value)
    elif len(outputs) == 1 and value is not None:
        streams = {outputs[0]: value}
    else:
        raise ContractError(f"{who}.{method} returned {qualified(value)} (txid {txid}); {must}")
    if set(streams) != set(outputs):
        missing = sorted(set(outputs) - set(streams))
        extra = sorted(set(streams) - set(outputs), key=str)
        raise ContractError(
            f"{who}.{method} returned streams {sorted(streams, key=str)} (txid {txid}): "
            f"missing {missing}, undeclared {extra}; {must}. Declare extra streams in the "
            "bolt's `outputs`"
        )
    for stream, frame in streams.items():
        problem = frame_problem(frame, is_frame)
        if problem is not None:
            raise ContractError(
                f"{who}.{method} returned {problem} as stream {stream!r} (txid {txid}); {must}"
            )
    return streams


def collect_plan(
    value: object, is_frame: Callable[[object], bool], who: str, txid: int
) -> dict[str, Any]:
    """A committer's ``collect_plan``: a mapping of names (strings) to frames."""
    must = f"it must return a mapping of names to frames, each {FRAME} (empty: collect nothing)"
    if not isinstance(value, Mapping):
        raise ContractError(f"{who}.collect_plan returned {qualified(value)} (txid {txid}); {must}")
    for name, frame in value.items():
        problem = frame_problem(frame, is_frame)
        if not isinstance(name, str) or problem is not None:
            what = problem or qualified(frame)
            raise ContractError(
                f"{who}.collect_plan returned {what} under {name!r} (txid {txid}); {must}"
            )
    return dict(value)


def check_partition_count(value: object, who: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ContractError(
            f"{who}.num_partitions returned {value!r} ({qualified(value)}); it must return "
            "a non-negative int"
        )
    return value


def check_ready(value: object, who: str, txid: int) -> bool:
    if type(value).__name__ == "bool_":  # numpy's, from a computed condition
        return bool(value)
    if not isinstance(value, bool):
        raise ContractError(
            f"{who}.is_ready returned {value!r} ({qualified(value)}) for txid {txid}; it must "
            "return True or False"
        )
    return value


def check_outcome(value: object, who: str, txid: int) -> CommitOutcome:
    if not isinstance(value, CommitOutcome):
        raise ContractError(
            f"{who}.commit returned {value!r} ({qualified(value)}) for txid {txid}; it must "
            "return a CommitOutcome (APPLIED, SKIPPED or REAPPLIED). The sink may hold the "
            "txid already: fix the committer, then start again (it resumes at this txid)"
        )
    return value


def check_metadata(meta: object, expected: type[BatchMetadata], who: str, method: str) -> None:
    """Refuse metadata the store cannot hold *before* anything is stored: a replay
    rebuilds the batch from the stored JSON alone, so it must load back unchanged."""
    if not isinstance(meta, expected):
        raise ContractError(
            f"{who}.{method} returned {qualified(meta)}; it must return its metadata_type "
            f"{expected.__name__}"
        )
    problem = _json_problem(meta)
    if problem is not None:
        raise ContractError(
            f"{who}.{method} returned {expected.__name__} metadata that JSON cannot hold: "
            f"{problem}. Metadata must be plain JSON values (no NaN or infinity, no bytes): "
            f"change that field's type or value in {expected.__name__}"
        )


def _json_problem(meta: BatchMetadata) -> str | None:
    """What keeps ``meta`` from a faithful JSON round trip, naming the field; None if
    nothing does. One round trip on the way of every new txid; the field-by-field search
    runs only when it failed, to name the culprit."""
    try:
        text = json.dumps(dump_meta(meta), allow_nan=False)
    except (TypeError, ValueError) as exc:  # NaN, bytes that are not UTF-8, ...
        for name in type(meta).model_fields:
            try:
                json.dumps(meta.model_dump(mode="json", include={name}), allow_nan=False)
            except (TypeError, ValueError) as field_exc:
                return f"field {name!r} = {_brief(getattr(meta, name))} ({field_exc})"
        return f"it cannot be written as JSON {_brief(meta)} ({exc})"
    try:
        again = type(meta).model_validate(json.loads(text))
    except (TypeError, ValueError) as exc:
        return f"it does not load back from its JSON {_brief(meta)} ({exc})"
    changed = [n for n in type(meta).model_fields if getattr(again, n) != getattr(meta, n)]
    if changed:
        return f"field(s) {changed} load back from JSON as different values"
    return None


def _brief(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
