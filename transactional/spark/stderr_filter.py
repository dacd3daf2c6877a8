"""What stands between the Spark driver's JVM and this process's stderr: every byte as it
comes, except one line, the first time it makes up a whole line (``transactional.spark.session``
says which line and why).

Run as a script, ``python -I -S stderr_filter.py LINE``, with its stdin the pipe the JVM's
stderr goes into and its stdout the stderr the JVM would have had. It imports nothing of
the project (a script, not ``-m``: no package ``__init__``), so it starts in milliseconds
and holds little memory for as long as the JVM runs.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["DropFirst", "main"]


class DropFirst:
    """A byte stream, fed in chunks as they come, without the first occurrence of one
    whole line. Everything is given back at once except what may still become that line:
    the start of a line that is so far a prefix of it (a few dozen bytes at most, held
    until the next chunk or the end tells). After the line, every chunk passes as it is."""

    def __init__(self, line: bytes) -> None:
        self.line: bytes | None = line + b"\n"
        self.held = b""
        self.at_start = True  # the next byte starts a line

    def feed(self, chunk: bytes) -> bytes:
        if self.line is None:
            return chunk
        data, self.held, out = self.held + chunk, b"", []
        while data:
            if self.at_start and data.startswith(self.line):
                out.append(data[len(self.line) :])
                self.line = None
                break
            if self.at_start and self.line.startswith(data):
                self.held = data
                break
            end = data.find(b"\n") + 1 or len(data)
            out.append(data[:end])
            data, self.at_start = data[end:], data[end - 1 : end] == b"\n"
        return b"".join(out)

    def end(self) -> bytes:
        """What was held when the stream ends (a last line cut short)."""
        held, self.held = self.held, b""
        return held


def _write(data: bytes) -> None:
    while data:
        data = data[os.write(1, data) :]


def main(argv: list[str]) -> None:
    # Ctrl-C reaches the whole foreground group, this process too; the JVM ignores it
    # (PySpark starts it so) and so must the one carrying its stderr, or the JVM's last
    # lines would be lost. SIGTERM likewise: the JVM's shutdown then still shows. This
    # process ends when the last writer (the JVM, the Python workers it forked) closes
    # the pipe; SIGKILL (``transactional.faults.kill_process_tree``) ends it at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stream = DropFirst(argv[1].encode())
    try:
        while chunk := os.read(0, 1 << 16):
            _write(stream.feed(chunk))
        _write(stream.end())
    except OSError:  # stderr is gone: the JVM, writing there itself, would lose it too
        pass


if __name__ == "__main__":
    main(sys.argv)
