"""Secrets never reach a log line, an error, a status output or a Spark job description:
every address that may carry a password is shown through ``redact_url``."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``:
    ``redis://user:pw@host:6379/0`` -> ``redis://user:***@host:6379/0``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))


class _Masking(logging.Filter):
    """Replaces every secret it knows with ``***`` in the records of the loggers it is
    attached to (for libraries that log what they send, as kazoo does at DEBUG: its
    ``Auth`` request holds the digest password)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if any(secret in text for secret in self.secrets):
            for secret in self.secrets:
                text = text.replace(secret, "***")
            record.msg, record.args = text, None
        return True


_MASKING = _Masking()


def mask_in_logs(secret: str, *loggers: str) -> None:
    """From now on, ``secret`` shows as ``***`` in every record of ``loggers``."""
    _MASKING.secrets.add(secret)
    for name in loggers:
        logger = logging.getLogger(name)
        if _MASKING not in logger.filters:
            logger.addFilter(_MASKING)
