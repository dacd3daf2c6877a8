"""The committer-contract example (docs/how-to/own-committer.md) runs as printed: its
JSON-file committer passes the contract suite (pytest run on the block, in a process of
its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.docs import example


def contract_example() -> str:
    return example("docs/how-to/own-committer.md", "class TestMyCommitter(CommitterContract)").code


def test_the_docs_committer_passes_the_contract_as_printed(tmp_path: Path) -> None:
    (tmp_path / "test_my_committer.py").write_text(contract_example())
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "test_my_committer.py"],
        cwd=tmp_path,
        # The suite's own options (a --basetemp above this directory) are not the user's.
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # Every test of the transactional contract ran and passed (the opaque ones are not
    # for a committer without that mode).
    passed = {
        line.split("::")[-1].split("[")[0]
        for line in done.stdout.splitlines()
        if line.rstrip().endswith("PASSED") or " PASSED " in line
    }
    assert passed == {
        "test_commits_in_txid_order_are_applied",
        "test_a_transactional_replay_is_skipped_also_after_a_restart",
        "test_unchecked_a_held_txid_is_applied_again_or_skipped_as_it_says",
        "test_a_deposed_leader_writes_nothing",
        "test_committed_txid_reads_the_sink_not_a_cache",
        "test_a_txid_with_nothing_to_count_is_committed_and_replayed",
    }, done.stdout
