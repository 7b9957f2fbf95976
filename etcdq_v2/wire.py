"""HTTP/1.1 to one etcd member: keep-alive requests and a streaming watch.

Why not urllib3 (or http.client) here: a profile of consumers draining a
queue showed the client's CPU, not etcd's, to be the wall.  Per keep-alive
PUT, urllib3's PoolManager cost 295 µs of client CPU and http.client 154 µs
(its header parsing goes through the email package); etcd's replies are
simple enough that reading them directly costs a fraction of that
(bench/README.md has the figures).  We need nothing urllib3 adds: its
retries are exactly what must be off (see transport.py).

A :class:`Connection` is one socket with a read buffer.  Each thread keeps
one per member (keep-alive).  The streaming watch reads its socket in large
blocks, so one system call serves many of the small events etcd sends.
"""
from __future__ import annotations

import base64
import socket
import ssl
import threading
from typing import Dict, Iterator, Optional, Tuple
from urllib.parse import urlsplit

from .errors import ConfigError

_BLOCK = 1 << 16


class NotSent(Exception):
    """The request never reached the member (connection refused): safe to resend."""


class Lost(Exception):
    """The request may have reached the member, but no (complete) reply came back."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class TLSFailed(Exception):
    """The TLS handshake failed (wrong CA, missing client certificate)."""


def tls_context(ca_cert: Optional[str], cert: Optional[str],
                key: Optional[str]) -> ssl.SSLContext:
    """A verifying context: the given CA, else the system's; never unverified."""
    try:
        context = ssl.create_default_context(cafile=ca_cert)
        if cert:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS files: {exc}") from None
    if key and not cert:
        raise ConfigError("a client key was given without its certificate")
    return context


class Response:
    """Status, the headers we use (lower-case names), and the body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: Dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class Connection:
    """One socket to a member, with a read buffer.

    The buffer is a bytearray read from an offset, so a large listing (tens
    of MB at 100,000 pending items) is read in time linear in its size.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()
        self._pos = 0
        self.closed = False

    def exchange(self, request: bytes) -> Response:
        self.sock.sendall(request)
        status, headers = self.read_head()
        if "chunked" in headers.get("transfer-encoding", ""):
            body = b"".join(self.chunks())
        else:
            body = self._take(int(headers.get("content-length", "0")))
        return Response(status, headers, body)

    def read_head(self) -> Tuple[int, Dict[str, str]]:
        head = self._take_until(b"\r\n\r\n").decode("latin-1")
        status_line, *lines = head.split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(status_line.split(" ", 2)[1]), headers

    def chunks(self) -> Iterator[bytes]:
        """The chunks of a chunked body, as they arrive, until the last one."""
        while True:
            size = int(self._take_until(b"\r\n").split(b";")[0] or b"0", 16)
            if size == 0:
                self._take_until(b"\r\n")  # the empty trailer
                return
            chunk = self._take(size)
            self._take_until(b"\r\n")
            yield chunk

    def lines(self) -> Iterator[bytes]:
        """Each non-empty line of a chunked body; ends with the body or close()."""
        pending = b""
        for data in self.chunks():
            pending += data
            if b"\n" in pending:
                *complete, pending = pending.split(b"\n")
                yield from (line for line in complete if line)

    def close(self) -> None:
        """Also unblocks a reader in another thread."""
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _take(self, length: int) -> bytes:
        while len(self._buffer) - self._pos < length:
            self._fill()
        data = bytes(self._buffer[self._pos:self._pos + length])
        self._pos += length
        return data

    def _take_until(self, marker: bytes) -> bytes:
        """The bytes up to ``marker``, which is consumed too."""
        while True:
            end = self._buffer.find(marker, self._pos)
            if end >= 0:
                data = bytes(self._buffer[self._pos:end])
                self._pos = end + len(marker)
                return data
            self._fill()

    def _fill(self) -> None:
        if self._pos > _BLOCK:  # drop what was read, now and then
            del self._buffer[:self._pos]
            self._pos = 0
        block = self.sock.recv(_BLOCK)
        if not block:
            raise Lost("the member closed the connection")
        self._buffer += block


class Member:
    """Keep-alive connections to one member's client URL, one per thread."""

    def __init__(self, url: str, *, tls: Optional[ssl.SSLContext],
                 username: Optional[str], password: Optional[str]) -> None:
        parts = urlsplit(url)
        self.url = url
        self.host, self.port = parts.hostname or "", parts.port or 0
        self.tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        self._headers = f"Host: {self.host}:{self.port}\r\n"
        if username is not None:
            token = base64.b64encode(f"{username}:{password}".encode()).decode()
            self._headers += f"Authorization: Basic {token}\r\n"
        self._local = threading.local()

    def request(self, method: str, path: str, body: Optional[str],
                timeout: float) -> Response:
        """One request on this thread's keep-alive connection."""
        connection = self._connection(timeout)
        if body is None:
            request = f"{method} {path} HTTP/1.1\r\n{self._headers}\r\n".encode("ascii")
        else:
            data = body.encode("ascii")  # form-encoded: ASCII by construction
            request = (f"{method} {path} HTTP/1.1\r\n{self._headers}Content-Type: "
                       f"application/x-www-form-urlencoded\r\nContent-Length: {len(data)}"
                       "\r\n\r\n").encode("ascii") + data
        try:
            response = connection.exchange(request)
        except socket.timeout:
            self._drop()
            raise Lost("timed out waiting for the reply", timed_out=True) from None
        except (OSError, ValueError, IndexError, Lost) as exc:
            self._drop()
            raise Lost(f"{type(exc).__name__}: {exc}") from None
        if response.headers.get("connection", "").lower() == "close":
            self._drop()
        return response

    def stream(self, path: str, idle_timeout: Optional[float],
               connect_timeout: float) -> Tuple[Connection, int, Dict[str, str]]:
        """Send a streaming GET on a socket of its own; (connection, status, headers)."""
        connection = Connection(self._connect(connect_timeout))
        request = f"GET {path} HTTP/1.1\r\n{self._headers}Connection: close\r\n\r\n"
        try:
            connection.sock.sendall(request.encode("ascii"))
            status, headers = connection.read_head()
            connection.sock.settimeout(idle_timeout)
            return connection, status, headers
        except (OSError, ValueError, IndexError, Lost) as exc:
            connection.close()
            raise Lost(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._drop()

    def _connection(self, timeout: float) -> Connection:
        connection: Optional[Connection] = getattr(self._local, "connection", None)
        if connection is None:
            connection = Connection(self._connect(timeout))
            self._local.connection = connection
        else:
            connection.sock.settimeout(timeout)
        return connection

    def _connect(self, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise NotSent(f"cannot connect: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is None:
            return sock
        try:
            return self.tls.wrap_socket(sock, server_hostname=self.host)
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise TLSFailed(f"certificate verify failed: {exc.verify_message}") from None
        except ssl.SSLError as exc:
            sock.close()
            raise TLSFailed(str(exc)) from None
        except OSError as exc:
            sock.close()
            raise TLSFailed(f"handshake failed: {exc}") from None

    def _drop(self) -> None:
        connection: Optional[Connection] = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()
