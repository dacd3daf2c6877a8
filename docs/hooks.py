"""MkDocs hooks: pages kept beside the code they describe, brought into the site as
they are. The benchmark's last results (``benchmarks/RESULTS.md``, written by ``make
bench``, and its charts) and the reasoning behind its figures
(``benchmarks/analysis.md``, which ``make bench`` appends to every results file: the
results page leaves that copy out, the analysis has a page of its own); the last full
chaos campaign's, contention runs', soak's and planted bugs' records (``tests/CHAOS.md``
and ``tests/CONTENTION.md`` by ``make chaos``, ``tests/SOAK.md`` by ``make soak``,
``tests/MUTATION.md`` by ``make mutation``), once written.

And the options table of ``transactional run`` in docs/how-to/run.md, made from the
command's parser (its settings' flags and help from ``transactional.cli.settings``), so
that it cannot drift: the site is built with it made afresh, the page keeps a copy for
readers of the file that ``tests/unit/test_docs_options.py`` compares, and
``python docs/hooks.py`` rewrites that copy."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mkdocs is needed only to build the site
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
ANALYSIS_HEADING = "## Reading the figures"
#: Records the test tools write, each a page of the site as it is.
RECORDS = {
    "internals/chaos.md": ROOT / "tests" / "CHAOS.md",
    "internals/contention.md": ROOT / "tests" / "CONTENTION.md",
    "internals/soak.md": ROOT / "tests" / "SOAK.md",
    "internals/mutation.md": ROOT / "tests" / "MUTATION.md",
}


def on_files(files: Files, config: Any) -> Files:
    from mkdocs.structure.files import File

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


OPTIONS_PAGE = ROOT / "docs" / "how-to" / "run.md"
OPTIONS_BEGIN = (
    "<!-- the options of `transactional run`, made by docs/hooks.py from the command's "
    "parser: edit transactional/cli/settings.py, then run `python docs/hooks.py` -->"
)
OPTIONS_END = "<!-- end of the options -->"


def run_options() -> str:
    """The table of ``transactional run``'s options: one row per flag of its parser, its
    value's shape and its ``--help`` text (which says the default)."""
    from transactional.cli._parser import build_parser

    run = build_parser().commands["run"]
    rows = ["| option | meaning |", "|---|---|"]
    for action in run._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        shape = "" if action.nargs == 0 else f" {action.metavar}"
        flags = ", ".join(f"`{flag}{shape}`" for flag in action.option_strings)
        text = (action.help or "").replace("[", "\\[")  # not a link: host:port[,...]
        rows.append(f"| {_cell(flags)} | {_cell(text)} |")
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    """A table cell's text: its pipes escaped (in code spans too, as tables need)."""
    return text.replace("|", "\\|")


def with_options(markdown: str) -> str:
    """``markdown`` (run.md) with the options table between its markers made afresh."""
    head, found, rest = markdown.partition(OPTIONS_BEGIN)
    _, ended, tail = rest.partition(OPTIONS_END)
    if not (found and ended):
        raise ValueError(f"{OPTIONS_PAGE}: no {OPTIONS_BEGIN!r} ... {OPTIONS_END!r} block")
    return f"{head}{OPTIONS_BEGIN}\n\n{run_options()}\n{OPTIONS_END}{tail}"


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    if page.file.abs_src_path and Path(page.file.abs_src_path) == OPTIONS_PAGE:
        return with_options(markdown)
    return markdown


if __name__ == "__main__":
    OPTIONS_PAGE.write_text(with_options(OPTIONS_PAGE.read_text()))
