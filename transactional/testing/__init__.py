"""Testing a topology: fault plans, a replay harness, in-memory doubles.

- ``FaultPlan`` says where the protocol fails or the process "dies"
  (``SimulatedCrash``), in code or as a string (``FaultPlan.parse``);
- ``TopologyHarness`` runs a user's topology in-process on a real store and sink under
  such a plan, and again from the same store, so a test can crash, rerun and assert;
- the in-memory doubles (``InMemoryEngine``, ``InMemoryStateStore``, list spouts,
  ``MemoryCommitter``) test the runner's state machine itself in milliseconds;
- ``CommitterContract`` is what every committer must do, as a pytest suite to run on
  your own (``SinkUnderTest`` says how to reach your sink);
- ``transactional.testing.history`` reads the ready-made committers' sinks with their
  own clients and judges them, record by record, against an answer computed from the
  input (docs/how-to/check-history.md).

The pytest plugin ``transactional.testing.plugin`` (registered as an entry point) gives
the fixtures ``transactional_spark``, ``transactional_harness`` and
``transactional_faults``.
"""

from transactional.faults import FaultPoint
from transactional.testing.committer_contract import CommitterContract, SinkUnderTest
from transactional.testing.harness import HarnessRun, TopologyHarness, UnmetFaultWarning
from transactional.testing.memory import (
    InMemoryEngine,
    InMemoryStateStore,
    ListOpaqueSpout,
    ListPartitionedSpout,
    ListTransactionalSpout,
    Range,
    partitions_have_more,
)
from transactional.testing.plan import (
    FaultPlan,
    FaultPlanError,
    FaultRule,
    SimulatedCrash,
)
from transactional.testing.sinks import (
    CountingBolt,
    MemoryCommitter,
    counting_topology,
    expected_counts,
)

__all__ = [
    "CommitterContract",
    "CountingBolt",
    "FaultPlan",
    "FaultPlanError",
    "FaultPoint",
    "FaultRule",
    "HarnessRun",
    "InMemoryEngine",
    "InMemoryStateStore",
    "ListOpaqueSpout",
    "ListPartitionedSpout",
    "ListTransactionalSpout",
    "MemoryCommitter",
    "Range",
    "SimulatedCrash",
    "SinkUnderTest",
    "TopologyHarness",
    "UnmetFaultWarning",
    "counting_topology",
    "expected_counts",
    "partitions_have_more",
]
