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
import re
import socket
import ssl
import struct
import sys
import threading
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

from .errors import ConfigError

_BLOCK = 1 << 16
#: Where SO_RCVTIMEO takes a struct timeval (Windows takes milliseconds).
_KERNEL_TIMEOUTS = sys.platform.startswith("linux") or sys.platform == "darwin"
_STATUS = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?=[ \r]|$)")
#: The reply headers anything here reads (etcd sends several more).
_HEADER = re.compile(rb"\r\n(content-length|transfer-encoding|connection|x-etcd-index)"
                     rb"[ \t]*:[ \t]*([^\r]*?)[ \t]*(?=\r\n|$)", re.IGNORECASE)


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

    With ``kernel_timeouts`` the socket stays in blocking mode and the kernel
    enforces the timeout (SO_RCVTIMEO/SO_SNDTIMEO): Python's own timeout mode
    polls the socket before every send and receive, two more system calls per
    request.  A kernel timeout surfaces as BlockingIOError, not socket.timeout.
    """

    def __init__(self, sock: socket.socket, kernel_timeouts: bool = False) -> None:
        self.sock = sock
        self._buffer = bytearray()
        self._pos = 0
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._kernel_timeouts = kernel_timeouts and _KERNEL_TIMEOUTS and not self._tls
        self._timeout: Optional[float] = None if self._kernel_timeouts else sock.gettimeout()
        self.closed = False
        #: False once a reply ended the connection (``Connection: close``, or a
        #: body that ends when the member closes).
        self.reusable = True
        self.set_timeout(sock.gettimeout())  # in kernel mode: moves it to the kernel

    def set_timeout(self, timeout: Optional[float]) -> None:
        if timeout == self._timeout:  # a system call: skipped when nothing changes
            return
        if self._kernel_timeouts and timeout is not None:
            self.sock.settimeout(None)
            seconds = int(timeout)
            value = struct.pack("ll", seconds, int((timeout - seconds) * 1e6))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        else:
            self.sock.settimeout(timeout)
        self._timeout = timeout

    def receive(self, streaming: bool = False) -> Response:
        """The next reply on this connection.

        With ``streaming``, a 200 reply's body is left unread (see
        :meth:`blocks`); any other reply is read whole.
        """
        status, headers = self.read_head()
        while status < 200:  # an interim reply (100 Continue): the real one follows
            status, headers = self.read_head()
        if streaming and status == 200:
            return Response(status, headers, b"")
        body = self.read_body(status, headers)
        if self._pos > _BLOCK:  # an idle connection keeps no big listing
            self._compact()
        return Response(status, headers, body)

    def read_head(self) -> Tuple[int, Dict[str, str]]:
        """The status and the headers we use; one regular expression finds them all."""
        head = self._take_until(b"\r\n\r\n")
        status = _STATUS.match(head)
        if status is None:
            raise ValueError(f"not an HTTP/1 reply: {bytes(head[:40])!r}")
        headers = {name.lower().decode("ascii"): value.decode("latin-1")
                   for name, value in _HEADER.findall(head)}
        if status.group(1) == b"0" or "close" in headers.get("connection", "").lower():
            self.reusable = False  # HTTP/1.0 (etcd speaks 1.1) or the member said so
        return int(status.group(2)), headers

    def read_body(self, status: int, headers: Dict[str, str]) -> bytes:
        """The body, framed as RFC 9112 §6.3 says (we never send HEAD)."""
        if status in (204, 304):
            return b""
        encoding = headers.get("transfer-encoding")
        if encoding is not None:
            if encoding.lower() != "chunked":
                raise ValueError(f"unsupported Transfer-Encoding: {encoding}")
            return b"".join(self.chunks())
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ValueError(f"bad Content-Length: {length!r}")
            return self._take(int(length))
        self.reusable = False  # no length given: the body ends when the member closes
        return self._take_rest()

    def chunks(self) -> Iterator[bytes]:
        """The chunks of a chunked body, as they arrive, until the last one."""
        while True:
            size = int(self._take_until(b"\r\n").split(b";", 1)[0], 16)
            if size <= 0:
                if size < 0:
                    raise ValueError("negative chunk size")
                while self._take_until(b"\r\n"):
                    pass  # trailer fields, up to the empty line that ends the body
                return
            chunk = self._take(size)
            if self._take_until(b"\r\n"):
                raise ValueError("a chunk is longer than its size")
            yield chunk

    def blocks(self) -> Iterator[bytes]:
        """A chunked body as blocks of whole lines; ends with the body or close().

        A block holds every complete line received so far, so when events
        come fast one call (and one lock of the caller's) serves many.
        """
        pending = bytearray()
        for data in self.chunks():
            pending += data
            if len(self._buffer) > self._pos:
                continue  # more has arrived already: take it into this block
            end = pending.rfind(b"\n") + 1
            if end:
                yield bytes(pending[:end])
                del pending[:end]

    def interrupt(self) -> None:
        """Wake a reader blocked on this connection (from another thread).

        Only shuts the socket down: closing it here could let the operating
        system reuse its descriptor for a new connection while the reader is
        still about to wait on it.  The reader closes it (:meth:`close`).
        """
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.interrupt()
        self.sock.close()

    def _take(self, length: int) -> bytes:
        while len(self._buffer) - self._pos < length:
            if not self._fill():
                raise Lost("the member closed the connection")
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
            if not self._fill():
                raise Lost("the member closed the connection")

    def _take_rest(self) -> bytes:
        """Everything until the member closes the connection."""
        while self._fill():
            pass
        return self._take(len(self._buffer) - self._pos)

    def _compact(self) -> None:
        del self._buffer[:self._pos]
        self._pos = 0

    def _fill(self) -> bool:
        """Read what has arrived (waiting for it); False once the member closed."""
        if self._pos > _BLOCK:  # drop what was read, now and then
            self._compact()
        block = self.sock.recv(_BLOCK)
        self._buffer += block
        return bool(block)


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
        result = self._receive(0, self._send(0, method, path, body, timeout))
        if isinstance(result, Exception):
            raise result
        return result

    def request_all(self, requests: Sequence[Tuple[str, str, Optional[str]]],
                    timeout: float) -> List[Union[Response, Exception]]:
        """Send each request on a connection of its own, then read the replies.

        The member works on them at once, so their writes can share one raft
        entry batch and one WAL fsync.  A failed request comes back as its
        NotSent or Lost exception.
        """
        sent = [self._send(slot, method, path, body, timeout)
                for slot, (method, path, body) in enumerate(requests)]
        return [self._receive(slot, connection) for slot, connection in enumerate(sent)]

    def _send(self, slot: int, method: str, path: str, body: Optional[str],
              timeout: float) -> Union[Connection, Exception]:
        """The connection the request went out on, or why it did not."""
        try:
            connection = self._connection(slot, timeout)
            connection.sock.sendall(self._encode(method, path, body))
            return connection
        except NotSent as exc:
            return exc
        except OSError as exc:
            self._drop(slot)
            return Lost(f"{type(exc).__name__}: {exc}")

    def _encode(self, method: str, path: str, body: Optional[str]) -> bytes:
        if body is None:
            return f"{method} {path} HTTP/1.1\r\n{self._headers}\r\n".encode("ascii")
        data = body.encode("ascii")  # form-encoded: ASCII by construction
        return (f"{method} {path} HTTP/1.1\r\n{self._headers}Content-Type: "
                f"application/x-www-form-urlencoded\r\nContent-Length: {len(data)}"
                "\r\n\r\n").encode("ascii") + data

    def _receive(self, slot: int, connection: Union[Connection, Exception]
                 ) -> Union[Response, Exception]:
        if isinstance(connection, Exception):
            return connection
        try:
            response = connection.receive()
        except (socket.timeout, BlockingIOError):
            self._drop(slot)
            return Lost("timed out waiting for the reply", timed_out=True)
        except (OSError, ValueError, IndexError, Lost) as exc:
            self._drop(slot)
            return Lost(f"{type(exc).__name__}: {exc}")
        if not connection.reusable:
            self._drop(slot)
        return response

    def stream(self, path: str, idle_timeout: Optional[float],
               connect_timeout: float) -> Tuple[Connection, int]:
        """Send a streaming GET on a socket of its own; (connection, status)."""
        connection = Connection(self._connect(connect_timeout))
        request = f"GET {path} HTTP/1.1\r\n{self._headers}Connection: close\r\n\r\n"
        try:
            connection.sock.sendall(request.encode("ascii"))
            status, _ = connection.read_head()
            connection.set_timeout(idle_timeout)
            return connection, status
        except (OSError, ValueError, IndexError, Lost) as exc:
            connection.close()
            raise Lost(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        for slot in range(len(self._slots())):
            self._drop(slot)

    def _slots(self) -> List[Optional[Connection]]:
        slots: Optional[List[Optional[Connection]]] = getattr(self._local, "slots", None)
        if slots is None:
            slots = self._local.slots = []
        return slots

    def _connection(self, slot: int, timeout: float) -> Connection:
        slots = self._slots()
        while len(slots) <= slot:
            slots.append(None)
        connection = slots[slot]
        if connection is None:
            connection = slots[slot] = Connection(self._connect(timeout), kernel_timeouts=True)
        connection.set_timeout(timeout)
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

    def _drop(self, slot: int) -> None:
        slots = self._slots()
        connection = slots[slot] if slot < len(slots) else None
        if connection is not None:
            slots[slot] = None
            connection.close()
