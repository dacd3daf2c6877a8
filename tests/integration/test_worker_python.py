"""The tests' executors import the installed PySpark, not the copies PySpark puts first
on their ``PYTHONPATH`` (``tests.jvm.worker_python``: a worker that imports from a zip
starts about 0.6 s slower and re-reads the zips at every task)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyspark

from tests.jvm import worker_python

INSTALLED = str(Path(pyspark.__file__).resolve())
#: What Spark puts first on its workers' PYTHONPATH (PythonUtils.sparkPythonPath).
SPARKS_OWN = [
    *sorted(str(p) for p in (Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip")),
    *sorted(str(p) for p in (Path(pyspark.__file__).parent / "jars").glob("spark-core_*.jar")),
]

WHERE = (
    "import pyspark, sys; print(pyspark.__file__); print([p for p in sys.path if '/pyspark/' in p])"
)


def _where(python: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*SPARKS_OWN, os.getcwd()])}
    done = subprocess.run(
        [python, "-c", WHERE], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def test_spark_puts_its_zips_first_and_the_tests_workers_python_drops_them() -> None:
    zipped = next(p for p in SPARKS_OWN if p.endswith("pyspark.zip"))
    plain = _where(sys.executable)
    assert plain == [f"{zipped}/pyspark/__init__.py", repr(SPARKS_OWN)]  # a plain worker's
    assert _where(worker_python()) == [INSTALLED, "[]"]


def test_the_suites_executors_run_the_installed_pyspark(spark: Any) -> None:
    from pyspark.sql import functions as F

    def where(_: object) -> str:
        import sys

        import pyspark

        return f"{pyspark.__file__} {[p for p in sys.path if '/pyspark/' in p]}"

    got = spark.range(2).select(F.udf(where, "string")("id")).distinct().collect()
    assert [row[0] for row in got] == [f"{INSTALLED} []"]
