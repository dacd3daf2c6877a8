"""A one-line event format for logs: ``event key=value ...``, grep-able and
machine-splittable, shared by the library's modules and the command line's."""

from __future__ import annotations


def kv(event: str, **fields: object) -> str:
    """``event key=value ...``: one grep-able, machine-splittable line per event."""
    parts = [event]
    for key, value in fields.items():
        text = str(value)
        parts.append(
            f"{key}={text!r}" if (" " in text or "=" in text or not text) else f"{key}={text}"
        )
    return " ".join(parts)
