"""Frozen configuration models. Components never read the environment; the CLI builds
these from flags and ``TRANSACTIONAL_*`` variables."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from transactional.types import Guarantee


class RunnerConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    topology_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    #: Transactions processed at once; commits stay strictly ordered.
    max_pending: int = Field(default=2, ge=1, le=64)
    #: Consecutive processed txids committed as one sink transaction, at most (one
    #: write per table, one Redis script, marked with the group's last txid). Groups
    #: form only from txids already processed when a commit is due; 1: every txid alone.
    max_group: int = Field(default=8, ge=1, le=64)
    #: How long a processed txid may wait for the txids after it that are still being
    #: processed, to commit with them in one group (0: commit what is processed now).
    group_wait_s: float = Field(default=0.0, ge=0)
    #: Attempts of one txid before the runner stops with ``PoisonBatchError``.
    max_attempts: int = Field(default=10, ge=1)
    #: Seconds an attempt may take to process, and again to commit, before its Spark
    #: jobs are cancelled and it counts as failed. None: no timeout.
    attempt_timeout_s: float | None = Field(default=300.0, gt=0)
    backoff_initial_s: float = Field(default=0.1, ge=0)
    backoff_max_s: float = Field(default=5.0, ge=0)
    #: How long to wait before asking ``is_ready`` again when it said no (or a new
    #: batch came out empty). Consecutive idle polls back off, doubling up to
    #: ``poll_max_s``; the first batch with data resets the interval.
    poll_interval_s: float = Field(default=1.0, gt=0)
    poll_max_s: float = Field(default=30.0, gt=0)
    #: Store a record count and a content checksum of every first emit (per partition)
    #: and stop the topology if a replay differs (transactional and partitioned spouts).
    check_determinism: bool = True
    #: How long to wait for leadership of the topology id before giving up; also how
    #: long to keep trying to get it back after losing it (session expiry, store
    #: restart). None: as long as it takes.
    leader_timeout_s: float | None = Field(default=None, gt=0)
    #: Times one run may lose leadership and get it back before it stops with
    #: ``LostLeadershipError``. Losing it to another runner always stops the run.
    max_reelections: int = Field(default=10, ge=0)
    #: Before the first txid, run the spout's ``sample_batch`` through the bolts and the
    #: committers' ``prepare`` once, committing nothing: the session's cold start is paid
    #: there, not by the first txids, and a broken contract fails before any txid is
    #: stored; it is a txid's work of its own (its cost: docs/concepts/topologies.md,
    #: "Warm-up"). None, the default: only for adaptive batch sizes (``--batch-size
    #: auto``), which read the first txids' latency; True or False: always or never. No
    #: effect when the spout gives no sample.
    warm_up: bool | None = None
    #: Seconds between the runner's status documents in the state store (what
    #: ``transactional status`` shows: txids in flight, the last error, records per
    #: second, lag); 0: publish none.
    status_interval_s: float = Field(default=2.0, ge=0)
    #: Serve Prometheus metrics of the run at ``http://metrics_host:metrics_port/metrics``
    #: while it lasts (``transactional.runtime.metrics``); None: no server.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    #: The address the metrics server binds: loopback by default; ``0.0.0.0`` to be
    #: scraped from other machines.
    metrics_host: str = "127.0.0.1"
    #: Send an OpenLineage run event for each attempt of a txid (START, then COMPLETE,
    #: FAIL or ABORT) naming the topology, the txid, the source's datasets and positions
    #: and the committers' datasets, through the OpenLineage client as its own settings
    #: configure it (``OPENLINEAGE_URL``, ...): docs/how-to/lineage.md. Needs
    #: openlineage-python (the ``lineage`` extra). Off: nothing is imported or sent.
    lineage: bool = False
    #: Where a new topology starts in its source (``--start-from``: ``earliest``,
    #: ``latest``, an ISO 8601 time, a Delta version, or ``KEY=OFFSET`` pairs), for a
    #: spout that reads it (``accepts_start_from``); refused on a topology id that
    #: already has state. None: the spout's own ``start``.
    start_from: str | None = None
    #: What the run promises about each record: ``exactly_once`` (the full protocol),
    #: ``at_least_once`` (nothing lost; a batch replayed after its sink write counts
    #: twice) or ``at_most_once`` (nothing counted twice; a failed batch is dropped and
    #: reported, never retried). Every spout and committer must be able to give it.
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    #: Check, before anything of a txid is committed, that every bolt accounted for each
    #: record it was given (carried, folded, dead-lettered or dropped on purpose).
    ledger: bool = True
    #: Refuse to start a topology with a bolt the ledger cannot check.
    ledger_strict: bool = False

    @model_validator(mode="after")
    def _backoff_order(self) -> RunnerConfig:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be >= backoff_initial_s")
        if self.poll_max_s < self.poll_interval_s:
            raise ValueError("poll_max_s must be >= poll_interval_s")
        return self

    def backoff(self, failures: int) -> float:
        """Seconds to wait before attempt ``failures + 1`` of a txid."""
        if failures <= 0:
            return 0.0
        return float(min(self.backoff_max_s, self.backoff_initial_s * 2 ** (failures - 1)))
