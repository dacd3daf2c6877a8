"""Exactly-once transactional batch processing on Apache Spark, after Storm's
transactional topologies."""

from transactional.bolt import Bolt
from transactional.committer import Committer, CommitterContext
from transactional.config import RunnerConfig
from transactional.errors import (
    BatchConfigurationError,
    CommitError,
    ConfigurationError,
    ContractError,
    CoordinatorError,
    EmitError,
    LostLeadershipError,
    PoisonBatchError,
    TopologyValidationError,
    TransactionalError,
)
from transactional.runner import TransactionalRunner
from transactional.spout import (
    OpaquePartitionedTransactionalSpout,
    PartitionedTransactionalSpout,
    TransactionalSpout,
)
from transactional.topology import Topology, TopologyBuilder
from transactional.types import (
    BatchMetadata,
    CommitMode,
    CommitOutcome,
    Guarantee,
    SpoutKind,
    TransactionAttempt,
)

__all__ = [
    "BatchConfigurationError",
    "BatchMetadata",
    "Bolt",
    "CommitError",
    "CommitMode",
    "CommitOutcome",
    "Committer",
    "CommitterContext",
    "ConfigurationError",
    "ContractError",
    "CoordinatorError",
    "EmitError",
    "Guarantee",
    "LostLeadershipError",
    "OpaquePartitionedTransactionalSpout",
    "PartitionedTransactionalSpout",
    "PoisonBatchError",
    "RunnerConfig",
    "SpoutKind",
    "Topology",
    "TopologyBuilder",
    "TopologyValidationError",
    "TransactionAttempt",
    "TransactionalError",
    "TransactionalRunner",
    "TransactionalSpout",
]
