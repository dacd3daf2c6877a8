"""``python -m tests.mutation [NAME ...]`` (``make mutation``): each planted bug (all, or
those named) run against its tests (``Bug.targets``, in order, stopping at the first
that fails), one pytest process a bug; then the table of what caught each, with the
commit it ran at: written to ``tests/MUTATION.md`` when every bug ran (``--out``:
elsewhere), printed when only some did. Exits 1 when a bug went uncaught: a hole in the
evidence."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.mutation.bugs import BUGS, Bug
from tests.provenance import commit

ROOT = Path(__file__).resolve().parents[2]


def run_planted(
    names: Sequence[str], targets: Sequence[str], extra: Sequence[str] = ()
) -> dict[str, Any]:
    """A pytest run of ``targets`` with the bugs ``names`` planted; its report (see
    ``tests.mutation.plugin``), with the run's exit code and seconds."""
    with tempfile.TemporaryDirectory(prefix="planted-") as work:
        report, log = Path(work) / "report.json", Path(work) / "pytest.log"
        command = [sys.executable, "-m", "pytest", "-p", "tests.mutation.plugin"]
        command += ["--plant", ",".join(names), "--plant-report", str(report)]
        # A base directory of its own: pytest prunes all but the newest three of the
        # numbered ones, so another suite starting meanwhile would delete this run's.
        command += ["--basetemp", str(Path(work) / "basetemp")]
        command += ["-q", "-p", "no:cacheprovider", *extra, *targets]
        # Nor the options of a pytest this one runs under (its --basetemp above all,
        # which this run would remove at its start).
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
        began = time.monotonic()
        with log.open("wb") as out:
            code = subprocess.run(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            ).returncode
        if not report.exists():
            raise SystemExit(
                f"{','.join(names)}: pytest wrote no report (exit {code}):\n"
                f"{log.read_text()[-3000:]}"
            )
        result: dict[str, Any] = json.loads(report.read_text())
        result["log"] = log.read_text(errors="replace")[-20_000:]
    result.update(seconds=round(time.monotonic() - began), exit=code)
    if code not in (0, 1) or (code == 1 and not result["failures"]):
        raise SystemExit(f"{','.join(names)}: pytest ended with exit {code}, no test failing")
    return result


def run_bug(bug: Bug, extra: Sequence[str], say: Any) -> dict[str, Any]:
    """Plant ``bug`` in a pytest run of its targets, stopping at the first that fails;
    what caught it (``caught_by`` None: nothing did)."""
    result = run_planted([bug.name], bug.targets, ["-x", *extra])
    first = result["failures"][0] if result["failures"] else {}
    result.update(first, bug=bug.name, what=bug.what, caught_by=first.get("test"))
    say(
        f"{bug.name}: "
        + (f"caught by {result['caught_by']}" if result["caught_by"] else "NOT CAUGHT")
        + f" ({result['seconds']} s)"
    )
    return result


def table(results: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| bug | what it does | passed it first | caught by | demo runs (killed) by then | time |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["caught_by"]:
            test = r["caught_by"].split("::", 1)[-1]
            error = r["error"].removeprefix("E ").strip()
            error = error if len(error) <= 240 else error[:240] + " ..."
            caught = f"`{test}` ({r['when']}): {error}"
            runs = f"{r['runs']} ({r['kills']})"
        else:
            caught, runs = "**not caught**", f"{r['runs_total']}"
        caught = caught.replace("|", "\\|")
        missed = ", ".join(f"`{t.split('::', 1)[-1]}`" for t in r["passed"]) or "-"
        lines.append(
            f"| `{r['bug']}` | {r['what']} | {missed} | {caught} | {runs} | {r['seconds']} s |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__)
    parser.add_argument(
        "bugs", nargs="*", help=f"the bugs to plant (default all: {', '.join(BUGS)})"
    )
    parser.add_argument("--out", type=Path, help="where to write the table")
    parser.add_argument("--pytest", action="append", default=[], help="one more pytest argument")
    args = parser.parse_args(argv)
    names = args.bugs or list(BUGS)
    unknown = [n for n in names if n not in BUGS]
    if unknown:
        parser.error(f"no planted bug {', '.join(unknown)}; the bugs: {', '.join(BUGS)}")

    def say(text: str) -> None:
        print(text, flush=True)

    at = commit()
    results = []
    for i, name in enumerate(names, 1):
        say(f"[{i}/{len(names)}] planting {name} ...")
        results.append(run_bug(BUGS[name], args.pytest, say))
    missed = [r["bug"] for r in results if not r["caught_by"]]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = (
        "# Planted bugs\n\n"
        "The evidence shown to fail. Each bug below is a plausible mistake in the "
        "protocol, planted in the product at run time from the tests alone "
        "(`tests/mutation/bugs.py`: nothing in the product knows of it), then its tests "
        "(the crash chains, the guarantee chains, the failover and network-fault tests, "
        "the ledger's) are "
        "run with it until one fails. *Caught by*: that test, and the first line of its "
        "failure; *demo runs (killed)*: how many demo processes had started by then, and "
        "how many of them had died by SIGKILL. A lean set runs in every CI run "
        "(`tests/mutation/test_planted.py`).\n\n"
        f"`make mutation` (`python -m tests.mutation`), {when}, at commit {at}.\n\n"
        f"{table(results)}\n"
    )
    out = args.out or (None if args.bugs else ROOT / "tests" / "MUTATION.md")
    if out is None:
        say(text)
    else:
        out.write_text(text, encoding="utf-8")
        say(f"written: {out}")
    if missed:
        say(f"not caught: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
