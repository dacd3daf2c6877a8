"""The soak's short version (``python -m tests.soak --quick``, ``make test-soak``, which
CI runs; ``make soak`` runs the full one): a run of small txids on both sinks with
ZooKeeper, ZooKeeper and Redis restarted in turn and exceptions injected throughout,
exact on both sinks, every planned fault seen to fire, and the driver's threads, open
files and the store's nodes flat after the warm-up, delta-rs's threads under their
ceiling (memory is shown, judged by the full soak only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow, pytest.mark.soak]

ROOT = Path(__file__).resolve().parents[2]


def test_the_short_soak_is_exact_with_every_fault_fired_and_flat(tmp_path: Path) -> None:
    figures = tmp_path / "soak.json"
    command = [sys.executable, "-m", "tests.soak", "--quick"]
    done = subprocess.run(
        [*command, "--json", str(figures)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    soak = json.loads(figures.read_text())
    assert soak["problems"] == []
    # Every planned fault fired, each kind at least once, as its witness saw it.
    assert soak["faults"] == soak["planned"] and min(soak["planned"].values()) >= 1, soak
    assert soak["injected_failures"] >= 1
    judged = {f["name"]: f for f in soak["figures"] if not f["name"].endswith("_mib")}
    assert set(judged) == {"threads", "delta_rs_threads", "open_files", "store_nodes"}
    assert all(f["flat"] for f in judged.values()), judged
    # The samples span the run: the last was taken at (or close to) the last txid, from
    # a live run (no zeros of a process on its way out).
    assert soak["samples"][-1]["txid"] >= 190, soak["samples"][-1]
    assert soak["samples"][-1]["threads"] > 100, soak["samples"][-1]
    # delta-rs's runtime was seen by its threads' names and counted apart.
    assert soak["samples"][-1]["delta_rs_threads"] >= 1, soak["samples"][-1]
    # The JVM's GC log was read: its full collections, and the live heap after them.
    assert soak["full_collections"] >= 1
    assert any(s["jvm_heap_mib"] for s in soak["samples"])
