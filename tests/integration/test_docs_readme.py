"""The README's own topology runs as printed, from the directory a user would run it in:
CSV orders summed by shop into a Delta table, exactly once, the lines that are not
orders in the dead letters' table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.docs import run_example
from tests.reference import expected_orders, write_orders

pytestmark = pytest.mark.integration


def test_the_readme_example_sums_every_order_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_orders(tmp_path / "orders")
    run_example("README.md")

    totals, bad = expected_orders()
    rows = DeltaTable(str(tmp_path / "tables" / "totals")).to_pyarrow_table().to_pylist()
    assert {r["shop"]: r["count"] for r in rows} == totals and len(rows) == len(totals)
    letters = DeltaTable(str(tmp_path / "tables" / "dead_letters")).to_pyarrow_table().to_pylist()
    assert sorted(r["raw"] for r in letters) == sorted(bad)
