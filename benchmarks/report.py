"""The figures of a benchmark run as the Markdown of ``RESULTS.md``: the throughput table,
the per-step profile, the targets, and --batch-size auto over a longer run."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from benchmarks.cases import AUTO_TARGET_S, LOOP, NO_CHECK, NO_LEDGER, WEAKER


@dataclass
class Result:
    name: str
    sink: str
    seconds: list[float] = field(default_factory=list)
    #: Core-seconds of CPU each run took: this process and every process it started
    #: (Spark's JVM, its Python workers, the Redis and ZooKeeper servers).
    cpu: list[float] = field(default_factory=list)
    records: int = 0
    note: str = ""
    timings: list[Any] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        return self.records / self.median if self.seconds else 0.0

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu) if self.cpu else 0.0

    def busy(self, cores: int) -> float:
        """The share of the machine's cores the median run kept busy: its CPU over
        its wall time times the cores (each run's own ratio, then the median)."""
        if not self.cpu:
            return 0.0
        return statistics.median(
            c / (s * cores) for c, s in zip(self.cpu, self.seconds, strict=True)
        )


def longer_auto_section(pair: list[Result], tweets: int, per_txid: int) -> list[str]:
    """--batch-size auto against the same fixed size over a run long enough for its
    start (slow start from a quarter of that size, rounds of max_pending txids each
    taking a whole latency) to be a small part of it."""
    fixed, auto = pair
    ratio = auto.rate / fixed.rate if fixed.rate else 0.0
    verdict = "met" if ratio >= 0.95 else f"missed by {(0.95 - ratio) / 0.95:.0%}"
    sizes = [t for t in auto.timings if t.latency_s is not None]
    return [
        f"## --batch-size auto over a longer run ({tweets:,} tweets, {fixed.sink}, paired)",
        "",
        "| case | records/s (median) | runs (s) |",
        "|---|---:|---|",
        *(
            f"| {r.name} | {r.rate:,.0f} | {', '.join(f'{x:.1f}' for x in r.seconds)} |"
            for r in pair
        ),
        "",
        f"- {fixed.sink}: over {tweets:,} tweets ({tweets // per_txid} txids at the fixed "
        f"size), --batch-size auto reaches {ratio:.2f}x the fixed size's throughput "
        f"(target 0.95x: {verdict}); its last run took {len(sizes)} txids.",
        "",
    ]


def table(results: list[Result]) -> list[str]:
    by_sink: dict[str, dict[str, Result]] = {}
    for r in results:
        by_sink.setdefault(r.sink, {})[r.name] = r
    lines = [
        "| sink | case | records/s (median) | vs Structured Streaming | vs bare Spark | runs (s) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for sink, cases in by_sink.items():
        ss = cases.get("structured streaming")
        bare = cases.get("bare spark (no guarantee)")
        for r in cases.values():
            vs_ss = f"{r.rate / ss.rate:.2f}x" if ss and ss.rate else "-"
            vs_bare = f"{r.rate / bare.rate:.2f}x" if bare and bare.rate else "-"
            runs = ", ".join(f"{s:.1f}" for s in r.seconds)
            lines.append(f"| {sink} | {r.name} | {r.rate:,.0f} | {vs_ss} | {vs_bare} | {runs} |")
    return lines


def profile(results: list[Result]) -> list[str]:
    lines = [
        "| sink | case | txids | store ms | emit s | process s | prepare s | commit s | "
        "advance ms | Spark jobs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        t = r.timings
        if not t:
            continue

        def med(name: str, scale: float = 1.0, t: list[Any] = t) -> str:
            return f"{statistics.median(getattr(x, name) for x in t) * scale:.2f}"

        jobs = [x.jobs for x in t if x.jobs is not None]
        lines.append(
            f"| {r.sink} | {r.name} | {len(t)} | {med('store_s', 1000)} | {med('emit_s')} | "
            f"{med('process_s')} | {med('prepare_s')} | {med('commit_s')} | "
            f"{med('advance_s', 1000)} | {statistics.median(jobs) if jobs else '-'} |"
        )
    lines += [
        "",
        "`emit` reads the batch, counts (and digests) it and keeps it: one Spark job; "
        "`process` runs the bolts (Spark plans them lazily: their work runs in the next "
        "step); `prepare` collects the committers' per-key sums and dead letters as Arrow "
        "(a job each) and prepares them; `commit` is the serial sink write. With "
        "`max_pending` > 1 several txids share the cores, so each step takes longer while "
        "more run at once. `Spark jobs`: per txid, all steps (adaptive execution runs each "
        "shuffle's map stage as a job of its own).",
    ]
    return lines


#: Per sink, the framework's throughput targets: against Structured Streaming, and
#: against a bare Spark job.
TARGETS = {"redis": (1.3, 0.7), "delta": (2.0, 0.6)}


def best_framework(results: list[Result], sink: str) -> Result | None:
    """The fastest framework case of ``sink`` that keeps the whole guarantee (the cases
    without the determinism check or the ledger are not ours)."""
    ours = [
        r
        for r in results
        if r.sink == sink
        and r.name.startswith("framework")
        and NO_CHECK not in r.name
        and not any(g in r.name for g in WEAKER)
        and NO_LEDGER not in r.name
    ]
    return max(ours, key=lambda r: r.rate) if ours else None


def guarantees_table(results: list[Result]) -> list[str]:
    """The three guarantees side by side per sink: the same workload (partitioned file
    spout, max_pending=4), measured in the same repetitions."""
    lines = [
        "| sink | guarantee | records/s (median) | vs exactly_once | runs (s) |",
        "|---|---|---:|---:|---|",
    ]
    for sink in dict.fromkeys(r.sink for r in results):
        cases = {r.name: r for r in results if r.sink == sink}
        exact = cases.get("framework, max_pending=4")
        if exact is None or not exact.rate:
            continue
        for guarantee in ("exactly_once", *WEAKER):
            name = (
                "framework, max_pending=4"
                if guarantee == "exactly_once"
                else f"framework, {guarantee}, max_pending=4"
            )
            r = cases.get(name)
            if r is None:
                continue
            runs = ", ".join(f"{s:.1f}" for s in r.seconds)
            lines.append(
                f"| {sink} | {guarantee} | {r.rate:,.0f} | {r.rate / exact.rate:.3f}x | {runs} |"
            )
    return lines if len(lines) > 2 else []


def cpu_bound(results: list[Result], sink: str, cores: int) -> list[str]:
    """What the cores allow against Structured Streaming, from the CPU each run used: a
    run that does at least Structured Streaming's CPU work cannot end sooner than that
    work spread over every core, so ``1 / busy`` (its share of the cores kept busy) is
    the most any such run can gain on it; and the framework's best case, at its own
    CPU, cannot go faster than its CPU over every core."""
    cases = {r.name: r for r in results if r.sink == sink}
    ss, best = cases.get("structured streaming"), best_framework(results, sink)
    loop = cases.get(LOOP)
    if ss is None or best is None or not ss.cpu or not best.cpu:
        return []
    busy, own = ss.busy(cores), best.cpu_median
    at_full = ss.median * cores / own if own else 0.0
    lines = [
        f"- {sink}: Structured Streaming used {ss.cpu_median:.1f} core-s of CPU in "
        f"{ss.median:.1f} s, keeping {busy:.0%} of the {cores} cores busy. The framework's "
        f"best case ({best.name}) used {own:.1f} core-s "
        f"({own / ss.cpu_median:.2f}x Structured Streaming's) and kept "
        f"{best.busy(cores):.0%} of the cores busy; with all of them busy at that CPU it "
        f"would reach {at_full:.2f}x Structured Streaming."
    ]
    if loop is None or not loop.cpu:
        return lines
    work = loop.cpu_median
    said = (
        f"- {sink}: the batches' own work ({LOOP}: the same files through the same "
        f"bolts and committer, one after the other, nothing else) took {work:.1f} core-s"
    )
    if own < work:
        lines.append(
            f"{said}, and the framework's best case {own:.1f}: {work - own:.1f} less, so "
            "in this run the loop's CPU is no floor for a runner of these batches."
        )
    else:
        lines.append(
            f"{said}. No way of running those batches can end before that work spread "
            f"over the {cores} cores ({work / cores:.1f} s): at most "
            f"{ss.median * cores / work:.2f}x Structured Streaming with every core busy all "
            f"the time, {ss.median * cores * best.busy(cores) / work:.2f}x at the "
            f"framework's {best.busy(cores):.0%}, and that with exactly-once costing no CPU "
            f"at all (the framework's best case used {own - work:+.1f} core-s against the "
            "loop: each batch kept and digested for replays, the store's writes, the "
            "runner, less what overlapping the batches saves)."
        )
    return lines


def cpu_table(results: list[Result], cores: int) -> list[str]:
    """Median CPU per run and case: core-seconds, and the share of the cores busy."""
    lines = [
        "| sink | case | wall s | CPU core-s | cores busy |",
        "|---|---|---:|---:|---:|",
    ]
    for r in results:
        if r.cpu:
            lines.append(
                f"| {r.sink} | {r.name} | {r.median:.1f} | {r.cpu_median:.1f} | "
                f"{r.busy(cores):.0%} |"
            )
    return lines


def targets(results: list[Result], cores: int) -> list[str]:
    """The issue's throughput targets against the best framework case per sink."""
    lines = [
        "| sink | best framework case | vs Structured Streaming (target) | "
        "vs bare Spark (target) |",
        "|---|---|---:|---:|",
    ]
    for sink in dict.fromkeys(r.sink for r in results):
        cases = {r.name: r for r in results if r.sink == sink}
        ss, bare = cases.get("structured streaming"), cases.get("bare spark (no guarantee)")
        best = best_framework(results, sink)
        if best is None or ss is None or bare is None:
            continue
        a, b = best.rate / ss.rate, best.rate / bare.rate
        want_a, want_b = TARGETS.get(sink, (1.3, 0.7))
        # Three decimals: 1.2977x printed as "1.30x" beside "missed" reads as a contradiction.
        verdict_a = "met" if a >= want_a else f"missed by {(want_a - a) / want_a:.1%}"
        verdict_b = "met" if b >= want_b else f"missed by {(want_b - b) / want_b:.1%}"
        lines.append(
            f"| {sink} | {best.name} | {a:.3f}x ({want_a}x: {verdict_a}) | "
            f"{b:.3f}x ({want_b}x: {verdict_b}) |"
        )
    for sink in dict.fromkeys(r.sink for r in results):
        lines += cpu_bound(results, sink, cores)
    for sink in dict.fromkeys(r.sink for r in results):
        fixed = [
            r
            for r in results
            if r.sink == sink
            and r.name.startswith("framework, max")
            and NO_CHECK not in r.name
            and NO_LEDGER not in r.name
        ]
        checked = next((r for r in fixed if r.name == "framework, max_pending=4"), None)
        for marker, what in (
            (
                NO_LEDGER,
                "the record ledger (every tweet's id counted and XORed in the jobs the txid "
                "runs, checked per bolt before the commit)",
            ),
            (
                NO_CHECK,
                "the determinism check (count and checksum of every first emit, one store "
                "write per txid)",
            ),
        ):
            without = next((r for r in results if r.sink == sink and marker in r.name), None)
            if checked is not None and without is not None and without.rate:
                cost = 1 - checked.rate / without.rate
                verdict = "met" if cost < 0.05 else "missed"
                lines.append(
                    f"- {sink}: {what} costs {cost:+.1%} of throughput at max_pending=4 "
                    f"(target under 5%: {verdict})."
                )
        auto = next((r for r in results if r.sink == sink and r.name.endswith("auto")), None)
        if fixed and auto is not None:
            ratio = auto.rate / max(r.rate for r in fixed)
            verdict = "met" if ratio >= 0.95 else f"missed by {(0.95 - ratio) / 0.95:.0%}"
            lines.append(
                f"- {sink}: --batch-size auto reaches {ratio:.2f}x the best fixed batch "
                f"size's throughput on the same (partitioned) spout (target 0.95x: {verdict}), "
                "start included: on a run this short its slow start from a quarter of that "
                "size is a large part of the run (the longer run below leaves it smaller)."
            )
        # What the controller was fed: not a txid's wait behind earlier commits.
        own = [t.latency_s for t in (auto.timings if auto else []) if t.latency_s is not None]
        if own:
            over = sum(x > AUTO_TARGET_S for x in own)
            lines.append(
                f"- {sink}: --batch-size auto latency per txid median {statistics.median(own):.1f} s, "
                f"max {max(own):.1f} s over {len(own)} txids (target {AUTO_TARGET_S:.0f} s: "
                f"{'kept' if not over else f'exceeded by {over} txids'})."
            )
    return lines
