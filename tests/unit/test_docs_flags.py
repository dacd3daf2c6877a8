"""Every flag the README and the docs name exists: each ``--flag`` in their text is a
flag of one of the commands they document, read from the commands' own ``--help`` (a
flag renamed or dropped in the code and not in the docs fails here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: Flags the docs name as a user's typo, to show what the command says of it.
TYPOS = {("--max-pendng", "docs/how-to/run.md")}

#: The documented commands, each as the arguments that print its help.
COMMANDS = [
    *(
        ["-m", "transactional.cli", c, "--help"]
        for c in ("run", "status", "query", "rewind", "list")
    ),
    *(["-m", "examples.tweets", c, "--help"] for c in ("generate", "load", "run", "show")),
    ["-m", "benchmarks.bench", "--help"],
    ["-m", "tests.chaos", "--help"],
    [".ci/venvs.py", "--help"],
    ["-m", "pytest", "--help", "-p", "no:cacheprovider"],
]


def spark_submit() -> list[str]:
    """PySpark's ``spark-submit --help`` (the Spark Connect page starts a server with it;
    its usage goes to stderr)."""
    import pyspark

    return [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--help"]


def known_flags() -> set[str]:
    flags: set[str] = set()
    for command in [*([sys.executable, *args] for args in COMMANDS), spark_submit()]:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (command, done.stderr[-2000:])
        flags |= set(FLAG.findall(done.stdout + done.stderr))
    return flags


def test_every_flag_the_docs_name_exists() -> None:
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {
        (flag, path.relative_to(ROOT).as_posix())
        for path in documents
        for flag in FLAG.findall(path.read_text())
    }
    assert named  # the docs do name flags
    known = known_flags()
    assert "--start-from" in known and "--delta-path" in known  # both CLIs were read
    assert named >= TYPOS and not {flag for flag, _ in TYPOS} & known
    assert sorted((flag, where) for flag, where in named - TYPOS if flag not in known) == []
