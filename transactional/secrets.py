"""Secrets never reach a log line, an error, a status output or a Spark job description:
every address that may carry a password is shown through ``redact_url``."""

from __future__ import annotations

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
