"""The commit a recorded run (the campaign, the contention runs, the soak, the planted
bugs, the benchmarks) ran at, for the tables it writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """HEAD's short hash, ``+changes`` if a tracked file of the work tree differed."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + ("+changes" if dirty else "")
