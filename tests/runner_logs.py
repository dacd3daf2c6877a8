"""What the runner says in its log, watched from the test's own process: each failed
attempt it reports (``FailedTxids``), or the first line holding some text (``Said``).
These are the runner's own words, so a test uses them to wait or to count its reports,
never as the witness that a fault fired (``tests.witness``)."""

from __future__ import annotations

import logging
import threading


class FailedTxids(logging.Handler):
    """Collects the runner's "txid failed" lines; ``seen`` is set at the first."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("txid failed"):
            self.messages.append(message)
            self.seen.set()


class Said(logging.Handler):
    """Watches ``logger`` (at INFO, for the ``with`` block) for a line holding ``text``:
    ``seen`` is set at the first."""

    def __init__(self, logger: str, text: str) -> None:
        super().__init__(logging.INFO)
        self.logger = logging.getLogger(logger)
        self.text = text
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()

    def __enter__(self) -> Said:
        self._level = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._level)
