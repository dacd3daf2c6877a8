"""The value types a counter table stores, and which batch columns fit them exactly.

A counter sink stores the sum of a batch's increments per key. Silently storing it in a
narrower type (a double cast to LONG, a decimal rounded through a float) loses value
without a word, the worst failure a sink can have. So each ``CounterTable`` declares its
value type, the sinks store exactly that type, and a batch column that the declared type
cannot hold exactly is a ``ContractError`` on the first batch, before anything commits.

Declared types (``CounterTable.value_type``):

- ``"long"``: a 64-bit integer. Accepts byte/short/int/long columns, and
  ``decimal(p,0)`` with ``p <= 18``. A sum beyond the 64-bit range is an error naming
  the key, never a wrap.
- ``"double"``: an IEEE 754 binary64. Accepts float, double and byte/short/int columns
  (every such value is a double exactly; a long or a decimal is not, so they are
  refused). Sums are floating-point sums: each addition rounds to the nearest double.
  NaN and infinities are refused (as values or as sums that overflow).
- ``"decimal(p,s)"``: ``1 <= p <= 38``, ``0 <= s <= p``. Accepts integer columns whose
  every value fits ``p - s`` integer digits and ``decimal(q,t)`` with ``t <= s`` and
  ``q - t <= p - s``. Sums are exact; one that needs more than ``p - s`` integer digits
  is an error naming the key.
"""

from __future__ import annotations

import decimal
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

__all__ = ["LONG_BOUND", "ValueType", "exact_sum", "fsum", "parse_text", "value_text"]

#: A LONG holds -2**63 .. 2**63 - 1.
LONG_BOUND = 2**63

_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")

#: Decimal digits of the widest value of each Spark integer type.
INTEGER_DIGITS = {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 19}

#: Spark integer types every value of which is exactly a double (at most 32 bits).
_EXACT_IN_DOUBLE = frozenset({"tinyint", "smallint", "int"})


@dataclass(frozen=True, slots=True)
class ValueType:
    """A parsed ``CounterTable.value_type``: ``kind`` is ``long``, ``double`` or
    ``decimal`` (then with ``precision`` and ``scale``)."""

    kind: str
    precision: int = 0
    scale: int = 0

    @classmethod
    def parse(cls, text: str) -> ValueType:
        """``"long"``, ``"double"`` or ``"decimal(p,s)"`` (case and spaces ignored;
        ``"bigint"`` is read as ``"long"``). Raises ``ValueError`` saying what is wrong."""
        if not isinstance(text, str):
            raise ValueError(f"value_type must be a string, got {text!r}")
        norm = re.sub(r"\s+", "", text).lower()
        if norm in ("long", "bigint"):
            return cls("long")
        if norm == "double":
            return cls("double")
        match = _DECIMAL.match(norm)
        if match is None:
            raise ValueError(f"value_type {text!r} is not one of 'long', 'double', 'decimal(p,s)'")
        precision, scale = int(match.group(1)), int(match.group(2))
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise ValueError(
                f"value_type {text!r}: a decimal needs 1 <= precision <= 38 and "
                "0 <= scale <= precision (Spark's and Delta's limits)"
            )
        return cls("decimal", precision, scale)

    @property
    def name(self) -> str:
        """The canonical spelling, as ``CounterTable.value_type`` holds it."""
        if self.kind == "decimal":
            return f"decimal({self.precision},{self.scale})"
        return self.kind

    @property
    def sql(self) -> str:
        """Spark's ``simpleString`` of the type (``bigint``, ``double``, ``decimal(p,s)``)."""
        return "bigint" if self.kind == "long" else self.name

    def accepts(self, column: DataType) -> bool:
        """Whether every value of a column of Spark type ``column`` is exactly a value
        of this type (so a cast to it changes nothing)."""
        return self.accepts_sql(column.simpleString())

    def accepts_sql(self, source: str) -> bool:
        """``accepts`` on a Spark ``simpleString``."""
        decimal = _DECIMAL.match(source)
        if self.kind == "long":
            if source in INTEGER_DIGITS:
                return True
            return (
                decimal is not None and int(decimal.group(2)) == 0 and int(decimal.group(1)) <= 18
            )
        if self.kind == "double":
            return source in ("float", "double") or source in _EXACT_IN_DOUBLE
        integer_digits = self.precision - self.scale
        if source in INTEGER_DIGITS:
            return INTEGER_DIGITS[source] <= integer_digits
        if decimal is None:
            return False
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        return scale <= self.scale and precision - scale <= integer_digits

    @staticmethod
    def suggestion(source: str) -> str | None:
        """The ``value_type`` that stores a column of Spark type ``source`` exactly
        (None: no counter type does)."""
        if source in INTEGER_DIGITS:
            return "'long'"
        if source in ("float", "double"):
            return "'double'"
        decimal = _DECIMAL.match(source)
        if decimal is not None:
            return f"'decimal(38,{decimal.group(2)})' (room for sums)"
        return None


_SUM_CONTEXT = decimal.Context(
    prec=200,  # far beyond decimal(38,s) sums of any batch: additions are exact
    traps=[decimal.Inexact, decimal.Rounded, decimal.InvalidOperation, decimal.Overflow],
)


def exact_sum(values: list[Any], declared: ValueType) -> int | float | Decimal:
    """The sum of one key's (non-null) batch values in the declared type, computed on
    the driver: Python ints (no bound while summing), ``math.fsum`` (the correctly
    rounded sum of the doubles), or decimals with no rounding. Raises ``ValueError``
    saying why the sum cannot be stored (a 64-bit overflow, a NaN or infinite value or
    sum, a decimal needing more digits)."""
    if declared.kind == "long":
        total = sum(int(v) for v in values)
        if not -LONG_BOUND <= total < LONG_BOUND:
            raise ValueError(f"sums to {total}, beyond a 64-bit LONG")
        return total
    if declared.kind == "double":
        floats = [float(v) for v in values]
        odd = [v for v in floats if not math.isfinite(v)]
        if odd:
            raise ValueError(f"has the value {odd[0]!r}: NaN and infinities are not stored")
        try:
            result = math.fsum(floats)
        except OverflowError as exc:
            raise ValueError("sums beyond the largest double") from exc
        if not math.isfinite(result):
            raise ValueError("sums beyond the largest double")
        return result
    exact = Decimal(0)
    for v in values:
        exact = _SUM_CONTEXT.add(exact, Decimal(v))
    return fit_decimal(exact, declared)


def fsum(values: Any) -> float:
    """``math.fsum``, the correctly rounded sum, with a sum beyond the largest double
    (which ``math.fsum`` raises on) as an infinity, for the caller to refuse."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def fit_decimal(value: Decimal, declared: ValueType) -> Decimal:
    """``value`` with exactly ``declared.scale`` decimals, if it fits ``declared``."""
    try:
        fitted = value.quantize(Decimal(1).scaleb(-declared.scale), context=_SUM_CONTEXT)
    except decimal.DecimalException as exc:
        raise ValueError(f"{value} has more than {declared.scale} decimal(s)") from exc
    if len(fitted.as_tuple().digits) > declared.precision:
        raise ValueError(f"sums to {value}, beyond {declared.name}")
    return fitted.copy_abs() if fitted.is_zero() else fitted


def value_text(value: int | float | Decimal, declared: ValueType) -> str:
    """How the Redis script receives an increment: exact decimal text (shortest
    round-trip text for a double; plain digits with exactly ``scale`` decimals for a
    decimal, no exponent)."""
    if declared.kind == "long":
        return str(int(value))
    if declared.kind == "double":
        return repr(float(value))
    return format(fit_decimal(Decimal(value), declared), "f")


def parse_text(text: str, declared: ValueType) -> int | float | Decimal:
    """A value as the Redis script stores it, as Python's exact equivalent."""
    if declared.kind == "long":
        return int(text)
    if declared.kind == "double":
        return float(text)
    return Decimal(text)
