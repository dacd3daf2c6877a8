"""The demo's logging and progress display: the library's (``transactional.logs``,
``transactional.progress``)."""

from __future__ import annotations

from transactional.logs import configure_logging
from transactional.progress import ProgressListener, kv

__all__ = ["ProgressListener", "configure_logging", "kv"]
