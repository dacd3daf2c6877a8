"""The tests' TCP proxy (``transactional.testing.proxy``) does to a connection what each
of its faults says, seen from both ends: a plain socket client and a line server that
records every line it received and answers each with ``ok <line>``."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import suppress

import pytest

from transactional.testing.proxy import TcpProxy
from transactional.testing.servers import free_port

#: Long enough for a reply on loopback to arrive, short enough to call silence silence.
QUIET_S = 1.0


class LineServer:
    """Answers every line ``x`` with ``ok x``, and records the lines."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received: list[bytes] = []
        self.got = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with suppress(OSError), conn, conn.makefile("rb") as lines:
            for line in lines:
                with self.got:
                    self.received.append(line.strip())
                    self.got.notify_all()
                conn.sendall(b"ok " + line)

    def wait_received(self, line: bytes, timeout: float = 10) -> None:
        with self.got:
            assert self.got.wait_for(lambda: line in self.received, timeout), self.received


@pytest.fixture
def server() -> Iterator[LineServer]:
    s = LineServer()
    yield s
    s.listener.close()


def connect(proxy: TcpProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.settimeout(QUIET_S)
    return sock


def ask(sock: socket.socket, line: bytes) -> bytes:
    sock.sendall(line + b"\n")
    return sock.recv(1024)


def silent(sock: socket.socket) -> bool:
    """Nothing arrives within ``QUIET_S`` (and the connection is not closed)."""
    try:
        data = sock.recv(1024)
    except TimeoutError:
        return True
    raise AssertionError(f"not silent: {data!r} arrived")


def was_reset(sock: socket.socket) -> bool:
    """A reset arrives (not an end of stream, not silence)."""
    sock.settimeout(10)
    try:
        data = sock.recv(1024)
    except ConnectionResetError:
        return True
    raise AssertionError(f"no reset: {data!r} arrived")


def test_it_forwards_both_ways_and_counts_what_it_carried(server: LineServer) -> None:
    with TcpProxy(server.port) as proxy, connect(proxy) as sock:
        assert ask(sock, b"a") == b"ok a\n"
        assert ask(sock, b"bb") == b"ok bb\n"
    assert server.received == [b"a", b"bb"]
    assert proxy.stats["forwarded_up"] == len(b"a\nbb\n")
    assert proxy.stats["forwarded_down"] == len(b"ok a\nok bb\n")
    assert proxy.stats["connections"] == 1


def test_it_keeps_the_first_reply_of_each_connection(server: LineServer) -> None:
    with TcpProxy(server.port) as proxy:
        with connect(proxy) as sock:
            assert ask(sock, b"one") == b"ok one\n"
            assert ask(sock, b"two") == b"ok two\n"
        with connect(proxy) as sock:
            assert ask(sock, b"three") == b"ok three\n"
    assert proxy.greetings == [b"ok one\n", b"ok three\n"]


def test_it_listens_on_the_port_it_is_given(server: LineServer) -> None:
    """A port chosen before the proxy exists (a broker that advertises it is configured
    first) is the one it listens on."""
    port = free_port()
    with TcpProxy(server.port, port=port) as proxy:
        assert proxy.port == port
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            assert ask(sock, b"here") == b"ok here\n"


def test_a_delayed_request_is_held_in_flight_and_then_delivered(server: LineServer) -> None:
    with TcpProxy(server.port, delay_s=QUIET_S * 3) as proxy, connect(proxy) as sock:
        sock.sendall(b"slow\n")
        proxy.wait_in_flight(b"slow", 10)
        assert server.received == []  # held: not at the server yet
        sock.settimeout(30)
        assert sock.recv(1024) == b"ok slow\n"
    assert proxy.most_in_flight == 1


def test_only_the_requests_holding_the_bytes_named_are_delayed(server: LineServer) -> None:
    with TcpProxy(server.port, delay_s=60) as proxy:
        proxy.delay_only = b"slow"
        with connect(proxy) as fast, connect(proxy) as slow:
            slow.sendall(b"slow\n")
            proxy.wait_in_flight(b"slow", 10)
            assert ask(fast, b"fast") == b"ok fast\n"  # not held behind the other
            assert server.received == [b"fast"]  # the slow one is still held


def test_a_held_request_waits_until_released_and_the_others_go_on(server: LineServer) -> None:
    with TcpProxy(server.port) as proxy:
        proxy.hold(b"late")
        with connect(proxy) as fast, connect(proxy) as late:
            late.sendall(b"late\n")
            proxy.wait_in_flight(b"late", 10)
            assert ask(fast, b"fast") == b"ok fast\n"  # not held behind the other
            assert silent(late)
            assert server.received == [b"fast"]  # held: not at the server yet
            proxy.release()
            late.settimeout(10)
            assert late.recv(1024) == b"ok late\n"
            assert ask(late, b"late again") == b"ok late again\n"  # nothing held now
        assert server.received == [b"fast", b"late", b"late again"]


def test_half_open_delivers_the_request_and_loses_its_reply(server: LineServer) -> None:
    with TcpProxy(server.port) as proxy, connect(proxy) as sock:
        assert ask(sock, b"before") == b"ok before\n"
        proxy.half_open()
        sock.sendall(b"script\n")
        server.wait_received(b"script")  # it took effect at the server...
        assert proxy.wait_lost_reply(b"script", 10) == b"script\n"  # ...its reply is gone
        assert silent(sock)
        proxy.heal()
        assert was_reset(sock)  # its stream has a hole: reset, never resumed
        with connect(proxy) as again:
            assert ask(again, b"after") == b"ok after\n"
    assert proxy.stats["discarded_down"] == len(b"ok script\n")
    assert proxy.stats["resets"] == 1


def test_half_open_for_some_requests_loses_only_their_replies(server: LineServer) -> None:
    with TcpProxy(server.port) as proxy:
        proxy.half_open(b"commit")
        with connect(proxy) as sock:
            assert ask(sock, b"hello") == b"ok hello\n"  # answered
            sock.sendall(b"commit 1\n")
            assert proxy.wait_lost_reply(b"commit", 10) == b"commit 1\n"
            server.wait_received(b"commit 1")  # it reached the server
            assert silent(sock)  # its reply did not come back


def test_a_black_hole_carries_nothing_on_any_connection_until_healed(server: LineServer) -> None:
    with TcpProxy(server.port) as proxy, connect(proxy) as old:
        assert ask(old, b"one") == b"ok one\n"
        proxy.black_hole()
        old.sendall(b"lost\n")
        with connect(proxy) as new:  # accepted, but nothing goes on
            new.sendall(b"also lost\n")
            assert silent(old) and silent(new)
            proxy.heal()
            assert was_reset(old) and was_reset(new)
        with connect(proxy) as healed:
            assert ask(healed, b"two") == b"ok two\n"
    assert server.received == [b"one", b"two"]
    assert proxy.stats["discarded_up"] == len(b"lost\nalso lost\n")


def test_drop_silences_the_open_connections_only(server: LineServer) -> None:
    with TcpProxy(server.port) as proxy, connect(proxy) as stale:
        assert ask(stale, b"one") == b"ok one\n"
        proxy.drop()
        stale.sendall(b"lost\n")
        assert silent(stale)
        with connect(proxy) as fresh:
            assert ask(fresh, b"two") == b"ok two\n"
        proxy.heal()
        assert was_reset(stale)
    assert server.received == [b"one", b"two"]


def test_reset_resets_open_and_new_connections(server: LineServer) -> None:
    with TcpProxy(server.port) as proxy, connect(proxy) as sock:
        assert ask(sock, b"one") == b"ok one\n"
        proxy.reset()
        assert was_reset(sock)
        try:  # the reset may come before the connect returns, or at the first read
            with connect(proxy) as new:
                assert was_reset(new)
        except ConnectionResetError:
            pass
        proxy.heal()
        with connect(proxy) as healed:
            assert ask(healed, b"two") == b"ok two\n"
    assert proxy.stats["resets"] == 2
