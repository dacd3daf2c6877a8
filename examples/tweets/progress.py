"""The demo's logging and progress display: the library's (``transactional.cli.logs``,
``transactional.cli.progress``, ``transactional.logfmt``)."""

from __future__ import annotations

from transactional.cli.logs import configure_logging
from transactional.cli.progress import ProgressListener
from transactional.logfmt import kv

__all__ = ["ProgressListener", "configure_logging", "kv"]
