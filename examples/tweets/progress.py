"""The demo's logging and progress display: the library's (``transactional.cli.logs``,
``transactional.cli.progress``)."""

from __future__ import annotations

from transactional.cli.logs import configure_logging, kv
from transactional.cli.progress import ProgressListener

__all__ = ["ProgressListener", "configure_logging", "kv"]
