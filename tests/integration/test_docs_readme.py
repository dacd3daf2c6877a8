"""The README's own topology runs as printed, from the directory a user would run it in:
CSV orders summed by shop into a Delta table, exactly once, the lines that are not
orders in the dead letters' table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.docs import run_example

pytestmark = pytest.mark.integration

ORDERS = {
    "2026-11-01.csv": ["shop,amount", "north,12", "south,5", "north,-2", "south,12.5"],
    "2026-11-02.csv": ["shop,amount", "west,7", "north,1,2", "north,30"],
}


def expected() -> tuple[Counter[str], list[str]]:
    """The totals and the bad lines, by reading the CSV text here: a line is an order
    when it has two fields and the second is an integer."""
    totals: Counter[str] = Counter()
    bad = []
    for lines in ORDERS.values():
        for line in lines[1:]:
            fields = line.split(",")
            if len(fields) == 2 and fields[1].lstrip("-").isdigit():
                totals[fields[0]] += int(fields[1])
            else:
                bad.append(line)
    return totals, bad


def test_the_readme_example_sums_every_order_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "orders").mkdir()
    for name, lines in ORDERS.items():
        (tmp_path / "orders" / name).write_text("\n".join(lines) + "\n")
    run_example("README.md")

    totals, bad = expected()
    rows = DeltaTable(str(tmp_path / "tables" / "totals")).to_pyarrow_table().to_pylist()
    assert {r["shop"]: r["count"] for r in rows} == totals and len(rows) == len(totals)
    letters = DeltaTable(str(tmp_path / "tables" / "dead_letters")).to_pyarrow_table().to_pylist()
    assert sorted(r["raw"] for r in letters) == sorted(bad)
