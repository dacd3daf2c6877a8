"""How the records of a txid get their ledger ids, in the job that reads the batch
(``engine.SparkEngine.materialise``): from the spout's position columns, else from the
txid and each row's place in the emitted frames (docs/concepts/ledger.md, "Ids")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from transactional.errors import ContractError
from transactional.ledger import ID

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass(frozen=True)
class RecordIds:
    """How the records of one txid get their ids (``Engine.materialise``)."""

    txid: int
    #: The spout's ``position_columns`` (empty: the row's place in the emitted frames).
    position: tuple[str, ...] = ()
    #: Names the spout in an error.
    spout: str = "spout"


def id_column(ids: RecordIds) -> Column:
    """The ``ID`` of each record: ``xxhash64`` of its position columns, or of the txid
    and the row's place in the emitted frames."""
    from pyspark.sql import functions as F

    if ids.position:
        return F.xxhash64(*[F.col(f"`{c}`") for c in ids.position]).alias(ID)
    return F.xxhash64(F.lit(ids.txid).cast("long"), F.monotonically_increasing_id()).alias(ID)


def check_positions(ids: RecordIds, columns: Sequence[str]) -> None:
    missing = [c for c in ids.position if c not in columns]
    if missing:
        raise ContractError(
            f"{ids.spout} declares position_columns {list(ids.position)}, but its batch "
            f"has no column(s) {missing} (it has {list(columns)}): keep them in the "
            "emitted frame, or leave position_columns empty"
        )


def id_sums() -> list[Column]:
    """The batch's tally, as observed metrics ``ledger_n`` and ``ledger_x``."""
    from pyspark.sql import functions as F

    return [F.count(F.col(ID)).alias("ledger_n"), F.bit_xor(F.col(ID)).alias("ledger_x")]
