"""What the counter committers share: the checks that make a wiring mistake fail on the
first batch instead of corrupting a sink, reading states back by key, and the per-key
aggregation of a batch in its declared value type (the table spec is
``committers.tables``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from committers._sums import COUNT_COLUMN, batch_sums
from committers.keys import key_text, supported, why_unsupported
from committers.tables import ORDERABLE, CounterTable, Number
from committers.values import exact_sum
from transactional.committer import Committer, CommitterContext
from transactional.contracts import component
from transactional.errors import CommitError, ConfigurationError, ContractError
from transactional.types import CommitMode, TransactionAttempt

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from committers.states import StateReader


class CounterCommitter(Committer):
    """Base of the committers that add counter increments and append dead letters.

    ``counters`` maps an input name (as wired with ``TopologyBuilder.set_committer``) to
    the table it feeds; ``dead_letters`` names the input carrying ``(raw, reason)`` rows.
    Each sink object (hash, table, list) must be written by one committer only: opaque
    mode undoes a txid by restoring what the sink held before it, which would also wipe
    another writer's changes made since.
    """

    #: ``"redis"`` or ``"delta"``: which key types the sink supports (``committers.keys``).
    sink: ClassVar[str]

    def __init__(
        self,
        counters: Mapping[str, CounterTable],
        dead_letters: str | None = None,
        mode: CommitMode = CommitMode.TRANSACTIONAL,
    ) -> None:
        mode = CommitMode(mode)
        # The ABC declares ``mode`` as a class-level default so that simple committers
        # need not set it; these committers support both modes, chosen per instance.
        self.mode = mode  # type: ignore[misc]
        self.counters: dict[str, CounterTable] = dict(counters)
        self.dead_letters = dead_letters
        names = [table.name for table in self.counters.values()]
        if len(set(names)) != len(names):
            raise ConfigurationError(
                f"two counter inputs feed the same table ({sorted(names)}): union the "
                "streams upstream or give the tables distinct names"
            )
        if dead_letters is not None and dead_letters in self.counters:
            raise ConfigurationError(
                f"input {dead_letters!r} is configured both as counters and as dead letters"
            )
        if not self.counters and dead_letters is None:
            raise ConfigurationError(
                "a committer with no counters and no dead letters writes nothing"
            )
        self.context: CommitterContext | None = None
        for table in self.counters.values():
            for column, sql in table.key_types.items():
                if not supported(sql, self.sink):
                    raise ConfigurationError(
                        f"{type(self).__name__}: counter table {table.name!r} declares key "
                        f"column {column!r} as {sql}, which {self.sink} cannot key on: "
                        f"{why_unsupported(sql)}"
                    )

    def input_names(self) -> frozenset[str]:
        """The counter inputs and the dead-letter input: ``TopologyBuilder.build()``
        refuses a wiring with other names, before anything runs."""
        names = set(self.counters)
        if self.dead_letters is not None:
            names.add(self.dead_letters)
        return frozenset(names)

    @staticmethod
    def check_prepared(attempts: Sequence[TransactionAttempt], prepared: Sequence[Any]) -> None:
        """Refuse to commit a prepared batch of another txid (a group's member may have
        none): a stale prepare result must never reach a sink."""
        for attempt, batch in zip(attempts, prepared, strict=True):
            if batch is not None and batch.txid != attempt.txid:
                raise CommitError(
                    f"prepared batch is for txid {batch.txid}, commit was asked for txid "
                    f"{attempt.txid}: a stale prepare result reached commit"
                )

    def who(self) -> str:
        """``committer 'counts' (committers.redis.RedisCommitter)``, for messages."""
        name = "?" if self.context is None else self.context.name
        return component("committer", name, self)

    def _context(self) -> CommitterContext:
        if self.context is None:
            raise ConfigurationError(
                f"{type(self).__name__} used before open(): the runner must open committers first"
            )
        return self.context

    def check_inputs(self, inputs: Mapping[str, DataFrame]) -> None:
        """Refuse a batch the sink cannot store exactly, before anything is committed:
        a missing stream would silently commit nothing for it, an unknown one would be
        silently dropped, a value column wider than the declared type would be narrowed,
        a key type the sink cannot tell apart would merge keys. Reads only schemas (no
        Spark job), so it runs on every batch; it fails on the first.

        The input names are also checked by ``TopologyBuilder.build()``
        (``input_names``); this is the safety net for a committer driven directly."""
        expected = self.input_names()
        if set(inputs) != expected:
            raise ContractError(
                f"{self.who()} expects inputs {sorted(expected)} but was given "
                f"{sorted(inputs)}: make set_committer(inputs=...) use the names passed "
                "as counters= and dead_letters="
            )
        for input_name, table in self.counters.items():
            schema = {f.name: f.dataType.simpleString() for f in inputs[input_name].schema}
            missing = [c for c in table.inputs if c not in schema]
            if missing:
                raise ContractError(
                    f"{self.who()}: input {input_name!r} for counter table {table.name!r} "
                    f"lacks column(s) {missing}; it has {sorted(schema)}"
                )
            if table.value is not None:
                self._check_value(input_name, table, schema[table.value])
            if table.order_by is not None and not ORDERABLE.match(schema[table.order_by]):
                raise ContractError(
                    f"{self.who()}: input {input_name!r} order_by column {table.order_by!r} "
                    f"is {schema[table.order_by]}, which does not order rows: use a number, "
                    "a string, a date or a timestamp"
                )
            for key in table.keys:
                problem = self.key_problem(table, key, schema[key])
                if problem is not None:
                    raise ContractError(
                        f"{self.who()}: input {input_name!r} key column {key!r} is "
                        f"{schema[key]}: {problem}; nothing was committed"
                    )
        if self.dead_letters is not None:
            columns = set(inputs[self.dead_letters].columns)
            if not {"raw", "reason"} <= columns:
                raise ContractError(
                    f"{self.who()}: dead-letter input {self.dead_letters!r} must have columns "
                    f"'raw' and 'reason'; it has {sorted(columns)}"
                )

    def _check_value(self, input_name: str, table: CounterTable, given: str) -> None:
        if table.aggregate == "count":
            return  # counted, whatever its type
        declared = table.declared
        if declared.accepts_sql(given):
            return
        fits = declared.suggestion(given)
        fix = (
            f"Set CounterTable(..., value_type=...) to {fits} for a new table, or "
            "cast the column in the bolt to a type the table holds exactly"
            if fits
            else "Cast the column in the bolt to an integer, double or decimal type"
        )
        raise ContractError(
            f"{self.who()}: input {input_name!r} column {table.value!r} is {given}, "
            f"which counter table {table.name!r} (value_type={table.value_type!r}) "
            f"cannot store exactly; nothing was committed. {fix}"
        )

    def prepare(self, attempt: TransactionAttempt, inputs: Mapping[str, DataFrame]) -> Any:
        """``collect_plan``'s frames collected (``transactional.spark.engine.collect_arrow``), then
        ``prepare_collected``: what the runner does, for a caller that drives the
        committer itself."""
        from transactional.spark.engine import collect_arrow

        plan = self.collect_plan(attempt, inputs)
        return self.prepare_collected(attempt, inputs, collect_arrow(plan))

    def state_names(self) -> list[str]:
        return [table.name for table in self.counters.values()]

    def state(self, name: str) -> StateReader:
        """The aggregate state ``name`` (a table's name), to read by key:
        ``committer.state("tags").get(["#a", "#b"])``. Needs no ``open``."""
        from committers.states import StateReader

        for table in self.counters.values():
            if table.name == name:
                return StateReader(table, partial(self.lookup, table))
        names = sorted(t.name for t in self.counters.values())
        raise ConfigurationError(f"{type(self).__name__} keeps no table {name!r}; it keeps {names}")

    def lookup(self, table: CounterTable, keys: list[tuple[Any, ...]]) -> list[Any]:
        """The values ``table`` holds for ``keys`` (None: nothing), in their order."""
        raise NotImplementedError(f"{type(self).__name__} cannot read its states by key")

    def key_problem(self, table: CounterTable, column: str, sql: str) -> str | None:
        """Why a batch key column of Spark type ``sql`` cannot key ``table`` (None: it
        can). Default: the sink's supported key types."""
        if supported(sql, self.sink):
            return None
        return f"{self.sink} cannot key on it ({why_unsupported(sql)})"


#: A row's number in ``combined_values``.
_ROW = "__transactional_row"

#: Working columns of the batch sums (``inc`` is reserved; no key is named like these).
BAD_COLUMN, VALUES_COLUMN = "__transactional_bad", "__transactional_values"


def key_sums(frame: DataFrame, table: CounterTable) -> DataFrame:
    """The batch ``frame`` summed per key by Spark, to collect: ``(keys..., inc, bad,
    count)`` for an exact type (``try_sum`` in the declared type; ``bad``: the sum does
    not fit), ``(keys..., values)`` for a double (its values, which
    ``committers.redis._fields`` adds exactly, as ``math.fsum``)."""
    from pyspark.sql import functions as F

    if table.aggregate == "sum" and table.declared.kind == "double":
        assert table.value is not None  # a sum has one
        value = F.col(table.value).cast("double")
        return frame.groupBy(*table.keys).agg(F.collect_list(value).alias(VALUES_COLUMN))
    own = {f.name: f.dataType.simpleString() for f in frame.schema}
    sums, bad = batch_sums(frame, table, own)
    return sums.select(*table.keys, "inc", bad.alias(BAD_COLUMN), COUNT_COLUMN)


def per_key_sums(
    frame: DataFrame, table: CounterTable
) -> tuple[dict[tuple[str | None, ...], Number], list[str]]:
    """The batch ``frame`` (``table``'s keys and value) brought to the driver and summed
    per key, exactly, in the declared value type (``committers.values.exact_sum``); keys
    are the key columns' texts (None: null) and null values count as nothing. Also the
    keys whose sum cannot be stored, each with why (an empty list: all can)."""
    assert table.value is not None  # only sums are summed here
    frame = frame.select(*table.keys, table.value)
    types = {f.name: f.dataType.simpleString() for f in frame.schema}
    arrow = frame.toArrow()
    texts = [key_text(types[k]) for k in table.keys]
    columns = [arrow.column(k).to_pylist() for k in table.keys]
    grouped: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for row, value in enumerate(arrow.column(table.value).to_pylist()):
        if value is not None:
            grouped[tuple(col[row] for col in columns)].append(value)
    sums: dict[tuple[str | None, ...], Number] = {}
    refused: list[str] = []
    for raw_key, values in grouped.items():
        key = tuple(text(v) for text, v in zip(texts, raw_key, strict=True))
        try:
            sums[key] = exact_sum(values, table.declared)
        except ValueError as exc:
            refused.append(f"{dict(zip(table.keys, key, strict=True))} {exc}")
    return sums, refused


def combined_values(data: pa.Table, keys: Sequence[str], column: str, how: str) -> pa.Table:
    """``data``'s rows combined per key as ``min``, ``max`` or ``last`` (the key's last
    row: ``data`` is in txid order): ``(keys..., column)``, one row per key."""
    import pyarrow as pa

    keys = list(keys)
    if how in ("min", "max"):
        grouped = data.group_by(keys, use_threads=False).aggregate([(column, how)])
        return grouped.select(keys).append_column(column, grouped.column(f"{column}_{how}"))
    # Arrow's hash "last" has no decimal kernel: the greatest row number per key instead.
    numbered = data.select([*keys, column]).append_column(
        _ROW, pa.array(range(data.num_rows), pa.int64())
    )
    grouped = numbered.group_by(keys, use_threads=False).aggregate([(_ROW, "max")])
    return data.select([*keys, column]).take(grouped.column(f"{_ROW}_max"))
