"""How a txid's cost grows with its size: the tweet topology at 1k, 10k, 100k and 1M
records per txid, on each sink, one txid at a time (``max_pending=1``, so each step's
time is its own), with the time per protocol step, the Spark jobs per txid, and the
driver's peak memory (this Python process and its Spark JVM together). Also draws the
figures of RESULTS.md (matplotlib PNGs next to it).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIZES = (1_000, 10_000, 100_000, 1_000_000)
#: Txids per size: the first pays for nothing the others do not (Spark is warm).
TXIDS = 3
HERE = Path(__file__).resolve().parent


@dataclass
class Growth:
    sink: str
    size: int
    seconds: float
    records: int
    peak_mib: float
    timings: list[Any] = field(default_factory=list)

    def step(self, name: str) -> float:
        """The median seconds of one step over the run's txids."""
        return statistics.median(getattr(t, name) for t in self.timings) if self.timings else 0.0

    @property
    def jobs(self) -> float | None:
        jobs = [t.jobs for t in self.timings if t.jobs is not None]
        return statistics.median(jobs) if jobs else None


def _rss_mib(jvm: int | None) -> float:
    """This Python process, plus the Spark JVM ``jvm`` and its Python workers, in MiB
    (not the bench's own Redis and ZooKeeper servers, also children of this process)."""
    import psutil

    processes = [psutil.Process()]
    if jvm is not None:
        try:
            spark_jvm = psutil.Process(jvm)
            processes += [spark_jvm, *spark_jvm.children(recursive=True)]
        except psutil.Error:
            pass
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


@contextmanager
def peak_rss(jvm: int | None) -> Iterator[list[float]]:
    """``[peak MiB]`` seen while the block runs (sampled every 50 ms)."""
    peak = [_rss_mib(jvm)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], _rss_mib(jvm))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        done.set()
        thread.join()


def _jvm_pid(spark: Any) -> int | None:
    """The pid of the Spark JVM this process launched (None: not known)."""
    process = getattr(spark.sparkContext._gateway, "proc", None)
    return getattr(process, "pid", None)


def measure_growth(
    spark: Any,
    redis_url: str,
    sinks: Sequence[str],
    sizes: Sequence[int],
    dataset: Callable[[int, int], Path],
    work: Path,
    progress: Callable[[str], None],
) -> list[Growth]:
    from benchmarks.cases import framework

    partitions = 8
    results = []
    for sink in sinks:
        for size in sizes:
            data = dataset(size * TXIDS, partitions)
            case = framework(
                spark,
                data,
                sink,
                redis_url,
                work,
                partitions=partitions,
                per_txid=size,
                max_pending=1,
            )
            with peak_rss(_jvm_pid(spark)) as peak:
                began = time.perf_counter()
                records = case.run()
                seconds = time.perf_counter() - began
            result = Growth(sink, size, seconds, records, peak[0], list(case.timings))
            progress(f"growth [{sink}] {size:,} per txid: {seconds:.1f}s, peak {peak[0]:.0f} MiB")
            results.append(result)
    return results


def growth_table(results: Sequence[Growth]) -> list[str]:
    lines = [
        "| sink | records per txid | txids | coordinate ms | emit s | process s | prepare s | "
        "commit s | Spark jobs | records/s | driver peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        coordinate = (r.step("store_s") + r.step("advance_s")) * 1000
        lines.append(
            f"| {r.sink} | {r.size:,} | {len(r.timings)} | {coordinate:.1f} | "
            f"{r.step('emit_s'):.2f} | {r.step('process_s'):.2f} | {r.step('prepare_s'):.2f} | "
            f"{r.step('commit_s'):.2f} | {r.jobs if r.jobs is not None else '-'} | "
            f"{r.records / r.seconds:,.0f} | {r.peak_mib:,.0f} |"
        )
    lines += [
        "",
        "`coordinate` is the store's share (the metadata write and the fenced advance); "
        "`driver peak` is the Python driver, its Spark JVM and Python workers together "
        "(in local mode the executors live in that JVM).",
    ]
    return lines


def draw_growth(results: Sequence[Growth], out: Path) -> Path:
    """Per-txid time of each step against records per txid, log axes, one panel a sink."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sinks = list(dict.fromkeys(r.sink for r in results))
    fig, axes = plt.subplots(1, len(sinks), figsize=(7.5 * len(sinks), 4.5), squeeze=False)
    steps = [("emit_s", "emit"), ("process_s", "process"), ("prepare_s", "prepare")]
    steps.append(("commit_s", "commit"))
    for ax, sink in zip(axes[0], sinks, strict=True):
        mine = sorted((r for r in results if r.sink == sink), key=lambda r: r.size)
        sizes = [r.size for r in mine]
        for name, label in steps:
            ax.plot(sizes, [max(r.step(name), 1e-3) for r in mine], marker="o", label=label)
        coordinate = [max(r.step("store_s") + r.step("advance_s"), 1e-4) for r in mine]
        ax.plot(sizes, coordinate, marker="o", label="coordinate")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("records per txid")
        ax.set_ylabel("seconds per txid (median)")
        ax.set_title(f"{sink}: time per txid by step")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def draw_throughput(rates: Sequence[tuple[str, str, float]], out: Path) -> Path:
    """Records/s of every case, a group of bars per sink: ``(sink, case, rate)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sinks = list(dict.fromkeys(s for s, _, _ in rates))
    fig, axes = plt.subplots(1, len(sinks), figsize=(7.5 * len(sinks), 4.5), squeeze=False)
    for ax, sink in zip(axes[0], sinks, strict=True):
        mine = [(case, rate) for s, case, rate in rates if s == sink]
        colours = [
            "tab:grey" if not case.startswith("framework") else "tab:blue" for case, _ in mine
        ]
        ax.barh([case for case, _ in mine], [rate for _, rate in mine], color=colours)
        ax.invert_yaxis()
        ax.set_xlabel("records/s (median)")
        ax.set_title(f"{sink}: throughput (grey: anchors)")
        ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


#: The fixed-cost section: txids of this many records each, this many of them.
FIXED_RECORDS = 10
FIXED_TXIDS = 40
#: The issue's target for Delta: seconds per txid of 10 records.
FIXED_TARGET_S = 0.5


@dataclass
class FixedCost:
    sink: str
    max_pending: int
    txids: int
    seconds: float
    grouped: int

    @property
    def per_txid(self) -> float:
        return self.seconds / self.txids


def measure_fixed_cost(
    spark: Any,
    redis_url: str,
    sinks: Sequence[str],
    dataset: Callable[[int, int], Path],
    work: Path,
    progress: Callable[[str], None],
    txids: int = FIXED_TXIDS,
) -> list[FixedCost]:
    """What a txid costs when it holds almost nothing: ``txids`` txids of
    ``FIXED_RECORDS`` records, one partition, wall time of the whole run (a warm Spark)
    divided by the txids, at ``max_pending`` 1 and 4 (commit groups as by default)."""
    from benchmarks.cases import framework

    data = dataset(FIXED_RECORDS * txids, 1)
    results = []
    for sink in sinks:
        for max_pending in (1, 4):
            case = framework(
                spark,
                data,
                sink,
                redis_url,
                work,
                partitions=1,
                per_txid=FIXED_RECORDS,
                max_pending=max_pending,
            )
            began = time.perf_counter()
            case.run()
            seconds = time.perf_counter() - began
            result = FixedCost(sink, max_pending, txids, seconds, case.grouped)
            progress(
                f"fixed cost [{sink}] max_pending={max_pending}: {result.per_txid:.3f} s per "
                f"txid ({txids} txids of {FIXED_RECORDS} records, {case.grouped} group commits)"
            )
            results.append(result)
    return results


def fixed_cost_table(results: Sequence[FixedCost]) -> list[str]:
    lines = [
        f"| sink | max_pending | txids of {FIXED_RECORDS} records | group commits | "
        "seconds per txid | target |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        target = ""
        if r.sink == "delta":
            met = "met" if r.per_txid <= FIXED_TARGET_S else "missed"
            target = f"<= {FIXED_TARGET_S} s: {met}"
        lines.append(
            f"| {r.sink} | {r.max_pending} | {r.txids} | {r.grouped} | {r.per_txid:.3f} | "
            f"{target} |"
        )
    lines += [
        "",
        "Seconds per txid: the run's wall time (a warm Spark session, the runner opened "
        "and closed) over its txids; the Delta target applies to the best of the two.",
    ]
    return lines
