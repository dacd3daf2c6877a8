"""A short chaos campaign (``python -m tests.chaos --quick``): the demo with the opaque
spout (its sinks in opaque mode, whose undo and redo is the harder commit), on
ZooKeeper, a Redis Cluster and a Spark standalone cluster, one fault of every kind
(SIGKILL at a protocol step and at a random moment, a ZooKeeper session expiry and
restart, a Redis failover and restart, a Spark worker kill), each shown to have fired
by its witness (``tests.witness``), both sinks judged record by record
(``tests.history``) at the end and midway after each fault. The full campaign is
``make chaos`` (every spout kind, fifty faults each); this is its CI-sized run, of one
spout kind a run, taken in turn by the rotation's seed (``tests/rotation.py``), so three
consecutive CI runs meet every spout kind with every kind of fault. Every spout kind
meets SIGKILLs at every step in the crash matrix (``tests/e2e/test_crash_matrix.py``)
and a Redis failover, a worker kill and the ZooKeeper ensemble's faults in the other
cluster tests in every run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE

import pytest

from tests import rotation
from tests.chaos import MIDWAY_COLUMNS, PROCESS_KINDS, VERDICT_COLUMNS
from tests.processes import ROOT, demo_env

pytestmark = pytest.mark.cluster

#: One fault per kind: the five taken in turn that leave the run going, the random kill
#: that ends it, and the kill at a step planned for the run started after it; more if
#: one of them was not reached (``--every-kind``: a run that passed its planned step is
#: killed at once instead), on an input long enough not to drain first.
FAULTS = len(PROCESS_KINDS)
TWEETS = 900
#: The spout kinds, one a run in a rotated run (all three took 19 minutes beside another
#: suite, a third of the cluster lane): the opaque one (its sinks in opaque mode) first.
KINDS = ("opaque", "transactional", "partitioned")
#: A few minutes alone on 2 cores; CI runs it beside another suite.
CAMPAIGN_S = 1200


def spouts(chosen: rotation.Rotation) -> tuple[str, ...]:
    """The spout kinds of this run: one of ``KINDS`` in turn, or all of them."""
    return tuple(k for n, k in enumerate(KINDS) if chosen.takes(0, n, slices=len(KINDS)))


@pytest.mark.timeout(CAMPAIGN_S + 180)
def test_a_short_campaign_fires_every_kind_of_fault_and_nothing_is_lost_or_counted_twice(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    kinds = spouts(rotation.of(pytestconfig))
    figures_file = tmp_path / "figures.json"
    command = [sys.executable, "-m", "tests.chaos", "--quick", "--faults", str(FAULTS)]
    command += ["--spouts", *kinds, "--every-kind", "--tweets", str(TWEETS)]
    command += ["--json", str(figures_file)]
    campaign = subprocess.Popen(
        command, cwd=ROOT, env=demo_env(), stdout=PIPE, stderr=PIPE, text=True
    )
    try:
        stdout, stderr = campaign.communicate(timeout=CAMPAIGN_S)
    except subprocess.TimeoutExpired:
        campaign.terminate()  # it stops its servers and its run on the way out
        stdout, stderr = campaign.communicate(timeout=120)
        raise AssertionError(
            f"not done in {CAMPAIGN_S}s:\n{stdout[-6000:]}{stderr[-6000:]}"
        ) from None
    output = stdout[-6000:] + stderr[-6000:]
    assert campaign.returncode == 0, output
    figures = json.loads(figures_file.read_text())
    assert figures["not fired"] == 0, output
    assert {k: n for k, n in figures["faults"].items() if n < len(kinds)} == {}, output
    assert sum(figures["faults"].values()) >= FAULTS * len(kinds)
    assert figures["exceptions"] > 0  # --fail-rate injected some, seen in the runs' logs
    assert [(row["spout"], row["sink"]) for row in figures["sinks"]] == [
        (spout, sink) for spout in kinds for sink in ("redis", "delta")
    ]
    for row in figures["sinks"]:
        assert row["drained"], output
        assert {k: row[k] for k in VERDICT_COLUMNS} == dict.fromkeys(VERDICT_COLUMNS, 0), output
    for kind in PROCESS_KINDS:  # both sinks read after every fault
        after = figures["after"][kind]
        assert after.get("readings", 0) + after.get("unreadable", 0) >= 2 * len(kinds), after
        assert {k: after.get(k, 0) for k in MIDWAY_COLUMNS} == dict.fromkeys(MIDWAY_COLUMNS, 0)
