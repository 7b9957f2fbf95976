"""A fault-injecting TCP proxy for the tests: the network between a client and etcd.

``FaultProxy(host, port)`` listens on 127.0.0.1 (a free port) and forwards
every connection it accepts to ``host:port``.  It works on bytes, not HTTP,
so it serves TLS as well as plain HTTP (the client then verifies etcd's
certificate through it: issue the certificate for 127.0.0.1).

Faults can be switched at any time, also while requests are in flight, and
most of them per direction: ``"up"`` is what the client sends (requests),
``"down"`` what etcd sends back (replies), ``"both"`` is the default.

================  ==========================================================
pass_through()    forward everything (clears every fault below; held bytes go on)
delay(ms)         add ``ms`` milliseconds to each chunk's way
throttle(rate)    forward at most ``rate`` bytes a second (a slow link), in
                  pieces of a twentieth of a second's bytes
hold()            buffer what arrives and forward nothing until release();
                  ``match=`` (a bytes regex) holds only a connection once a
                  chunk matching it arrives, so a test can let reads by and
                  hold the write it is after (plain HTTP only).  A request
                  held while its client gave up still reaches etcd on
                  release, as a delayed packet would
black_hole()      read and discard, never answer; new connections are
                  accepted and treated the same (a frozen host).  A connection
                  that lost bytes this way is reset when the black hole ends:
                  TCP never delivers a stream with a gap in it
reset()           RST every connection (SO_LINGER 0, then close), new ones too
cut(n)            close a connection once ``n`` bytes of a reply went through
close_idle(s)     close every connection quiet for ``s`` seconds since its last
                  reply, as a restarted etcd does to kept-alive connections
refuse()          stop listening (connects are refused) and close the open
                  connections, as a dead process does; restart() listens again
================  ==========================================================

``accepted`` counts the connections accepted so far, ``open_connections``
those open now; ``bytes_up`` counts the bytes clients sent and ``requests``
lists the HTTP request lines among them (``b"GET /v2/keys/..."``), also of
what a fault then held or dropped.  Each connection is pumped by one thread
with ``select`` (non-blocking sends, so a slow reader never blocks the pump);
:meth:`stop` joins every thread the proxy started.
"""
from __future__ import annotations

import dataclasses
import os
import re
import select
import socket
import struct
import threading
import time
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Pattern, Set, Tuple, Union
from urllib.parse import urlsplit

UP, DOWN = "up", "down"
_DIRECTIONS = {"up": (UP,), "down": (DOWN,), "both": (UP, DOWN)}
_CHUNK = 1 << 16
_CONNECT_TIMEOUT = 2.0
#: An HTTP request line (the transport sends no body with a line like it).
_REQUEST_LINE = re.compile(rb"(?:GET|PUT|POST|DELETE|HEAD) /\S* HTTP/1\.[01]\r\n")


@dataclasses.dataclass(frozen=True)
class Faults:
    """The faults in force: a snapshot that the pumps read, replaced as a whole on change."""

    delay: Tuple[Tuple[str, float], ...] = ()
    rate: Tuple[Tuple[str, float], ...] = ()
    hold: Tuple[str, ...] = ()
    hold_match: Optional[Pattern[bytes]] = None
    drop: Tuple[str, ...] = ()
    reset: bool = False
    cut: Optional[int] = None
    idle: Optional[float] = None
    #: release() calls so far: a link held before the latest one is let go,
    #: even if a new hold() came before its pump saw the release.
    released: int = 0

    def delay_of(self, direction: str) -> float:
        return dict(self.delay).get(direction, 0.0)

    def rate_of(self, direction: str) -> Optional[float]:
        return dict(self.rate).get(direction)


class FaultProxy:
    """A threaded TCP proxy in front of ``target_host:target_port`` that injects faults."""

    def __init__(self, target_host: str, target_port: int, *, scheme: str = "http") -> None:
        self.target = (target_host, target_port)
        self.scheme = scheme
        self.port = 0
        self.faults = Faults()
        self.accepted = 0
        self.bytes_up = 0
        self.requests: List[bytes] = []
        self._lock = threading.Lock()
        self._links: Set[_Link] = set()
        self._threads: List[threading.Thread] = []
        self._listener: Optional[socket.socket] = None
        self._acceptor: Optional[threading.Thread] = None
        self._wake_r, self._wake_w = _pipe()
        self._stopping = False

    @classmethod
    def to(cls, url: str) -> "FaultProxy":
        """A proxy in front of ``http(s)://host:port``, with the same scheme."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 2379, scheme=parts.scheme)

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the proxy has no port before start()")
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._links)

    # -- life ----------------------------------------------------------------
    def start(self) -> "FaultProxy":
        self._listen()
        return self

    def stop(self) -> None:
        """Close everything and join every thread this proxy started."""
        self._stopping = True
        self._stop_accepting()
        self._close_links(abort=False)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(10)
        for fd in (self._wake_r, self._wake_w):
            _close_fd(fd)
        self._wake_r = self._wake_w = -1

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<FaultProxy {self.port} -> {self.target[0]}:{self.target[1]} {self.faults}>"

    # -- faults --------------------------------------------------------------
    def pass_through(self) -> None:
        """No fault any more: held bytes are forwarded, connections stay."""
        self._set(Faults())

    def delay(self, ms: float, direction: str = "both") -> None:
        delays = dict(self.faults.delay)
        delays.update((d, ms / 1000.0) for d in _directions(direction))
        self._set(dataclasses.replace(self.faults, delay=tuple(delays.items())))

    def throttle(self, bytes_per_second: float, direction: str = "both") -> None:
        rates = dict(self.faults.rate)
        rates.update((d, float(bytes_per_second)) for d in _directions(direction))
        self._set(dataclasses.replace(self.faults, rate=tuple(rates.items())))

    def hold(self, direction: str = "both", *, match: Union[bytes, Pattern[bytes], None] = None
             ) -> None:
        """Buffer what arrives (on connections whose data matched ``match``, if given)."""
        pattern = re.compile(match) if isinstance(match, bytes) else match
        held = tuple(sorted(set(self.faults.hold) | set(_directions(direction))))
        self._set(dataclasses.replace(self.faults, hold=held, hold_match=pattern))

    def release(self) -> None:
        """Stop holding: what was held is forwarded, in order."""
        self._set(dataclasses.replace(self.faults, hold=(), hold_match=None,
                                      released=self.faults.released + 1))

    def black_hole(self, direction: str = "both") -> None:
        dropped = tuple(sorted(set(self.faults.drop) | set(_directions(direction))))
        self._set(dataclasses.replace(self.faults, drop=dropped))

    def reset(self) -> None:
        """RST every open connection now, and every new one, until pass_through()."""
        self._set(dataclasses.replace(self.faults, reset=True))
        self._wait_for(lambda: not self._links, "the connections to be reset")

    def cut(self, after_bytes: int) -> None:
        self._set(dataclasses.replace(self.faults, cut=after_bytes))

    def close_idle(self, idle: float = 0.05) -> None:
        self._set(dataclasses.replace(self.faults, idle=idle))

    def refuse(self) -> None:
        """Stop listening and close the open connections: connects are refused."""
        self._stop_accepting()
        self._close_links(abort=False)

    def restart(self) -> None:
        """Listen again on the same port after refuse()."""
        if self._acceptor is None:
            self._listen()

    def disconnect(self, abort: bool = False) -> None:
        """Close the open connections now (RST with ``abort``); keep listening."""
        self._close_links(abort=abort)

    def held(self, direction: str = UP) -> bytes:
        """The bytes held so far in ``direction``, over all connections."""
        with self._lock:
            links = list(self._links)
        return b"".join(link.held_bytes(direction) for link in links)

    # -- internals -------------------------------------------------------------
    def _set(self, faults: Faults) -> None:
        self.faults = faults
        with self._lock:
            links = list(self._links)
        for link in links:
            link.wake()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        _drain(self._wake_r)
        self._listener = listener
        self._acceptor = self._spawn(self._accept_loop, f"faultproxy-{self.port}-accept")

    def _stop_accepting(self) -> None:
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is None:
            return
        _wake(self._wake_w)
        acceptor.join(10)

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        try:
            while True:
                ready, _, _ = select.select([listener, self._wake_r], [], [])
                if self._wake_r in ready:
                    return
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                self._accepted(client)
        finally:
            listener.close()

    def _accepted(self, client: socket.socket) -> None:
        with self._lock:
            self.accepted += 1
        if self.faults.reset:
            _abort(client)
            return
        link = _Link(self, client)
        with self._lock:
            self._links.add(link)
        link.thread = self._spawn(link.run, f"faultproxy-{self.port}-link")

    def _went_up(self, data: bytes) -> None:
        """Count what a client sent: its bytes and the request lines in them."""
        with self._lock:
            self.bytes_up += len(data)
            self.requests.extend(line.rstrip(b"\r\n") for line in _REQUEST_LINE.findall(data))

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()
        return thread

    def _forget(self, link: "_Link") -> None:
        with self._lock:
            self._links.discard(link)

    def _close_links(self, abort: bool) -> None:
        with self._lock:
            links = list(self._links)
        for link in links:
            link.kill(abort)
        for link in links:
            if link.thread is not None:
                link.thread.join(10)

    def _wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"faultproxy: timed out waiting for {what}")
            time.sleep(0.005)


class _Link:
    """One accepted connection and its connection to the target, pumped by one thread.

    Each chunk read from one side goes, according to the faults in force when
    it arrived: nowhere (black hole), into ``held`` (until release), or into
    ``pending`` with a due time (the delay); due chunks move to ``out``, which
    is written as the socket accepts it.
    """

    def __init__(self, proxy: FaultProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: Optional[socket.socket] = None
        self.thread: Optional[threading.Thread] = None
        self._wake_r, self._wake_w = _pipe()
        self._fd_lock = threading.Lock()  # no wake-up written to a closed (reused) fd
        self._pending: Dict[str, Deque[Tuple[float, bytes]]] = {UP: deque(), DOWN: deque()}
        self._held: Dict[str, bytearray] = {UP: bytearray(), DOWN: bytearray()}
        self._holding: Dict[str, bool] = {UP: False, DOWN: False}
        self._held_since: Dict[str, int] = {UP: 0, DOWN: 0}  # Faults.released then
        self._out: Dict[str, bytearray] = {UP: bytearray(), DOWN: bytearray()}
        self._reply_bytes = 0
        self._last_up: Optional[float] = None
        self._last_down: Optional[float] = None
        self._upstream_done = False  # the target closed: close the client once flushed
        self._client_gone = False  # the client closed: deliver what it sent, then close
        self._cut = False
        self._dropped: Set[str] = set()  # directions in which bytes were discarded
        self._free_at: Dict[str, float] = {UP: 0.0, DOWN: 0.0}  # a throttled link's next slot
        self._killed: Optional[bool] = None  # None, or abort (RST) or not

    def held_bytes(self, direction: str) -> bytes:
        return bytes(self._held[direction])

    def wake(self) -> None:
        with self._fd_lock:
            _wake(self._wake_w)

    def kill(self, abort: bool) -> None:
        self._killed = abort
        self.wake()

    def run(self) -> None:
        abort = False
        try:
            self._connect_upstream()
            abort = self._pump()
        except ConnectionRefusedError:
            abort = True  # the target is down: as close to "refused" as a proxy gets
        except OSError:
            pass
        finally:
            self._close(abort)
            self.proxy._forget(self)

    def _connect_upstream(self) -> None:
        try:
            self.upstream = socket.create_connection(self.proxy.target, timeout=_CONNECT_TIMEOUT)
        except OSError:
            return  # as if refused, once something must go up (see _forward)
        self.upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.upstream.setblocking(False)

    def _pump(self) -> bool:
        """Move bytes until a side closes or a fault ends the connection; True to RST."""
        self.client.setblocking(False)
        while True:
            faults = self.proxy.faults
            if self._killed is not None or faults.reset:
                return bool(self._killed) or faults.reset
            if not self._dropped <= set(faults.drop):
                return True  # the black hole ended, but this stream has a gap: RST
            now = time.monotonic()
            self._unhold(faults, now)
            self._deliver(faults, now)
            if self._finished() or self._idle_for(faults, now):
                return False
            if self._client_gone and not self._still_going_up():
                return False
            readable, writable = self._wait(now)
            for sock in writable:
                self._write(sock)
            for sock in readable:
                if not self._read(sock):
                    return False

    def _wait(self, now: float) -> Tuple[list, list]:
        readers: List[object] = [self._wake_r]
        if not self._client_gone:
            readers.append(self.client)
        if self.upstream is not None and not self._upstream_done:
            readers.append(self.upstream)
        writers = [sock for sock in (self.upstream, self.client)
                   if sock is not None and self._out[self._direction_to(sock)]
                   and not (sock is self.client and self._client_gone)]
        readable, writable, _ = select.select(readers, writers, [], self._timeout(now))
        if self._wake_r in readable:
            _drain(self._wake_r)
            readable.remove(self._wake_r)
        return readable, writable

    def _timeout(self, now: float) -> Optional[float]:
        dues = [queue[0][0] for queue in self._pending.values() if queue]
        idle = self.proxy.faults.idle
        if idle is not None and self._quiet():
            assert self._last_down is not None
            dues.append(self._last_down + idle)
        return max(min(dues) - now, 0.0) if dues else None

    def _direction_to(self, sock: object) -> str:
        return UP if sock is self.upstream else DOWN

    def _read(self, sock: socket.socket) -> bool:
        """Take a chunk from ``sock``; False when the client went away."""
        try:
            data = sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            data = b""
        direction = UP if sock is self.client else DOWN
        if not data:
            if direction == UP:
                self._client_gone = True
                return self._still_going_up()
            self._upstream_done = True
            return True
        # The faults in force now, not when this loop began: a hold set just
        # before the client sent must catch what it sent.
        self._arrived(direction, data, self.proxy.faults)
        return True

    def _still_going_up(self) -> bool:
        """Bytes of a client that left, still held or on their way to the target."""
        return self.upstream is not None and bool(
            self._held[UP] or self._pending[UP] or self._out[UP])

    def _arrived(self, direction: str, data: bytes, faults: Faults) -> None:
        now = time.monotonic()
        if direction == UP:
            self._last_up, self._reply_bytes = now, 0
            self.proxy._went_up(data)
        if direction in faults.drop:
            self._dropped.add(direction)
            return
        if self._held[direction] or self._holds(direction, data, faults):
            self._held[direction] += data
            return
        self._schedule(direction, now + faults.delay_of(direction), data, faults)

    def _schedule(self, direction: str, due: float, data: bytes, faults: Faults) -> None:
        """Queue ``data`` to go at ``due``; on a throttled link, in pieces that
        each wait for the link to have carried the one before."""
        rate = faults.rate_of(direction)
        if rate is None:
            self._pending[direction].append((due, data))
            return
        size = max(1, int(rate / 20))
        for start in range(0, len(data), size):
            piece = data[start:start + size]
            self._free_at[direction] = max(due, self._free_at[direction]) + len(piece) / rate
            self._pending[direction].append((self._free_at[direction], piece))

    def _holds(self, direction: str, data: bytes, faults: Faults) -> bool:
        if direction not in faults.hold:
            return False
        if not self._holding[direction]:
            self._holding[direction] = (faults.hold_match is None
                                        or faults.hold_match.search(data) is not None)
            self._held_since[direction] = faults.released
        return self._holding[direction]

    def _unhold(self, faults: Faults, now: float) -> None:
        for direction in (UP, DOWN):
            if (direction in faults.hold and self._holding[direction]
                    and self._held_since[direction] == faults.released):
                continue
            self._holding[direction] = False
            if self._held[direction]:
                data = bytes(self._held[direction])
                self._held[direction].clear()
                self._schedule(direction, now + faults.delay_of(direction), data, faults)

    def _deliver(self, faults: Faults, now: float) -> None:
        for direction in (UP, DOWN):
            queue = self._pending[direction]
            while queue and queue[0][0] <= now and not self._cut:
                data = queue.popleft()[1]
                if direction == DOWN:
                    if self._client_gone:
                        continue
                    data = self._clip(data, faults)
                    self._last_down = now
                elif self.upstream is None:
                    raise ConnectionRefusedError("the target is down")
                self._out[direction] += data

    def _clip(self, data: bytes, faults: Faults) -> bytes:
        """The part of a reply's chunk that passes ``cut``; marks the link cut if clipped."""
        if faults.cut is not None and self._reply_bytes + len(data) > faults.cut:
            data = data[:max(faults.cut - self._reply_bytes, 0)]
            self._cut = True
        self._reply_bytes += len(data)
        return data

    def _write(self, sock: socket.socket) -> None:
        out = self._out[self._direction_to(sock)]
        try:
            sent = sock.send(out)
        except (BlockingIOError, InterruptedError):
            return
        del out[:sent]

    def _finished(self) -> bool:
        """Cut, or the target closed, and everything for the client was written."""
        ending = self._cut or (self._upstream_done and not self._held[DOWN]
                               and not self._pending[DOWN])
        return ending and not self._out[DOWN]

    def _quiet(self) -> bool:
        """A reply went out since the last request, and nothing is in flight."""
        if self._last_down is None or (self._last_up or 0.0) > self._last_down:
            return False
        return not any(self._pending[d] or self._held[d] or self._out[d] for d in (UP, DOWN))

    def _idle_for(self, faults: Faults, now: float) -> bool:
        """close_idle: quiet for ``faults.idle`` seconds, and no request arriving."""
        if faults.idle is None or not self._quiet():
            return False
        assert self._last_down is not None
        if now - self._last_down < faults.idle:
            return False
        return not select.select([self.client], [], [], 0)[0]

    def _close(self, abort: bool) -> None:
        if abort:
            _abort(self.client)
        else:
            self.client.close()
        if self.upstream is not None:
            self.upstream.close()
        with self._fd_lock:
            for fd in (self._wake_r, self._wake_w):
                _close_fd(fd)
            self._wake_r = self._wake_w = -1


def _directions(direction: str) -> Tuple[str, ...]:
    try:
        return _DIRECTIONS[direction]
    except KeyError:
        raise ValueError(f"direction must be up, down or both, not {direction!r}") from None


def _abort(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _pipe() -> Tuple[int, int]:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    return read_end, write_end


def _wake(fd: int) -> None:
    try:
        os.write(fd, b"x")
    except OSError:
        pass  # full (a wake-up is pending anyway) or closed (the link ended)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass


def _close_fd(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
