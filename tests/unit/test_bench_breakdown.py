"""The breakdown's floor table (``benchmarks.breakdown.floor_table``): each case's median
and its ratio to the framework's txid, computed here from the samples."""

from __future__ import annotations

from benchmarks.breakdown import Breakdown, Floor, floor_table


def test_the_floor_table_gives_each_cases_median_and_its_ratio_to_a_txid() -> None:
    small = Breakdown("small", 10, 1, timings=[], gaps_s=[0.2, 0.16, 0.18])  # median 180 ms
    floor = [Floor("micro-batch", [0.09, 0.08, 0.10, 0.5]), Floor("job", [0.03])]
    lines = floor_table(small, floor)
    assert lines[2] == "| the framework: a txid, commit to commit | 3 | 180.0 | 1.00 |"
    assert lines[3] == "| micro-batch | 4 | 95.0 | 0.53 |"  # (90 + 100) / 2; 95 / 180
    assert lines[4] == "| job | 1 | 30.0 | 0.17 |"
    assert len(lines) == 5
