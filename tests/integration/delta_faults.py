"""A Delta commit made to fail inside one table's write, on either commit path."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def broken(source: Any) -> Any:
    """Per-key sums that fail their table's write, on either path."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    if isinstance(source, DataFrame):
        return source.withColumn("inc", F.raise_error(F.lit("injected")).cast("long"))
    return source.set_column(
        source.schema.get_field_index("inc"), "inc", pa.array(["injected"] * source.num_rows)
    )
