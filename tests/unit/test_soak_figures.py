"""The soak's judge (``tests/soak.py``), on figures made up here: a leak of a fixed
amount per txid is not flat, noise around a level is; the live heap is judged from the
first full collection the JVM's log reports, and not at all from fewer than three
samples; the log is read as it grows, a line still being written left for later."""

from __future__ import annotations

from pathlib import Path

from tests.soak import LIMITS, GcLog, Sample, figures


def _samples(heap: list[float | None], jvm: list[float]) -> list[Sample]:
    return [
        Sample(float(i), 100 * i, 200.0, jvm[i], 400 + i % 3, 440, 418, heap[i])
        for i in range(len(jvm))
    ]


def test_a_leak_per_txid_is_not_flat_and_noise_is() -> None:
    leak = [1500.0 + 0.05 * 100 * i for i in range(100)]  # 50 MiB per 1,000 txids
    noise = [1500.0 + (7 if i % 2 else -7) for i in range(100)]
    heaps: list[float | None] = [150.0] * 100
    by_name = {f.name: f for f in figures(_samples(heaps, leak), 1000, 9900)}
    leaked = by_name["jvm_rss_mib"]
    assert round(leaked.slope) == 50 and round(leaked.growth) == round(50 * 8.9)
    assert leaked.allowed == max(LIMITS["jvm_rss_mib"][0], 0.1 * leak[10])
    assert not leaked.flat
    assert by_name["threads"].flat and by_name["jvm_heap_mib"].flat
    assert {f.name: f.flat for f in figures(_samples(heaps, noise), 1000, 9900)}["jvm_rss_mib"]


def test_the_live_heap_is_judged_from_the_first_full_collection() -> None:
    jvm = [1500.0] * 30
    late: list[float | None] = [None] * 20 + [150.0 + 20 * i for i in range(10)]
    heap = {f.name: f for f in figures(_samples(late, jvm), 0, 2900)}["jvm_heap_mib"]
    assert (heap.first, heap.last) == (150.0, 330.0) and not heap.flat
    too_few: list[float | None] = [None] * 28 + [150.0, 900.0]
    assert "jvm_heap_mib" not in {f.name for f in figures(_samples(too_few, jvm), 0, 2900)}


def test_the_gc_log_is_read_as_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "gc.log"
    log = GcLog(path)
    assert log.read() is None  # no log yet
    path.write_text(
        "[0.5s][info][gc] GC(0) Pause Young (Allocation Failure) 256M->20M(981M) 9.1ms\n"
        "[9.0s][info][gc] GC(7) Pause Full (Ergonomics) 700M->151M(981M) 180.2ms\n"
        "[9.9s][info][gc] GC(8) Pause Full (Ergonomics) 690M->1"  # still being written
    )
    assert (log.read(), log.full_collections) == (151.0, 1)
    with path.open("a") as f:
        f.write("62M(981M) 170.0ms\n[10s][info][gc] GC(9) Pause Young (Allocation Failure) ...\n")
    assert (log.read(), log.full_collections) == (162.0, 2)
