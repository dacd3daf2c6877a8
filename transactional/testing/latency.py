"""A TCP proxy on loopback that delays every request by a fixed time, as a server a few
milliseconds away would, and counts the requests in flight at once: what the tests and
the benchmark use to put a latency-bound commit path in front of a real Redis, and to
see from outside the runner how many connections waited on Redis at once (every request
counts: a commit's, and a new connection's handshake).

    with LatencyProxy(port_of_redis, delay_s=0.02) as proxy:
        ...  # clients connect to proxy.port
    proxy.most_in_flight  # 2 or more: two connections waited for replies at once
    proxy.wait_idle(30)  # every client gone and all it sent delivered (after a kill)

A connection's request is "in flight" from the moment its bytes leave for the server
(after the delay) until the first bytes of a reply come back. Only the client-to-server
direction is delayed, by ``delay_s`` per chunk read: one round trip costs ``delay_s``
more than it would on loopback.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import suppress


class LatencyProxy:
    def __init__(self, target_port: int, delay_s: float, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        self.most_in_flight = 0
        self._in_flight: set[int] = set()
        self._open = 0  # connections whose requests are still being read or delivered
        self._lock = threading.Condition()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []

    def __enter__(self) -> LatencyProxy:
        threading.Thread(target=self._accept, daemon=True, name="latency-accept").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def wait_idle(self, timeout_s: float) -> None:
        """Wait until no client is connected and every byte a client sent before it went
        (a killed process's last request, still held for its delay) has reached the
        server: what a reader of the server's state after a kill must wait for."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._open == 0, timeout_s):
                raise TimeoutError(f"{self._open} connection(s) still open after {timeout_s} s")

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
                self._open += 1
            key = client.fileno()
            threading.Thread(target=self._requests, args=(client, server, key), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, key), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket, key: int) -> None:
        try:
            while data := client.recv(65536):
                time.sleep(self.delay_s)
                with self._lock:
                    self._in_flight.add(key)
                    self.most_in_flight = max(self.most_in_flight, len(self._in_flight))
                server.sendall(data)
        except OSError:
            pass
        finally:
            _shut(server)
            with self._lock:
                self._open -= 1
                self._lock.notify_all()

    def _replies(self, server: socket.socket, client: socket.socket, key: int) -> None:
        try:
            while data := server.recv(65536):
                with self._lock:
                    self._in_flight.discard(key)
                client.sendall(data)
        except OSError:
            pass
        finally:
            _shut(client)


def _shut(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
