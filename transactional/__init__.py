"""Exactly-once transactional batch processing on Apache Spark, after Storm's
transactional topologies."""

try:
    import pyspark  # noqa: F401
except ModuleNotFoundError:
    raise ModuleNotFoundError(
        "transactional-spark needs PySpark: install it with its `spark` extra (pip install "
        "'transactional-spark[spark]': Spark in this process, and a Connect client too) "
        "or its `connect` extra (the Spark Connect client alone, no JVM)",
        name="pyspark",
    ) from None

from transactional.bolt import Bolt
from transactional.committer import Committer, CommitterContext
from transactional.config import RunnerConfig
from transactional.errors import (
    AttemptTimeoutError,
    BatchConfigurationError,
    CommitError,
    ConfigurationError,
    ContractError,
    CoordinatorError,
    EmitError,
    FencedError,
    InjectedFault,
    LedgerError,
    LostLeadershipError,
    NondeterministicSpoutError,
    PoisonBatchError,
    SourceDataLostError,
    SourceSchemaError,
    SparkAnalysisError,
    StoreUnavailableError,
    TopologyValidationError,
    TransactionalError,
    UnknownTopologyError,
)
from transactional.flow import AdaptiveBatchSize, BatchSizeConfig
from transactional.runner import TransactionalRunner
from transactional.spark.checkpoints import checkpoint
from transactional.spark.session import create_spark_session
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
    "AdaptiveBatchSize",
    "AttemptTimeoutError",
    "BatchConfigurationError",
    "BatchMetadata",
    "BatchSizeConfig",
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
    "FencedError",
    "Guarantee",
    "InjectedFault",
    "LedgerError",
    "LostLeadershipError",
    "NondeterministicSpoutError",
    "OpaquePartitionedTransactionalSpout",
    "PartitionedTransactionalSpout",
    "PoisonBatchError",
    "RunnerConfig",
    "SourceDataLostError",
    "SourceSchemaError",
    "SparkAnalysisError",
    "SpoutKind",
    "StoreUnavailableError",
    "Topology",
    "TopologyBuilder",
    "TopologyValidationError",
    "TransactionAttempt",
    "TransactionalError",
    "TransactionalRunner",
    "TransactionalSpout",
    "UnknownTopologyError",
    "checkpoint",
    "create_spark_session",
]
