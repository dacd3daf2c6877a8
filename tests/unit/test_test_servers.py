"""The test servers' ports: drawn below the kernel's ephemeral range, and a server is
never taken for started because another process listens on its port (two pytest-xdist
workers would then share one server without knowing)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from transactional.testing.servers import _Server, free_port


class Sleeper(_Server):
    """A process that never listens."""

    name = "sleeper"
    start_timeout_s = 2.0

    def __init__(self) -> None:
        super().__init__("sleeper-")

    def command(self) -> list[str]:
        return ["sleep", "60"]


def test_ports_are_drawn_below_the_ephemeral_range_and_are_free() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: it binds


def test_a_port_another_process_listens_on_is_not_taken_for_the_servers() -> None:
    server = Sleeper()
    taken = pytest.raises(RuntimeError, match=f"port {server.port} is held by another")
    with socket.create_server(("127.0.0.1", server.port)), taken:  # another's listener
        server.start()
    assert server.proc is None  # the process that never listened was stopped
    server.close()
