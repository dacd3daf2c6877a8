"""MkDocs hooks: pages kept beside the code they describe, brought into the site as
they are. The benchmark's last results (``benchmarks/RESULTS.md``, written by ``make
bench``, and its charts) and the reasoning behind its figures
(``benchmarks/analysis.md``, which ``make bench`` appends to every results file: the
results page leaves that copy out, the analysis has a page of its own); the last full
chaos campaign's and soak's records (``tests/CHAOS.md`` by ``make chaos``,
``tests/SOAK.md`` by ``make soak``), once written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
ANALYSIS_HEADING = "## Reading the figures"
#: Records the test tools write, each a page of the site as it is.
RECORDS = {
    "internals/chaos.md": ROOT / "tests" / "CHAOS.md",
    "internals/soak.md": ROOT / "tests" / "SOAK.md",
}


def on_files(files: Files, config: Any) -> Files:
    results = (BENCH / "RESULTS.md").read_text().split(f"\n{ANALYSIS_HEADING}\n", 1)[0]
    analysis = (BENCH / "analysis.md").read_text()
    pages = {
        "internals/results.md": results.rstrip() + "\n\nThe reasoning behind these figures: "
        "[Benchmark analysis](analysis.md).\n",
        "internals/analysis.md": "# Benchmark analysis\n\n" + analysis,
    }
    pages |= {uri: path.read_text() for uri, path in RECORDS.items() if path.exists()}
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    for chart in sorted(BENCH.glob("*.png")):
        files.append(File.generated(config, f"internals/{chart.name}", abs_src_path=str(chart)))
    return files
