"""``quietly``: for the runtime's steps that must not fail the step they serve."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("transactional.runner")


def quietly(fn: Callable[[], Any], what: str) -> Any:
    """``fn()``, or None with a warning if it raised: for what must not fail a step."""
    try:
        return fn()
    except Exception as exc:
        log.warning("%s failed error=%r", what, exc)
        return None
