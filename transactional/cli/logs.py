"""The commands' logging (``transactional`` and the demo): structured ``key=value``
lines on stderr (``kv``, one event a line) that stay quiet unless asked.

By default only warnings of our own show, and of the libraries only their errors:
kazoo's "Connection refused" per retry and py4j's chatter say, line after line, what
one line of ours says once (an unreachable store is one ``error:`` line naming the
setting to change). ``-v`` adds our info and the libraries' warnings and info; ``-vv``
our debug; ``-vvv`` the libraries' debug too (py4j logs every call at that level).
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from transactional._logfmt import kv

__all__ = ["LIBRARY_LOGGERS", "configure_logging", "kv", "quiet_spark_errors"]

#: Loggers of the libraries the commands drive.
LIBRARY_LOGGERS = ("kazoo", "py4j", "urllib3", "redis")

#: PySpark's loggers of each analysis error it raises (with the JVM's stack trace, in
#: handlers of their own): the run reports such an error in one line of its own.
SPARK_ERROR_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


def configure_logging(verbosity: int, stream: TextIO | None = None) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s.%(msecs)03d level=%(levelname)s logger=%(name)s %(message)s",
            "%Y-%m-%dT%H:%M:%S",
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    library = logging.ERROR if verbosity <= 0 else logging.DEBUG if verbosity >= 3 else logging.INFO
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(library)


def quiet_spark_errors(verbosity: int) -> None:
    """Unless ``-v``, silence ``SPARK_ERROR_LOGGERS``. Imports PySpark (their class is
    its own), so only a command that starts Spark calls it."""
    if verbosity > 0:
        return
    from pyspark.logger import PySparkLogger

    for name in SPARK_ERROR_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)
