"""What a client may hold of the library's two HTTP servers (the dashboard, the metrics).

Both are the standard library's servers, with a thread per connection.  A
client that opens connections and sends nothing (or a byte now and then)
would hold a thread and a file descriptor each for as long as it liked, and
no token helps: a request is checked once its headers are read.  So:

* **a deadline per request**: from the moment the server waits for a request
  (on a new connection, or for the next one on a kept-alive connection) its
  line, headers and body must all arrive within ``timeout`` seconds, however
  slowly they trickle in; else the connection is closed.  Each send of an
  answer has ``timeout`` seconds too.
* **a bound on connections**: at most ``max_connections`` are served at once.
  One more is answered ``503`` and closed at once, by the accepting thread:
  it gets no thread, and waits in no queue.

A loopback page polling every few seconds, or a Prometheus scrape, needs one
connection each, far from both limits.
"""
from __future__ import annotations

import io
import logging
import math
import socket
import socketserver
import threading
import time
from typing import Any, Optional

from .errors import ConfigError

log = logging.getLogger("etcdq_v2.httpd")

#: Seconds a request may take to arrive (and a kept-alive connection may sit idle).
DEFAULT_TIMEOUT = 10.0
#: Connections served at once; more are refused.
DEFAULT_MAX_CONNECTIONS = 64
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
         b"Content-Length: 32\r\nConnection: close\r\n\r\ntoo many connections: try again\n")


def check_limits(timeout: float, max_connections: int) -> None:
    """ConfigError unless ``timeout`` is a number of seconds > 0 and ``max_connections`` >= 1."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 < timeout < math.inf:
        raise ConfigError(f"connection timeout must be a number of seconds > 0, "
                          f"not {timeout!r}")
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
            or max_connections < 1:
        raise ConfigError(f"max_connections must be a whole number >= 1, "
                          f"not {max_connections!r}")


class LimitedServer(socketserver.ThreadingMixIn):
    """A mixin before a ``socketserver`` server: a thread per connection, at most
    ``max_connections`` of them; call :meth:`limit` before serving."""

    daemon_threads = True   # a connection in progress never holds the process up
    block_on_close = False
    request_queue_size = 128  # listen()'s backlog: a burst waits for accept(), not SYN retries
    connection_timeout = DEFAULT_TIMEOUT
    _slots = threading.BoundedSemaphore(DEFAULT_MAX_CONNECTIONS)

    def limit(self, timeout: float, max_connections: int) -> None:
        check_limits(timeout, max_connections)
        self.connection_timeout = float(timeout)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            _refuse(request)
            self.shutdown_request(request)  # type: ignore[attr-defined]  # the server's
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection's error: logged, never printed on stderr (the default)."""
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


def _refuse(request: socket.socket) -> None:
    """A 503 if the socket takes it at once; never a wait for this client."""
    try:
        request.setblocking(False)
        request.send(_BUSY)
    except OSError:
        pass


class DeadlineReader(io.RawIOBase):
    """A connection's input, read against the current request's deadline
    (:meth:`restart` sets it); past it, reads raise TimeoutError."""

    def __init__(self, connection: socket.socket, timeout: float) -> None:
        super().__init__()
        self._connection = connection
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        connection.settimeout(timeout)

    def restart(self) -> None:
        """A new request is awaited: it has ``timeout`` seconds from now."""
        self._deadline = time.monotonic() + self._timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> Optional[int]:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took longer than its deadline")
        self._connection.settimeout(left)
        try:
            return self._connection.recv_into(buffer)
        finally:
            self._connection.settimeout(self._timeout)  # for the answer's sends


def deadline_input(handler: socketserver.StreamRequestHandler) -> DeadlineReader:
    """Replace ``handler.rfile`` (made by its setup()) by one read against deadlines."""
    server: Any = handler.server
    reader = DeadlineReader(handler.connection, server.connection_timeout)
    handler.rfile.close()  # else the socket's file descriptor outlives its close()
    handler.rfile = io.BufferedReader(reader)
    return reader
