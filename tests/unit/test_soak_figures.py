"""The soak's judge (``tests/soak.py``), on figures made up here: a leak of a fixed
amount per txid is not flat, noise around a level is; the live heap is judged from the
first full collection the JVM's log reports, and not at all from fewer than three
samples; the log is read as it grows, a line still being written left for later."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak import LIMITS, Figure, GcLog, Sample, delta_rs_threads, figures


def _samples(heap: list[float | None], jvm: list[float]) -> list[Sample]:
    return [
        Sample(float(i), 100 * i, 200.0, jvm[i], 400 + i % 3, 90, 440, 418, heap[i])
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


#: ``(txid, threads)`` sampled past the warm-up of a quick soak (200 txids) that ran beside
#: the cluster suite: Spark's pools stepped up at txid 172 and held there to the end.
SEEN_STEP = [
    (124, 399), (129, 396), (133, 397), (136, 404), (142, 399), (146, 395), (149, 399),
    (154, 400), (158, 398), (162, 396), (168, 400), (172, 406), (176, 417), (181, 412),
    (186, 412), (191, 415), (195, 407),
]  # fmt: skip


def test_a_step_of_the_thread_pools_is_flat_and_a_thread_a_txid_is_not() -> None:
    def threads(series: list[tuple[int, int]]) -> Figure:
        samples = [Sample(float(t), t, 270.0, 1530.0, n, 71, 440, 410, 160.0) for t, n in series]
        return {f.name: f for f in figures(samples, 120, 200)}["threads"]

    step = threads(SEEN_STEP)
    assert round(step.growth) == 20 and step.flat  # past the 16 it had before
    leak = threads([(t, 400 + t - 124) for t, _ in SEEN_STEP])  # one more per txid
    assert round(leak.growth) == 80 and not leak.flat


def test_delta_rs_threads_are_judged_by_a_ceiling_and_by_slope_in_the_full_soak() -> None:
    txids = list(range(0, 200, 5))

    def delta_rs(counts: list[int], quick: bool) -> Figure:
        samples = [
            Sample(float(t), t, 270.0, 1530.0, 400, n, 440, 410, 160.0)
            for t, n in zip(txids, counts, strict=True)
        ]
        return {f.name: f for f in figures(samples, 120, 200, quick)}["delta_rs_threads"]

    # The pool's step at a checkpoint (as measured alone: 8, then 89 from the 100th
    # commit), here at txid 160: past the warm-up, far under the ceiling.
    step = [8 if t < 100 else 49 if t < 160 else 89 for t in txids]
    quick = delta_rs(step, quick=True)
    assert quick.flat and quick.peak == 89 and round(quick.growth) > quick.allowed
    full = delta_rs(step, quick=False)
    assert (
        not full.flat and full.problem == f"delta_rs_threads grew {full.growth:.2f} (allowed 16.0)"
    )
    # A thread leaked per txid passes the ceiling before the quick run's end, even when
    # the warm-up's samples are not judged for growth: the peak is the whole run's.
    leak = [8 + t for t in txids]
    leaked = delta_rs(leak, quick=True)
    assert leaked.peak == 8 + 195 and not leaked.flat
    assert leaked.problem == "delta_rs_threads reached 203 (ceiling 160)"


#: ``(txid, open_files)`` sampled past the warm-up of a quick soak (make test-slow, alone):
#: level, with one burst at the last sample (443 -> 505).
SEEN_BURST = [
    (122, 443), (129, 443), (133, 444), (138, 443), (144, 443), (150, 440), (153, 440),
    (159, 446), (166, 446), (172, 443), (178, 443), (184, 443), (189, 443), (196, 505),
]  # fmt: skip


def test_one_samples_burst_is_no_growth_and_one_that_holds_or_a_file_a_txid_is() -> None:
    def files(series: list[tuple[int, int]]) -> Figure:
        samples = [Sample(float(t), t, 270.0, 1530.0, 340, 97, n, 418, 160.0) for t, n in series]
        return {f.name: f for f in figures(samples, 120, 200)}["open_files"]

    burst = files(SEEN_BURST)  # a plain least-squares slope reads it as a growth of 27
    assert burst.flat and burst.peak == 505 and abs(burst.growth) < 2
    held = files([*SEEN_BURST[:-2], (189, 505), (196, 505)])  # the same level, two samples
    assert not held.flat and held.growth > 16
    leak = files([(t, 443 + t - 122) for t, _ in SEEN_BURST])  # one more per txid
    assert round(leak.growth) == 80 and not leak.flat


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


def test_delta_rs_threads_are_counted_by_name_and_a_process_gone_is_psutils_error(
    tmp_path: Path,
) -> None:
    import os
    import subprocess
    import sys

    import psutil
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "t"), pa.table({"n": [1]}))  # starts delta-rs's runtime
    names = [p.read_text() for p in Path(f"/proc/{os.getpid()}/task").glob("*/comm")]
    assert delta_rs_threads(os.getpid()) == sum(n.startswith("tokio") for n in names) >= 1
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    with pytest.raises(psutil.NoSuchProcess):
        delta_rs_threads(int(gone.stdout))
