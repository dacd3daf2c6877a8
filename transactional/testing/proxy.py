"""A TCP proxy on loopback that the tests control: it forwards a client's connections to
one server and can, at any moment, delay them or break them the ways a network does.
The tests put it between the runner and ZooKeeper, Redis or Kafka; the benchmark uses
its delay to put a latency-bound commit path in front of a real Redis.

    with TcpProxy(port_of_redis) as proxy:
        ...                       # clients connect to proxy.port
        proxy.half_open()         # requests still reach the server; replies are lost
        proxy.wait_lost_reply(b"EVALSHA", 30)  # seen: a script ran, its reply never came
        proxy.heal()              # every connection that lost a byte is reset

The faults (each stays until ``heal()`` or another fault replaces it):

- ``delay_s``: every chunk a client sends waits this long before it goes on (one
  round trip costs ``delay_s`` more than on loopback); set at any time. With
  ``delay_only`` set, only the chunks that hold those bytes wait (one client's
  requests, by the client id in them), the rest go on at once.
- ``hold(request)``: every chunk holding ``request`` waits in the proxy until
  ``release()``, then goes on (a request held on the wire for as long as the test
  needs: one sent before a failover, delivered after it); the rest go on at once.
- ``drop()``: the connections open now go silent both ways (their bytes discarded);
  new connections work: a stale connection, e.g. behind a NAT that forgot it.
- ``black_hole()``: every connection silent, new ones too (accepted, never connected
  on): a partition; the peers see nothing, only their timeouts end it.
- ``half_open()``: what clients send reaches the server; what it answers is
  discarded: a lost reply, whose request may well have taken effect. ``half_open(only)``
  loses only the replies to requests holding ``only`` (a commit's, not a handshake's).
- ``reset()``: every open connection reset (RST), and each new one at once, as a
  server host that lost its state would answer.
- ``heal()``: back to forwarding. A connection that lost bytes is reset then (its byte
  stream has a hole: carrying on would corrupt it), as TCP would once its retransmits
  ran out.

What happened is counted where a test can see it without trusting the code under test
(``stats``: connections, bytes forwarded and discarded each way, resets) and recorded
(``discarded``: the requests that reached the server while their replies were lost;
``greetings``: the first reply of each connection, such as the session a ZooKeeper
server gave its client).
``most_in_flight`` is the most connections that waited on a reply at once: a request is
in flight from the moment its bytes leave for the server until the first bytes of a
reply come back.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from enum import Enum


class Fault(Enum):
    """What the proxy does to the bytes it carries. ``DROP`` is the proxy's state only
    for the record: the links open at ``drop()`` carry it themselves (``dropped``), and
    a connection made after it is forwarded as under ``NONE``."""

    NONE = "none"
    DROP = "drop"
    BLACK_HOLE = "black_hole"
    HALF_OPEN = "half_open"
    RESET = "reset"


@dataclass(eq=False)
class _Link:
    """One client connection and its connection to the server."""

    client: socket.socket
    server: socket.socket | None
    #: Silent from now on (``drop``), whatever the proxy's fault later.
    dropped: bool = False
    #: It lost bytes: reset at ``heal()``.
    holed: bool = False
    in_flight: bool = False
    #: Requests forwarded under ``half_open``, their replies not seen yet.
    unanswered: list[bytes] = field(default_factory=list)


class TcpProxy:
    def __init__(
        self,
        target_port: int,
        delay_s: float = 0.0,
        target_host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """A proxy to ``target_host:target_port``, listening on loopback ``port`` (0: a
        free one; ``port`` says which)."""
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        #: Only the chunks holding these bytes are delayed (None: every chunk).
        self.delay_only: bytes | None = None
        self.fault = Fault.NONE
        self.most_in_flight = 0
        #: ``connections``, ``resets``, ``forwarded_up``/``down``, ``discarded_up``/``down``.
        self.stats: Counter[str] = Counter()
        #: Requests that reached the server while their replies were discarded.
        self.discarded: list[bytes] = []
        #: The first chunk the server sent on each connection, in the order they came.
        self.greetings: list[bytes] = []
        self._links: list[_Link] = []
        self._held: list[bytes] = []  # requests waiting out ``delay_s`` or a ``hold``
        self._hold: bytes | None = None
        self._lose_only: bytes | None = None
        self._released = threading.Event()
        self._open = 0  # connections whose requests are still being read or delivered
        self._lock = threading.Condition()
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()

    def __enter__(self) -> TcpProxy:
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._released.set()  # what a hold kept goes on, to connections about to close
        self._listener.close()
        with self._lock:
            for link in self._links:
                _close(link.client, link.server)

    # -- faults --------------------------------------------------------------------

    def hold(self, request: bytes) -> None:
        """Hold every chunk holding ``request`` in the proxy (read from its client, not
        sent on) until ``release()``."""
        with self._lock:
            self._released.clear()
            self._hold = request

    def release(self) -> None:
        """Send on what ``hold`` held, and hold nothing more."""
        with self._lock:
            self._hold = None
            self._released.set()

    def drop(self) -> None:
        with self._lock:
            for link in self._links:
                link.dropped = True
            self._set(Fault.DROP)

    def black_hole(self) -> None:
        self._set(Fault.BLACK_HOLE)

    def half_open(self, only: bytes | None = None) -> None:
        """What clients send reaches the server; its replies are lost: every reply, or
        with ``only``, the replies to requests holding those bytes (and what follows
        them on their connection), the other replies going on."""
        with self._lock:
            self._lose_only = only
        self._set(Fault.HALF_OPEN)

    def reset(self) -> None:
        with self._lock:
            self._set(Fault.RESET)
            for link in self._links:
                self._reset(link.client, link.server)

    def heal(self) -> None:
        with self._lock:
            self._set(Fault.NONE)
            for link in self._links:
                if link.holed:
                    self._reset(link.client, link.server)

    def _set(self, fault: Fault) -> None:
        with self._lock:
            self.fault = fault
            self._lock.notify_all()

    # -- witnesses -----------------------------------------------------------------

    def wait_idle(self, timeout_s: float) -> None:
        """Wait until no client is connected and every byte a client sent before it went
        (a killed process's last request, still held for its delay) has reached the
        server: what a reader of the server's state after a kill must wait for."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._open == 0, timeout_s):
                raise TimeoutError(f"{self._open} connection(s) still open after {timeout_s} s")

    def wait_lost_reply(self, request: bytes, timeout_s: float) -> bytes:
        """Wait until a request holding ``request`` has reached the server and its reply
        was discarded (``half_open``); that request."""

        def lost() -> bytes | None:
            return next((r for r in self.discarded if request in r), None)

        with self._lock:
            if not self._lock.wait_for(lambda: lost() is not None, timeout_s):
                raise TimeoutError(f"no reply to a request with {request!r} lost in {timeout_s} s")
            return lost() or b""

    def wait_in_flight(self, request: bytes, timeout_s: float) -> None:
        """Wait until a request holding ``request`` is held in the proxy by ``delay_s``
        or ``hold`` (read from its client, not yet sent on): the moment to break
        something else."""

        def held() -> bool:
            return any(request in data for data in self._held)

        with self._lock:
            if not self._lock.wait_for(held, timeout_s):
                raise TimeoutError(f"no request with {request!r} in flight in {timeout_s} s")

    # -- forwarding ----------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.stats["connections"] += 1
                fault = self.fault
            if fault is Fault.RESET:
                with self._lock:
                    self._reset(client, None)
                continue
            server = None
            if fault is not Fault.BLACK_HOLE:
                try:
                    server = socket.create_connection(self.target, timeout=5)
                except OSError:
                    _abort(client)
                    continue
                server.settimeout(None)
                server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server, holed=server is None)
            with self._lock:
                self._links.append(link)
                self._open += 1
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            if server is not None:
                threading.Thread(target=self._replies, args=(link,), daemon=True).start()

    def _silent(self, link: _Link) -> bool:
        return link.dropped or link.server is None or self.fault is Fault.BLACK_HOLE

    def _requests(self, link: _Link) -> None:
        try:
            while data := link.client.recv(65536):
                only, hold = self.delay_only, self._hold
                held = hold is not None and hold in data
                if held or (self.delay_s and (only is None or only in data)):
                    with self._lock:
                        self._held.append(data)
                        self._lock.notify_all()
                    if held:
                        self._released.wait()
                    else:
                        time.sleep(self.delay_s)
                    with self._lock:
                        self._held.remove(data)
                with self._lock:
                    if self._silent(link):
                        link.holed = True
                        self.stats["discarded_up"] += len(data)
                        continue
                    if self.fault is Fault.HALF_OPEN:
                        link.unanswered.append(data)
                    link.in_flight = True
                    in_flight = sum(1 for each in self._links if each.in_flight)
                    self.most_in_flight = max(self.most_in_flight, in_flight)
                    self.stats["forwarded_up"] += len(data)
                assert link.server is not None
                link.server.sendall(data)
        except OSError:
            pass
        finally:
            if link.server is not None:
                _shut(link.server)
            with self._lock:
                self._open -= 1
                self._links.remove(link)
                self._lock.notify_all()

    def _replies(self, link: _Link) -> None:
        assert link.server is not None
        first = True
        try:
            while data := link.server.recv(65536):
                with self._lock:
                    if first:
                        self.greetings.append(data)
                        first = False
                    link.in_flight = False
                    if self._silent(link) or self._loses_reply(link):
                        link.holed = True
                        self.stats["discarded_down"] += len(data)
                        self.discarded += link.unanswered  # their replies: lost
                        link.unanswered.clear()
                        self._lock.notify_all()
                        continue
                    link.unanswered.clear()
                    self.stats["forwarded_down"] += len(data)
                link.client.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                if not link.holed:
                    _shut(link.client)

    def _loses_reply(self, link: _Link) -> bool:
        """Under ``half_open``, whether the reply now coming on ``link`` is lost."""
        if self.fault is not Fault.HALF_OPEN:
            return False
        only = self._lose_only
        return only is None or link.holed or any(only in r for r in link.unanswered)

    def _reset(self, client: socket.socket, server: socket.socket | None) -> None:
        """RST to the client (SO_LINGER 0), and the server's side closed."""
        self.stats["resets"] += 1
        _abort(client)
        _close(server)


def _abort(sock: socket.socket) -> None:
    """Reset: with a zero linger, closing sends RST, not FIN. A thread blocked reading
    the socket holds it open until woken, which a read shutdown does (sending nothing)."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    _close(sock)


def _shut(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _close(*socks: socket.socket | None) -> None:
    for sock in socks:
        if sock is not None:
            with suppress(OSError):
                sock.close()
