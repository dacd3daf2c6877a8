"""The engine's scheduler pools on a real Spark session (``transactional.spark.session``'s
fair scheduler): the jobs of the oldest txid being processed, and of every commit, run
in ``FIRST_POOL``; the other attempts' jobs in Spark's default pool. Which pool each
stage ran in is read back from Spark's own status store."""

from __future__ import annotations

import threading
from typing import Any

from tests.witness import spark_settled
from transactional.spark.engine import FIRST_POOL, SparkEngine, pool_defined


def pools_of(spark: Any, group: str) -> list[str]:
    """The pool of each stage of each job Spark ran in ``group``, in job order."""
    jsc = spark_settled(spark).sparkContext._jsc.sc()
    store, tracker = jsc.statusStore(), spark.sparkContext.statusTracker()
    pools = []
    for job in sorted(tracker.getJobIdsForGroup(group)):
        info = tracker.getJobInfo(job)
        assert info is not None
        pools += [store.lastStageAttempt(stage).schedulingPool() for stage in info.stageIds]
    return pools


def test_the_session_defines_the_first_pool(spark: Any) -> None:
    assert spark.sparkContext.getConf().get("spark.scheduler.mode") == "FAIR"
    assert pool_defined(spark, FIRST_POOL) == FIRST_POOL
    assert pool_defined(spark, "no-such-pool") is None


def test_the_oldest_attempt_being_processed_and_commits_go_first(spark: Any) -> None:
    engine = SparkEngine(spark)
    younger_waits, older_done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def younger() -> None:
        try:
            with engine.job_group("pools-txid-7", txid=7):
                engine.collect({"while 5 is processed": spark.range(10)})
                younger_waits.set()
                older_done.wait(60)
                engine.collect({"once 5 is done": spark.range(10)})
        except BaseException as exc:  # reported to the test's thread
            failures.append(exc)
            younger_waits.set()

    with engine.job_group("pools-txid-5", txid=5):
        thread = threading.Thread(target=younger)
        thread.start()
        assert younger_waits.wait(60)
        engine.collect({"oldest": spark.range(10)})
    older_done.set()
    thread.join(60)
    assert not failures
    with engine.job_group("pools-commit-5"):  # a commit: no txid, always first
        engine.collect({"commit": spark.range(10)})
    assert pools_of(spark, "pools-txid-5") == [FIRST_POOL]
    assert pools_of(spark, "pools-txid-7") == ["default", FIRST_POOL]
    assert pools_of(spark, "pools-commit-5") == [FIRST_POOL]


def test_materialising_is_placed_too_and_leaving_the_group_clears_the_pool(spark: Any) -> None:
    engine = SparkEngine(spark)
    sc = spark.sparkContext
    with engine.job_group("pools-materialise-3", txid=3):
        engine.materialise([spark.range(100)], digest=True)
        assert sc.getLocalProperty("spark.scheduler.pool") == FIRST_POOL
    assert sc.getLocalProperty("spark.scheduler.pool") is None
    assert sc.getLocalProperty("spark.jobGroup.id") is None
    assert pools_of(spark, "pools-materialise-3") == [FIRST_POOL]


def test_leaving_a_group_gives_the_thread_its_own_pool_and_group_back(spark: Any) -> None:
    """The warm-up's group runs on the caller's thread: a user's own pool and job group
    there hold again once it ends, on a session with the pool and on one without."""
    sc = spark.sparkContext
    for first_pool in (FIRST_POOL, None):
        engine = SparkEngine(spark)
        engine.first_pool = first_pool
        sc.setJobGroup("users-group", "the user's jobs")
        sc.setLocalProperty("spark.scheduler.pool", "users-pool")
        try:
            with engine.job_group(f"pools-warm-{first_pool}"):
                expected = "users-pool" if first_pool is None else FIRST_POOL
                assert sc.getLocalProperty("spark.scheduler.pool") == expected
                assert sc.getLocalProperty("spark.jobGroup.id") == f"pools-warm-{first_pool}"
            assert sc.getLocalProperty("spark.scheduler.pool") == "users-pool"
            assert sc.getLocalProperty("spark.jobGroup.id") == "users-group"
            assert sc.getLocalProperty("spark.job.description") == "the user's jobs"
        finally:
            for key in ("spark.scheduler.pool", "spark.jobGroup.id", "spark.job.description"):
                sc.setLocalProperty(key, None)


def test_without_the_pool_every_job_stays_in_the_default_pool(spark: Any) -> None:
    """A session whose scheduler lacks the pool (FIFO, or a fair scheduler with an
    allocation file of its own): the engine leaves the pool property alone."""
    engine = SparkEngine(spark)
    engine.first_pool = None  # what __init__ finds on such a session
    with engine.job_group("pools-none-2", txid=2):
        engine.collect({"x": spark.range(10)})
        assert spark.sparkContext.getLocalProperty("spark.scheduler.pool") is None
    assert pools_of(spark, "pools-none-2") == ["default"]
