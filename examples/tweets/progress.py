"""The demo's logging: structured ``key=value`` lines that stay quiet unless asked. Its
progress display is the library's (``transactional.progress``)."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from transactional.progress import ProgressListener, kv

__all__ = ["ProgressListener", "configure_logging", "kv"]


def configure_logging(verbosity: int, stream: TextIO | None = None) -> None:
    """Warnings only by default; ``-v`` adds our info, ``-vv`` our debug, ``-vvv`` also
    the libraries' debug (py4j logs every call at that level)."""
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
    for noisy in ("py4j", "kazoo", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbosity >= 3 else logging.WARNING)
