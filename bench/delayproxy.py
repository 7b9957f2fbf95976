"""A delaying TCP proxy between the bench's consumers and etcd: a round trip away, on loopback.

This kernel has no netem, so latency is added in user space.  Everything
read from one side is written to the other a fixed time later, each way:
``DelayProxy(url, rtt_ms=1)`` adds 1 ms of round-trip time (0.5 ms each
way).  Connection set-up is not delayed (the kernel completes the
handshake); etcdq_v2 keeps its connections alive.

The proxy runs as a process of its own, so that its CPU can be read from
``/proc/<pid>/schedstat`` and it never competes for the GIL of the process
measuring.  Two builds of the same loop (one epoll/selector loop, one FIFO
of chunks: every chunk waits the same delay, so they fall due in the order
they were read, whatever their connection):

* **C** (``delayproxy.c``), compiled with gcc at run time into a temporary
  directory: a few microseconds of CPU per chunk;
* **Python** (this file run as a script), when there is no C compiler: the
  same design, several times the CPU per chunk (``kind`` says which ran).

Not tests/faultproxy.py: it pumps each connection with a thread of its own
and checks its faults on every chunk, which is what a test needs and what a
benchmark forwarding ~10,000 messages a second cannot afford.
"""
from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Deque, List, Optional, Tuple, Type
from urllib.parse import urlsplit

C_SOURCE = Path(__file__).with_name("delayproxy.c")
C_KIND, PYTHON_KIND = "C (epoll)", "Python (selectors)"
_START_TIMEOUT = 10.0


@dataclass
class Counters:
    """What the proxy forwarded so far."""

    accepted: int       # connections accepted
    chunks_up: int      # reads from clients (about one per request)
    chunks_down: int    # reads from etcd (about one per reply, or per block of events)
    bytes_up: int
    bytes_down: int

    @property
    def chunks(self) -> int:
        return self.chunks_up + self.chunks_down

    @classmethod
    def parse(cls, line: str) -> "Counters":
        return cls(*(int(field) for field in line.split()))


def build_c(directory: Path) -> Tuple[Optional[Path], str]:
    """Compile delayproxy.c into ``directory``: (the binary, "") or (None, why not)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return None, "no C compiler (gcc or cc) on PATH"
    binary = directory / "delayproxy"
    done = subprocess.run([compiler, "-O2", "-o", str(binary), str(C_SOURCE)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"gcc failed: {done.stderr.strip()[-300:]}"
    return binary, ""


class DelayProxy:
    """A delaying proxy process in front of ``target`` (an etcd client URL).

    ``rtt_ms``: the round-trip time added (half of it each way).  ``binary``:
    the compiled C proxy (:func:`build_c`); None runs the Python one.
    """

    def __init__(self, target: str, rtt_ms: float, binary: Optional[Path]) -> None:
        parts = urlsplit(target)
        one_way_us = str(int(round(rtt_ms * 1000 / 2)))
        host, port = parts.hostname or "127.0.0.1", str(parts.port)
        self.kind = C_KIND if binary is not None else PYTHON_KIND
        self.rtt_ms = rtt_ms
        command = [str(binary)] if binary is not None else [sys.executable, __file__]
        self._process = subprocess.Popen(command + [host, port, one_way_us],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         text=True, start_new_session=True)
        self._out: IO[str] = self._process.stdout  # type: ignore[assignment]
        port_line = self._line()
        self.url = f"{parts.scheme}://127.0.0.1:{int(port_line)}"

    @property
    def pid(self) -> int:
        return self._process.pid

    def counters(self) -> Counters:
        """The counters now (the proxy prints them when sent SIGUSR1)."""
        self._process.send_signal(signal.SIGUSR1)
        return Counters.parse(self._line())

    def cpu_seconds(self) -> float:
        """CPU time the proxy has used so far (it runs one thread)."""
        with open(f"/proc/{self.pid}/schedstat") as stat:
            return int(stat.read().split()[0]) / 1e9

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._out.close()

    def _line(self) -> str:
        # A bounded wait: a proxy that died or hangs must fail the run, not hang it.
        ready = selectors.DefaultSelector()
        ready.register(self._out, selectors.EVENT_READ)
        try:
            if not ready.select(_START_TIMEOUT):
                raise RuntimeError(f"the {self.kind} delay proxy did not answer")
        finally:
            ready.close()
        line = self._out.readline()
        if not line:
            raise RuntimeError(f"the {self.kind} delay proxy exited "
                               f"(code {self._process.poll()})")
        return line

    def __enter__(self) -> "DelayProxy":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.stop()


class ProxyBuild:
    """The proxy this run uses: the C one if it compiles here, else the Python one."""

    def __init__(self) -> None:
        self._directory = Path(tempfile.mkdtemp(prefix="etcdq-delayproxy-"))
        self.binary, self.why_not_c = build_c(self._directory)

    @property
    def kind(self) -> str:
        return C_KIND if self.binary is not None else PYTHON_KIND

    def proxy(self, target: str, rtt_ms: float) -> DelayProxy:
        return DelayProxy(target, rtt_ms, self.binary)

    def close(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)


# -- the Python proxy (run as a script) ---------------------------------------------------

_READ = 1 << 16
_MAX_IN_FLIGHT = 4 << 20


class _Side:
    """One socket of a proxied connection, and what is due to be written to it."""

    def __init__(self, sock: socket.socket, link: "_Link", index: int) -> None:
        self.sock, self.link, self.index = sock, link, index
        self.out: Deque[bytes] = deque()   # b"" stands for the FIN
        self.read_eof = self.shut = self.throttled = False
        self.events = selectors.EVENT_READ


class _Link:
    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.sides = (_Side(client, self, 0), _Side(upstream, self, 1))
        self.in_flight = [0, 0]
        self.dead = False


class _Loop:
    """The same loop as delayproxy.c, with a selector."""

    def __init__(self, target: Tuple[str, int], delay: float) -> None:
        self.target, self.delay = target, delay
        self.selector = selectors.DefaultSelector()
        self.fifo: Deque[Tuple[float, _Link, int, bytes]] = deque()
        self.counts = [0, 0, 0, 0, 0]  # accepted, chunks up/down, bytes up/down
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)

    def run(self) -> None:
        while True:
            timeout = None if not self.fifo else max(0.0, self.fifo[0][0] - time.monotonic())
            if timeout:
                # epoll's timeout is whole milliseconds, rounded up: wait the
                # whole ones there, and sleep the rest (what arrives meanwhile
                # is read up to that much later).
                whole = int(timeout * 1000) / 1000
                if not whole:
                    time.sleep(timeout)
                timeout = whole
            for key, events in self.selector.select(timeout):
                if key.data is None:
                    self._accept()
                else:
                    self._ready(key.data, events)
            self._deliver()

    def report(self, *_: object) -> None:
        print(" ".join(map(str, self.counts)), flush=True)

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(self.target)
        except OSError:
            return
        link = _Link(client, upstream)
        for side in link.sides:
            side.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            side.sock.setblocking(False)
            self.selector.register(side.sock, selectors.EVENT_READ, side)
        self.counts[0] += 1

    def _ready(self, side: _Side, events: int) -> None:
        if side.link.dead:
            return
        if events & selectors.EVENT_READ:
            self._read(side)
        if not side.link.dead and events & selectors.EVENT_WRITE:
            self._flush(side)

    def _read(self, side: _Side) -> None:
        try:
            data = side.sock.recv(_READ)
        except BlockingIOError:
            return
        except OSError:
            self._kill(side.link)
            return
        if not data:
            side.read_eof = True
        else:
            self.counts[1 + side.index] += 1
            self.counts[3 + side.index] += len(data)
            side.link.in_flight[side.index] += len(data)
            side.throttled = side.link.in_flight[side.index] > _MAX_IN_FLIGHT
        self.fifo.append((time.monotonic() + self.delay, side.link, side.index, data))
        self._want(side)

    def _deliver(self) -> None:
        now = time.monotonic()
        flush: List[_Side] = []
        while self.fifo and self.fifo[0][0] <= now:
            _, link, source, data = self.fifo.popleft()
            if not link.dead:
                to = link.sides[1 - source]
                to.out.append(data)
                if to not in flush:
                    flush.append(to)
        for side in flush:
            if not side.link.dead:
                self._flush(side)

    def _flush(self, side: _Side) -> None:
        link, source = side.link, side.link.sides[1 - side.index]
        while side.out:
            data = side.out[0]
            if not data:
                try:
                    side.sock.shutdown(socket.SHUT_WR)
                except OSError:  # the peer is gone already
                    self._kill(link)
                    return
                side.shut = True
            else:
                try:
                    sent = side.sock.send(data)
                except BlockingIOError:
                    break
                except OSError:
                    self._kill(link)
                    return
                link.in_flight[source.index] -= sent
                if sent < len(data):
                    side.out[0] = data[sent:]
                    continue
            side.out.popleft()
        if source.throttled and link.in_flight[source.index] < _MAX_IN_FLIGHT // 2:
            source.throttled = False
            self._want(source)
        self._want(side)
        if all(s.read_eof and s.shut for s in link.sides):
            self._kill(link)

    def _want(self, side: _Side) -> None:
        events = (0 if side.read_eof or side.throttled else selectors.EVENT_READ) | \
            (selectors.EVENT_WRITE if side.out else 0)
        if events == side.events:
            return
        if side.events:
            self.selector.unregister(side.sock)
        if events:
            self.selector.register(side.sock, events, side)
        side.events = events

    def _kill(self, link: _Link) -> None:
        link.dead = True
        for side in link.sides:
            if side.events:
                self.selector.unregister(side.sock)
                side.events = 0
            side.sock.close()


def main(argv: List[str]) -> int:
    host, port, one_way_us = argv
    loop = _Loop((host, int(port)), int(one_way_us) / 1e6)
    signal.signal(signal.SIGUSR1, loop.report)
    signal.signal(signal.SIGTERM, lambda *_: (loop.report(), os._exit(0)))
    print(loop.listener.getsockname()[1], flush=True)
    try:
        loop.run()
    except KeyboardInterrupt:
        loop.report()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

