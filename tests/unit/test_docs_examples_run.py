"""Every example of README.md and docs/ runs in the tests: each Python, shell and TOML
block is one that a test names through ``tests.docs`` (``example`` or ``run_example``,
found by reading the tests' source), but for the few that CI itself runs, each named
here with the reason."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.docs import ROOT, Block, blocks, example, pages

#: The languages of the blocks that are examples (``mermaid`` is a diagram; a block with
#: no language is sample output).
EXAMPLES = {"python", "sh", "toml"}
#: Blocks no test runs, by (page, a text only that block holds): why.
MAKE = (
    "the make targets: CI runs them (.ci/run: make docs, test, connect-test, "
    "connect-client-test, test-soak, test-slow, cluster-test, test-bounds BOUNDS=--short), "
    "and what `make demo` runs once installed (its recipe) "
    "tests/e2e/test_docs_getting_started.py runs"
)
RUN_ELSEWHERE = {("README.md", "make demo"): MAKE, ("docs/getting-started.md", "make demo"): MAKE}
NAMES = {"example", "run_example"}


def claimed_by_tests() -> dict[tuple[str, int], str]:
    """The blocks the tests name: (page, line) -> the test file naming it."""
    claimed: dict[tuple[str, int], str] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text())
        aliases = set(NAMES)
        constants: dict[str, str] = {}
        for node in ast.walk(tree):  # imported inside a test function too
            if isinstance(node, ast.ImportFrom) and node.module == "tests.docs":
                aliases |= {a.asname or a.name for a in node.names if a.name in NAMES}
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                constants[node.targets[0].id] = node.value.value
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in aliases
                and node.args
            ):
                continue
            args = []
            for arg in node.args[:3]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    args.append(arg.value)
                elif isinstance(arg, ast.Name) and arg.id in constants:
                    args.append(constants[arg.id])
                else:
                    break
            if node.func.id != "run_example" and len(args) == 3:
                page, holding, lang = args
            elif args:
                page, holding, lang = args[0], (args[1:2] or [""])[0], "python"
            else:
                continue
            if path.name == "docs.py":
                continue  # the mechanism itself
            block = example(page, holding, lang)
            claimed[(block.page, block.line)] = str(path.relative_to(ROOT))
    return claimed


def test_every_example_of_the_docs_runs_in_a_test() -> None:
    claimed = claimed_by_tests()
    elsewhere = {
        (b.page, b.line)
        for (page, holding) in RUN_ELSEWHERE
        for b in [example(page, holding, "sh")]
    }
    examples: list[Block] = [b for page in pages() for b in blocks(page) if b.lang in EXAMPLES]
    unrun = [
        f"{b.page}:{b.line} ({b.lang}) {b.code.splitlines()[0]}"
        for b in examples
        if (b.page, b.line) not in claimed and (b.page, b.line) not in elsewhere
    ]
    assert not unrun, "examples no test runs:\n" + "\n".join(unrun)
    assert not elsewhere & set(claimed), "a block said to run elsewhere is run by a test"


def test_the_check_sees_what_the_tests_name() -> None:
    """The reading of the tests' source finds the calls it must: a named page's block,
    one through a module constant, one through an alias, a shell block."""
    claimed = claimed_by_tests()
    files = set(claimed.values())
    for name in (
        "tests/integration/test_kafka_source.py",
        "tests/integration/test_docs_topology.py",
        "tests/integration/test_ledger.py",
        "tests/e2e/test_docs_getting_started.py",
    ):
        assert name in files, name
    assert Path(ROOT / "README.md").exists() and ("README.md", example("README.md").line) in claimed
