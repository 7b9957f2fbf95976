"""HTTP/1.1 to one etcd member: pooled keep-alive requests and a streaming watch.

Why not urllib3 (or http.client) here: a profile of consumers draining a
queue showed the client's CPU, not etcd's, to be the wall.  Per keep-alive
PUT, urllib3's PoolManager cost 295 µs of client CPU and http.client 154 µs
(its header parsing goes through the email package); etcd's replies are
simple enough that reading them directly costs a fraction of that
(bench/README.md has the figures).  We need nothing urllib3 adds: its
retries are exactly what must be off (see transport.py).

A :class:`Connection` is one socket with a read buffer.  A :class:`Member`
keeps a pool of idle keep-alive connections that any thread may use: a
request takes one (or opens one), and gives it back only after reading the
whole reply.  Any failure or interruption while a request is in flight
closes its connection instead, so no connection is ever out of step.  The
streaming watch has a connection of its own, read in large blocks so that
one system call serves many of the small events etcd sends.  A pipeline
(:meth:`Member.pipeline`) sends many requests in order over several pooled
connections at once, reading the replies as they come, so that etcd commits
their writes together.

Failures come out as one of three exceptions; transport.py decides what
each means for the call:

* :class:`NotSent`: no byte of the request reached the member (connect
  refused, a TLS handshake cut short): safe to resend, whatever the method;
  :class:`Refused`, its kind for a refused connect, says nothing listens;
* :class:`Lost`: the request may have been applied, no full reply came;
* :class:`TLSFailed`: the certificate did not verify, or the peer sent a
  TLS alert (it refused our certificate, or its absence): no retry mends it.
"""
from __future__ import annotations

import base64
import re
import select
import socket
import ssl
import struct
import sys
import threading
import time
from collections import deque
from typing import (Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Set, Tuple,
                    TypeVar, Union)
from urllib.parse import urlsplit

from .errors import ConfigError

T = TypeVar("T")
_BLOCK = 1 << 16
#: Where SO_RCVTIMEO takes a struct timeval (Windows takes milliseconds).
_KERNEL_TIMEOUTS = sys.platform.startswith("linux") or sys.platform == "darwin"
_HAVE_POLL = hasattr(select, "poll")
_STATUS = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?=[ \r]|$)")
#: The reply headers anything here reads (etcd sends several more).
_HEADER = re.compile(rb"\r\n(content-length|transfer-encoding|connection|x-etcd-index)"
                     rb"[ \t]*:[ \t]*([^\r]*?)[ \t]*(?=\r\n|$)", re.IGNORECASE)


class NotSent(Exception):
    """The request never reached the member (connection refused): safe to resend."""


class Refused(NotSent):
    """The member refused the connection: nothing listens on its port (a timed-out
    connect or an unanswered probe is a plain NotSent: something may be there)."""


class Lost(Exception):
    """The request may have reached the member, but no (complete) reply came back."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class Unanswered(Lost):
    """A GET timed out before the first byte of its reply: the member may
    still be making it (etcd encodes a listing whole before it sends a byte).
    ``waiting`` is the connection, left open (``close()`` it if unused):
    :meth:`Member.request` given it waits for that reply again instead of
    sending the GET once more."""

    def __init__(self, waiting: Any) -> None:
        super().__init__("timed out waiting for the reply", timed_out=True)
        self.waiting = waiting


def _reply(connection: "Connection", may_wait: bool, streaming: bool = False) -> "Response":
    """The reply read on ``connection``, closed if that fails; but with
    ``may_wait`` (a listing's), a timeout before the reply's first byte
    leaves it open, as :class:`Unanswered`: etcd may still be making it."""
    try:
        return _receive(connection, streaming=streaming)
    except Lost as exc:
        if may_wait and exc.timed_out and not connection.heard and not connection.buffered():
            raise Unanswered(connection) from None
        connection.close()
        raise
    except BaseException:
        connection.close()
        raise


class TLSFailed(Exception):
    """The certificate did not verify, or the member sent a TLS alert."""


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
        self._poll: Optional[Any] = None  # select.poll, made when first needed
        self.closed = False
        #: False once a reply ended the connection (``Connection: close``, or a
        #: body that ends when the member closes).
        self.reusable = True
        #: The pool generation of the Member that opened it (see Member.close).
        self.generation = 0
        #: time.monotonic() when bytes last arrived (0: none since the reply was awaited).
        self.heard = 0.0
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
        version, code = status.groups()
        if version == b"0" or ("connection" in headers
                               and "close" in headers["connection"].lower()):
            self.reusable = False  # HTTP/1.0 (etcd speaks 1.1) or the member said so
        return int(code), headers

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
            size = self._chunk_size()
            if not size:
                return
            chunk = self._take(size)
            self._end_chunk()
            yield chunk

    def _chunk_size(self) -> int:
        """The next chunk's size; 0 after the last one, whose trailer fields it reads."""
        size = int(self._take_until(b"\r\n").split(b";", 1)[0], 16)
        if size < 0:
            raise ValueError("negative chunk size")
        if size == 0:
            while self._take_until(b"\r\n"):
                pass  # trailer fields, up to the empty line that ends the body
        return size

    def _end_chunk(self) -> None:
        if self._take_until(b"\r\n"):
            raise ValueError("a chunk is longer than its size")

    def pieces(self, headers: Dict[str, str]) -> Iterator[bytes]:
        """A reply's body in pieces of at most 64 KiB, as they arrive, however it is framed.

        For a listing read without holding it whole: etcd sends a directory's
        listing as one chunk of its full size (tens of MB at 100,000 items),
        which :meth:`chunks` would read into memory at once.
        """
        encoding = headers.get("transfer-encoding")
        if encoding is None:
            length = headers.get("content-length")
            if length is not None and not length.isdigit():
                raise ValueError(f"bad Content-Length: {length!r}")
            yield from self._pieces(int(length) if length is not None else None)
            return
        if encoding.lower() != "chunked":
            raise ValueError(f"unsupported Transfer-Encoding: {encoding}")
        while True:
            size = self._chunk_size()
            if not size:
                return
            yield from self._pieces(size)
            self._end_chunk()

    def _pieces(self, length: Optional[int]) -> Iterator[bytes]:
        """The next ``length`` bytes (None: until the member closes) as they arrive."""
        while length is None or length > 0:
            if self._pos == len(self._buffer) and not self._fill():
                if length is None:
                    return
                raise Lost("the member closed the connection")
            end = len(self._buffer) if length is None else \
                min(len(self._buffer), self._pos + length)
            piece = bytes(self._buffer[self._pos:end])
            self._pos = end
            if length is not None:
                length -= len(piece)
            yield piece

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

    def stale(self) -> bool:
        """Whether this idle kept-alive connection cannot carry a request.

        An idle connection that is readable was closed by the member (a
        restarted etcd closes them all) or holds bytes nobody asked for.
        Sending on it would turn a request that never reached a live server
        into one that may have been applied.  One poll, which returns at
        once: cheaper than ``recv(MSG_PEEK | MSG_DONTWAIT)``, whose "nothing
        to read" is an exception (0.3 against 1.6 µs), and it works for TLS
        sockets too, which refuse recv flags.
        """
        if self.closed or self._pos < len(self._buffer):
            return True
        if self._tls and self.sock.pending():  # type: ignore[attr-defined]
            return True  # decrypted bytes nobody asked for
        return bool((self._poll or self._poller()).poll(0))

    def buffered(self) -> bool:
        """Whether bytes of a reply are here already, read or (TLS) decrypted:
        a poll of the socket would not show them."""
        if self._pos < len(self._buffer):
            return True
        return self._tls and bool(self.sock.pending())  # type: ignore[attr-defined]

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

    def _poller(self) -> Any:
        """A poll object watching this socket (select.select where there is no poll)."""
        if not _HAVE_POLL:  # Windows
            return _Select(self.sock)
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        return self._poll

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
        if block:
            self.heard = time.monotonic()
        return bool(block)


class _Select:
    """select.poll's ``poll(0)``, for the platforms without it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def poll(self, timeout: int) -> List[socket.socket]:
        return select.select([self._sock], [], [], timeout)[0]


class Member:
    """A pool of keep-alive connections to one member's client URL.

    The pool holds at most as many connections as there were requests in
    flight at once, whichever threads sent them; a request takes the most
    recently used one, which is the likeliest to be alive.
    """

    def __init__(self, url: str, *, tls: Optional[ssl.SSLContext],
                 username: Optional[str], password: Optional[str]) -> None:
        parts = urlsplit(url)
        self.url = url
        self.host, self.port = _ascii_host(parts.hostname or ""), parts.port or 0
        self.tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        authority = f"[{self.host}]" if ":" in self.host else self.host  # IPv6
        self._headers = f"Host: {authority}:{self.port}\r\n"
        if username is not None:
            token = base64.b64encode(f"{username}:{password}".encode()).decode()
            self._headers += f"Authorization: Basic {token}\r\n"
        self._version_request = f"GET /version HTTP/1.1\r\n{self._headers}\r\n".encode("ascii")
        self._lock = threading.Lock()
        self._idle: List[Connection] = []
        self._generation = 0
        #: The connections whose reply request() is reading now.
        self._reading: Set[Connection] = set()

    def request(self, method: str, path: str, body: Optional[str],
                timeout: float, waiting: Optional[Connection] = None,
                may_wait: bool = False) -> Response:
        """One request on a pooled keep-alive connection.  With ``may_wait`` (a
        GET), one that times out before its reply's first byte raises
        :class:`Unanswered`, its connection open; given back as ``waiting``,
        its reply is waited for again, up to ``timeout``, and nothing is sent.
        Without it, a timeout closes the connection."""
        if waiting is None:
            return self._finish(self._start(method, path, body, timeout),
                                may_wait and method == "GET")
        waiting.set_timeout(timeout)
        return self._finish(waiting, True)

    def arriving(self, within: float) -> bool:
        """Whether a reply that request() is reading is arriving: some of its
        bytes came within the last ``within`` seconds (a long listing on a slow
        link, not a member that stopped answering)."""
        now = time.monotonic()
        return any(c.heard and now - c.heard <= within for c in self._readers())

    def _readers(self) -> Tuple[Connection, ...]:
        """A copy of the connections being read; request() adds and discards
        them without the lock, so a copy that saw the set change is taken again."""
        while True:
            try:
                return tuple(self._reading)
            except RuntimeError:  # "Set changed size during iteration"
                continue

    def request_all(self, requests: Sequence[Tuple[str, str, Optional[str]]],
                    timeout: float) -> List[Union[Response, Exception]]:
        """Send each request on a connection of its own, then read the replies.

        The member works on them at once, so their writes can share one raft
        entry batch and one WAL fsync.  A failed request comes back as its
        NotSent, Lost or TLSFailed exception.  ``timeout`` bounds the whole
        batch, connecting and waiting for the replies, not each request: a
        member that stopped answering costs it one timeout, not one per request.
        """
        started: List[Union[Connection, Exception]] = []
        answers: List[Union[Response, Exception]] = []
        deadline = time.monotonic() + timeout
        try:
            for method, path, body in requests:
                left = max(deadline - time.monotonic(), 0.001)
                started.append(_outcome(self._start, method, path, body, left))
            for item in started:
                if isinstance(item, Exception):
                    answers.append(item)
                else:
                    item.set_timeout(max(deadline - time.monotonic(), 0.001))
                    answers.append(_outcome(self._finish, item))
        except BaseException:  # the requests still in flight: their replies are unread
            for item in started[len(answers):]:
                if isinstance(item, Connection):
                    item.close()
            raise
        return answers

    def pipeline(self, requests: Sequence[Tuple[str, str, Optional[str]]], timeout: float, *,
                 lanes: int, depth: int) -> List[Tuple[Union[Response, Exception], float]]:
        """Send the requests in the order given, several in flight: for each,
        its reply (or NotSent, Lost, TLSFailed) and the seconds it took.

        They go on *k* connections (``lanes``, at most), each request on a
        lane with room: at most ``depth`` await their replies on a lane at
        once (HTTP/1.1 pipelining: a lane's replies come back in order).  A
        request is sent only once every request *k*·``depth`` places or more
        before it was answered.  From the first request that fails (no reply,
        or a status other than 2xx) on, nothing more is sent: the requests
        already sent are read to the end, and those not sent come back as
        NotSent, always the last ones.  ``timeout`` bounds each lane's wait
        for its next reply.  A lane whose connection fails makes every
        request awaiting a reply on it Lost.  A POST goes only on a
        connection the member has answered on (see :meth:`_probe`).
        """
        if not requests:
            return []
        proven = any(method == "POST" for method, _, _ in requests)
        count = max(1, min(lanes, len(requests)))
        run = _Pipeline(self, requests, self._take_lanes(count, timeout, proven), depth, timeout)
        try:
            run.go()
        except BaseException:  # replies still in flight would be left unread
            run.close()
            raise
        run.give_back()
        return run.outcomes()

    def stream(self, path: str, idle_timeout: Optional[float], connect_timeout: float,
               waiting: Optional[Connection] = None, may_wait: bool = False
               ) -> Tuple[Connection, Response]:
        """Send a streaming GET on a connection of its own (never pooled).

        Returns the connection, its body unread, and the reply; for a status
        other than 200 the reply's body is read and the connection closed.
        ``may_wait`` and ``waiting``: as :meth:`request`'s (a listing's).
        """
        if waiting is None:
            connection = Connection(self._connect(connect_timeout))
            request = f"GET {path} HTTP/1.1\r\n{self._headers}Connection: close\r\n\r\n"
        else:
            connection, may_wait = waiting, True
            connection.set_timeout(connect_timeout)
        try:
            if waiting is None:
                _send(connection, request.encode("ascii"))
            response = _reply(connection, may_wait, streaming=True)
            connection.set_timeout(idle_timeout)
        except Unanswered:
            raise  # left open for another wait
        except BaseException:
            connection.close()
            raise
        if response.status != 200:
            connection.close()
        return connection, response

    def close(self) -> None:
        """Close the idle connections; those in use close when their request ends."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for connection in idle:
            connection.close()

    def _start(self, method: str, path: str, body: Optional[str],
               timeout: float) -> Connection:
        """The connection the request went out on; its reply is still to read."""
        connection = self._take(timeout, proven=method == "POST")
        try:
            _send(connection, self._encode(method, path, body))
        except BaseException:
            connection.close()
            raise
        return connection

    def _finish(self, connection: Connection, may_wait: bool = False) -> Response:
        """The reply; the connection goes back to the pool only once it is read
        whole.  ``may_wait``: a timeout before the reply's first byte leaves
        the connection open for another wait (:class:`Unanswered`)."""
        connection.heard = 0.0  # what arrives now is this reply's
        # Not under the lock: a set's add and discard are atomic under the GIL,
        # and arriving() copies the set (two lock round trips per request saved).
        self._reading.add(connection)
        try:
            response = _reply(connection, may_wait)
        finally:
            self._reading.discard(connection)
        self._give_back(connection)
        return response

    def _encode(self, method: str, path: str, body: Optional[str]) -> bytes:
        if body is None:
            return f"{method} {path} HTTP/1.1\r\n{self._headers}\r\n".encode("ascii")
        data = body.encode("ascii")  # form-encoded: ASCII by construction
        return (f"{method} {path} HTTP/1.1\r\n{self._headers}Content-Type: "
                f"application/x-www-form-urlencoded\r\nContent-Length: {len(data)}"
                "\r\n\r\n").encode("ascii") + data

    def _take(self, timeout: float, proven: bool = False) -> Connection:
        """The most recently used idle connection that is still open, else a
        new one (``proven``: on which the member has answered, see :meth:`_probe`)."""
        while self._idle:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                break
            if not connection.stale():
                connection.set_timeout(timeout)
                return connection
            connection.close()  # the member closed it: nothing was sent on it
        connection = Connection(self._connect(timeout), kernel_timeouts=True)
        connection.generation = self._generation
        if proven:
            self._probe(connection)
        return connection

    def _probe(self, connection: Connection) -> None:
        """Ask a new connection for etcd's version; NotSent if no reply comes.

        A POST is the one request that is never resent, so it only goes on a
        connection the member has answered on: a member that accepts and
        never answers (frozen, or cut off behind a proxy) might apply it
        later, which would make it ambiguous.  Pooled connections have all
        answered; this costs one round trip per new connection, for POSTs.
        """
        try:
            _send(connection, self._version_request)
            _receive(connection)
        except Lost as exc:
            connection.close()
            raise NotSent(f"no answer on a new connection: {exc}") from None
        except BaseException:
            connection.close()
            raise
        if not connection.reusable:
            connection.close()
            raise NotSent("the member closed a new connection after one reply")

    def _take_lanes(self, count: int, timeout: float, proven: bool) -> List[Connection]:
        """Up to ``count`` connections, pooled ones first; NotSent if none can be had.

        New ones are opened, and (``proven``) probed, together: one round trip
        for them all.
        """
        taken: List[Connection] = []
        while len(taken) < count:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                break
            if connection.stale():
                connection.close()
                continue
            connection.set_timeout(timeout)
            taken.append(connection)
        fresh = self._open(count - len(taken), timeout, must=not taken)
        return taken + (self._probe_all(fresh, timeout, must=not taken) if proven else fresh)

    def _open(self, count: int, timeout: float, must: bool) -> List[Connection]:
        """Up to ``count`` new connections; NotSent if ``must`` and none opens."""
        opened: List[Connection] = []
        try:
            while len(opened) < count:
                connection = Connection(self._connect(timeout), kernel_timeouts=True)
                connection.generation = self._generation
                opened.append(connection)
        except NotSent:
            if must and not opened:
                raise
        except BaseException:
            for connection in opened:
                connection.close()
            raise
        return opened

    def _probe_all(self, connections: List[Connection], timeout: float,
                   must: bool) -> List[Connection]:
        """The connections on which the member answered :meth:`_probe`'s question,
        asked on all of them at once; NotSent if ``must`` and there is none.

        Every reply must come within ``timeout`` of the first question, as
        :meth:`_probe`'s within ``timeout`` of its own: the replies are awaited
        together (one wait, shared), so a member that does not answer costs
        one timeout, not one per connection, and a slow member's late replies
        do not pass for answers.
        """
        answered: List[Connection] = []
        failure: Optional[Exception] = None
        try:
            due = time.monotonic() + timeout
            asked = [c for c in connections if _outcome(_send, c, self._version_request) is None]
            for connection in connections:
                if connection not in asked:
                    connection.close()
            for connection, answer in self._probe_replies(asked, due):
                if isinstance(answer, Response) and connection.reusable:
                    connection.set_timeout(timeout)
                    answered.append(connection)
                    continue
                connection.close()
                failure = answer if isinstance(answer, TLSFailed) else failure
        except BaseException:
            for connection in connections:
                connection.close()
            raise
        if failure is not None:
            for connection in answered:
                connection.close()
            raise failure
        if must and not answered:
            raise NotSent("no answer on a new connection")
        return answered

    def _probe_replies(self, asked: List[Connection], due: float
                       ) -> Iterator[Tuple[Connection, Union[Response, Exception]]]:
        """Each asked connection with its probe's reply, or Lost if none came by
        ``due`` (time.monotonic()); a reply begun is read only until ``due``."""
        waiting = {connection.sock.fileno(): connection for connection in asked}
        poller = _Poller(list(connection.sock for connection in asked))
        while waiting:
            ready = [fd for fd, c in waiting.items() if c.buffered()] or \
                poller.ready(max(due - time.monotonic(), 0.0))
            if not ready:
                break
            for fd in ready:
                connection = waiting.pop(fd)
                poller.forget(fd)
                # Never 0: a kernel (or socket) timeout of 0 means "none".
                connection.set_timeout(max(due - time.monotonic(), 0.001))
                yield connection, _outcome(_receive, connection)
        for connection in waiting.values():
            yield connection, Lost("timed out waiting for the reply", timed_out=True)

    def _give_back(self, connection: Connection) -> None:
        with self._lock:
            if connection.reusable and connection.generation == self._generation:
                self._idle.append(connection)
                return
        connection.close()

    def _connect(self, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except ConnectionRefusedError as exc:
            raise Refused(f"cannot connect: {exc}") from None
        except OSError as exc:
            raise NotSent(f"cannot connect: {exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock if self.tls is None else self._handshake(sock, self.tls)
        except BaseException:
            sock.close()
            raise

    def _handshake(self, sock: socket.socket, tls: ssl.SSLContext) -> ssl.SSLSocket:
        """The TLS session; a timeout or reset on the way is NotSent (nothing of
        the request left), a certificate or an alert is TLSFailed."""
        try:
            return tls.wrap_socket(sock, server_hostname=self.host)
        except OSError as exc:  # ssl.SSLError included
            if isinstance(exc, ssl.SSLError) and _refused(exc):
                raise TLSFailed(_tls_message(exc)) from None
            raise NotSent(f"TLS handshake failed: {exc}") from None


class _Lane:
    """One connection of a pipeline, and its requests awaiting replies, in order:
    (the request's position, when it was sent)."""

    __slots__ = ("connection", "fd", "waiting", "since", "dead")

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.fd = connection.sock.fileno()
        self.waiting: Deque[Tuple[int, float]] = deque()
        self.since = 0.0  # time.monotonic() of its last reply, or of a send to an idle lane
        self.dead = False


class _Pipeline:
    """One run of :meth:`Member.pipeline`: sends in order, reads replies as they come."""

    def __init__(self, member: Member, requests: Sequence[Tuple[str, str, Optional[str]]],
                 connections: List[Connection], depth: int, timeout: float) -> None:
        self._member = member
        self._requests = requests
        self._lanes = [_Lane(connection) for connection in connections]
        self._depth = max(1, depth)
        self._window = len(self._lanes) * self._depth
        self._timeout = timeout
        self._results: List[Optional[Tuple[Union[Response, Exception], float]]] = \
            [None] * len(requests)
        self._next = 0
        self._halted = False
        self._by_fd = {lane.fd: lane for lane in self._lanes}
        self._poller = _Poller([lane.connection.sock for lane in self._lanes])

    def go(self) -> None:
        """Send and read until every request sent has its outcome."""
        while True:
            if not self._halted:
                self._send()
            busy = [lane for lane in self._lanes if lane.waiting]
            if not busy:
                return
            due = min(lane.since for lane in busy) + self._timeout
            for fd in self._poller.ready(max(due - time.monotonic(), 0.0)):
                self._read(self._by_fd[fd])
            self._time_out(busy)

    def _send(self) -> None:
        """The next requests, in order, on the lanes with room, while the window
        allows: up to lanes x depth places after the oldest awaiting a reply."""
        limit = min(len(self._requests), self._oldest() + self._window)
        for lane in self._lanes:
            if self._next >= limit or self._halted:  # a failed send: nothing more goes
                return
            room = 0 if lane.dead else min(self._depth - len(lane.waiting), limit - self._next)
            if room > 0:
                self._send_on(lane, room)

    def _send_on(self, lane: _Lane, count: int) -> None:
        """The next ``count`` requests, on ``lane``, in one write; the lane's
        wait starts at its own send, not at an earlier lane's (a slow write
        there must not eat into this lane's timeout)."""
        now = time.monotonic()
        if not lane.waiting:
            lane.since = now
        first, self._next = self._next, self._next + count
        encode = self._member._encode
        lane.waiting.extend((position, now) for position in range(first, self._next))
        try:
            _send(lane.connection, b"".join([encode(*request)
                                             for request in self._requests[first:self._next]]))
        except Lost as exc:
            self._fail(lane, exc)

    def _oldest(self) -> int:
        """The position of the oldest request awaiting its reply (none: the next)."""
        return min((lane.waiting[0][0] for lane in self._lanes if lane.waiting),
                   default=self._next)

    def _read(self, lane: _Lane) -> None:
        """The replies that have come on ``lane``; a lane with none awaited that
        turns readable was closed by the member (or sent junk): it fails."""
        if not lane.waiting:
            self._fail(lane, Lost("the member closed an idle connection"))
            return
        connection = lane.connection
        while lane.waiting:
            try:
                response = _receive(connection)
            except (Lost, TLSFailed) as exc:
                self._fail(lane, exc)
                return
            position, sent = lane.waiting.popleft()
            lane.since = time.monotonic()
            self._results[position] = (response, lane.since - sent)
            self._halted = self._halted or not 200 <= response.status < 300
            if not connection.reusable:  # the member closes it: what it carried is lost
                self._fail(lane, Lost("the member closed the connection"))
                return
            if not connection.buffered():
                return

    def _time_out(self, busy: List[_Lane]) -> None:
        now = time.monotonic()
        for lane in busy:
            if lane.waiting and now - lane.since >= self._timeout:
                self._fail(lane, Lost("timed out waiting for the reply", timed_out=True))

    def _fail(self, lane: _Lane, exc: Exception) -> None:
        """The lane is done for: its requests awaiting a reply get ``exc``, and
        nothing more is sent on any lane."""
        now = time.monotonic()
        for position, sent in lane.waiting:
            self._results[position] = (exc, now - sent)
        lane.waiting.clear()
        if not lane.dead:
            self._poller.forget(lane.fd)
            lane.connection.close()
        lane.dead = True
        self._halted = True

    def outcomes(self) -> List[Tuple[Union[Response, Exception], float]]:
        unsent = NotSent("not sent: an earlier request of the pipeline failed")
        return [result or (unsent, 0.0) for result in self._results]

    def give_back(self) -> None:
        for lane in self._lanes:
            if not lane.dead:
                self._member._give_back(lane.connection)

    def close(self) -> None:
        for lane in self._lanes:
            lane.connection.close()


class _Poller:
    """The sockets of a pipeline that have something to read (poll, else select)."""

    def __init__(self, socks: List[socket.socket]) -> None:
        self._socks = {sock.fileno(): sock for sock in socks}
        self._poll = select.poll() if _HAVE_POLL else None
        for fd in self._socks:
            if self._poll is not None:
                self._poll.register(fd, select.POLLIN)

    def ready(self, timeout: float) -> List[int]:
        """The file numbers readable within ``timeout`` seconds (none: timed out)."""
        if self._poll is not None:
            return [fd for fd, _ in self._poll.poll(timeout * 1000)]
        readable = select.select(list(self._socks.values()), [], [], timeout)[0]
        return [sock.fileno() for sock in readable]

    def forget(self, fd: int) -> None:
        if self._socks.pop(fd, None) is not None and self._poll is not None:
            self._poll.unregister(fd)


def _send(connection: Connection, data: bytes) -> None:
    try:
        connection.sock.sendall(data)
    except OSError as exc:
        raise Lost(f"{type(exc).__name__}: {exc}") from None


def _receive(connection: Connection, streaming: bool = False) -> Response:
    """The reply; every way of not getting it whole is Lost (or TLSFailed)."""
    try:
        return connection.receive(streaming)
    except (socket.timeout, BlockingIOError):
        raise Lost("timed out waiting for the reply", timed_out=True) from None
    except ssl.SSLError as exc:  # TLS 1.3: a refused client certificate shows here
        if _refused(exc):
            raise TLSFailed(_tls_message(exc)) from None
        raise Lost(f"{type(exc).__name__}: {exc}") from None
    except (OSError, ValueError, IndexError) as exc:
        raise Lost(f"{type(exc).__name__}: {exc}") from None


def _outcome(step: Callable[..., T], *args: Any) -> Union[T, Exception]:
    """``step(*args)``, or the wire exception it raised."""
    try:
        return step(*args)
    except (NotSent, Lost, TLSFailed) as exc:
        return exc


def _refused(exc: ssl.SSLError) -> bool:
    """A certificate that did not verify, or an alert the peer sent (such as
    TLSV1_ALERT_UNKNOWN_CA, TLSV13_ALERT_CERTIFICATE_REQUIRED)."""
    return isinstance(exc, ssl.SSLCertVerificationError) or "ALERT" in (exc.reason or "")


def _tls_message(exc: ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    return str(exc)


def _ascii_host(host: str) -> str:
    """The host as sent in ``Host:`` and looked up: a non-ASCII name in its
    IDNA (xn--) form.  ConfigError for a name that IDNA cannot encode (an empty
    or over-long label), which the socket module would raise as UnicodeError."""
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ConfigError(f"bad etcd host name {host!r}: {exc}") from None
