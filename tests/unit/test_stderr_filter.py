"""The filter between the driver's JVM and stderr (``transactional.spark.stderr_filter``): the
incubator warning left out the first time it is a whole line, wherever the pipe cuts
the stream into chunks; everything else passed on as it comes, byte for byte; and the
process carries on through Ctrl-C and SIGTERM until its input ends."""

from __future__ import annotations

import itertools
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from transactional.spark.session import INCUBATOR_WARNING, STDERR_FILTER
from transactional.spark.stderr_filter import DropFirst

WARNING = INCUBATOR_WARNING.encode() + b"\n"
REST = (
    b"2026-01-01T00:00:00 level=WARN logger=SparkContext a warning\n"
    b"WARNING: something else the JVM says\n"
    b"\r[Stage 0:>   (0 + 1) / 2]"
)


def filtered(chunks: list[bytes]) -> bytes:
    stream = DropFirst(INCUBATOR_WARNING.encode())
    return b"".join(stream.feed(chunk) for chunk in chunks) + stream.end()


def cut(data: bytes, *at: int) -> list[bytes]:
    bounds = [0, *at, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def test_the_warning_is_left_out_wherever_the_chunks_are_cut() -> None:
    data = b"a line before\n" + WARNING + REST
    for at in range(len(data) + 1):
        assert filtered(cut(data, at)) == b"a line before\n" + REST, at
    for at in range(len(data) - 2):
        assert filtered(cut(data, at, at + 2)) == b"a line before\n" + REST, at
    assert filtered([bytes([b]) for b in data]) == b"a line before\n" + REST


def test_only_the_first_whole_line_is_left_out() -> None:
    assert filtered([WARNING + REST + WARNING]) == REST + WARNING
    assert filtered([WARNING[:-1]]) == WARNING[:-1]  # not a whole line: the stream ended
    for other in (
        b"x" + WARNING,  # not at a line's start
        WARNING[:-1] + b", jdk.incubator.foreign\n",  # another line that starts the same
        WARNING.replace(b"vector", b"vectors"),
        WARNING[:20] + b"\n",
    ):
        assert filtered([other, REST]) == other + REST
        assert filtered([bytes([b]) for b in other + REST]) == other + REST


def test_nothing_is_held_that_cannot_be_the_warning() -> None:
    stream = DropFirst(INCUBATOR_WARNING.encode())
    assert stream.feed(b"a line cut in") == b"a line cut in"
    assert stream.feed(b" two, WARNING: Using\n") == b" two, WARNING: Using\n"
    assert stream.feed(b"WARNING: Using") == b""  # may still be the warning: held
    assert stream.feed(b" less\n") == b"WARNING: Using less\n"
    assert stream.feed(WARNING) == b""
    assert stream.feed(WARNING) == WARNING  # once left out, everything passes as it is


def read_some(out: int, deadline: float) -> bytes:
    ready, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        pytest.fail("the filter passed nothing on before the deadline")
    return os.read(out, 1 << 16)


def test_the_process_passes_lines_as_they_come_and_outlives_ctrl_c_and_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(STDERR_FILTER), INCUBATOR_WARNING],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(WARNING + b"first\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        got = b""
        while got != b"first\n":  # passed on while the input is still open
            got += read_some(proc.stdout.fileno(), deadline)
            assert b"first\n".startswith(got), got
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGTERM)
        proc.stdin.write(b"after the signals\n")
        proc.stdin.close()
        assert proc.stdout.read() == b"after the signals\n"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
