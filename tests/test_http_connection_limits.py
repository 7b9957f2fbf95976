"""What a client may hold of the dashboard's and the metrics' HTTP servers, through real
sockets: a request that does not arrive within the connection timeout (nothing sent, a
byte now and then, or an idle kept-alive connection) is closed by the server, and beyond
``max_connections`` a connection is refused at once, with no thread of its own, while a
normal client is still served."""
from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import threading
import time
import urllib.request
from typing import Callable, Iterator, List, Tuple

import pytest

from etcdq_v2 import ConfigError, Queue
from etcdq_v2.dashboard import Dashboard

from helpers import wait_until

TIMEOUT = 1.0
#: However loaded the machine: the server closes a connection within its timeout plus this.
SLACK = 10.0
HELD = 500

Serve = Callable[..., Tuple[int, str]]  # (port, a path a normal client GETs)


@pytest.fixture(params=["dashboard", "metrics"])
def serve(request: pytest.FixtureRequest, etcd_url: str, queue_name: str) -> Iterator[Serve]:
    """``serve(connection_timeout=, max_connections=)``: a started server of that kind."""
    with contextlib.ExitStack() as stack:
        def start(**limits: float) -> Tuple[int, str]:
            if request.param == "dashboard":
                board = stack.enter_context(Dashboard(etcd_url, port=0, **limits))
                board.start()
                return int(board.url.rsplit(":", 1)[1].strip("/")), "/api/overview"
            pytest.importorskip("prometheus_client")
            from etcdq_v2.metrics import export_queues
            queue = stack.enter_context(Queue(etcd_url, queue_name))
            server = export_queues([queue], 0, **limits)
            stack.callback(server.close)
            return server.port, "/metrics"
        yield start


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT + SLACK)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server ends the connection (what it may send first is read past)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        return False  # still open after timeout + slack
    return True


def _get(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as answer:
        answer.read()
        return int(answer.status)


def test_an_unfinished_request_is_closed_within_the_timeout(serve: Serve) -> None:
    port, _ = serve(connection_timeout=TIMEOUT)
    silent, partial = _connect(port), _connect(port)
    partial.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: never ends
    began = time.monotonic()
    assert _closed_by_server(silent) and _closed_by_server(partial)
    assert time.monotonic() - began < TIMEOUT + SLACK


def test_a_request_trickling_in_is_closed_at_its_deadline(serve: Serve) -> None:
    """A byte every quarter of the timeout keeps each read short: the deadline is the
    request's, not a read's."""
    port, _ = serve(connection_timeout=TIMEOUT)
    sock = _connect(port)
    sock.settimeout(TIMEOUT / 4)
    began, closed = time.monotonic(), False
    for byte in b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 400:
        try:
            sock.sendall(bytes([byte]))
            closed = sock.recv(65536) == b""
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        if closed or time.monotonic() - began > TIMEOUT + SLACK:
            break
    assert closed and time.monotonic() - began < TIMEOUT + SLACK


def test_an_idle_kept_alive_connection_is_closed_within_the_timeout(etcd_url: str) -> None:
    with Dashboard(etcd_url, port=0, connection_timeout=TIMEOUT) as board:
        board.start()
        port = int(board.url.rsplit(":", 1)[1].strip("/"))
        sock = _connect(port)
        sock.sendall(b"GET /static/app.css HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        began = time.monotonic()
        assert _closed_by_server(sock)  # the page went quiet: its connection ends
        assert time.monotonic() - began < TIMEOUT + SLACK


def test_a_client_is_served_while_500_idle_connections_are_held(serve: Serve) -> None:
    _enough_files(4 * HELD)
    bound = HELD + 50
    port, path = serve(connection_timeout=600, max_connections=bound)
    threads = threading.active_count()
    held: List[socket.socket] = []
    try:
        held.extend(_connect(port) for _ in range(HELD))
        wait_until(lambda: threading.active_count() >= threads + HELD, 60)
        assert _get(port, path) == 200
        more = [_connect(port) for _ in range(100)]
        held.extend(more)
        # Beyond the bound: refused at once (a 503, then closed), and no thread each.
        refused = _refused(more)
        assert refused >= 100 - (bound - HELD)
        assert threading.active_count() <= threads + bound
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: threading.active_count() <= threads + 5, 60)
    assert _get(port, path) == 200  # every slot came back


def test_connection_limits_are_checked(etcd_url: str) -> None:
    for limits in ({"connection_timeout": 0}, {"connection_timeout": float("nan")},
                   {"max_connections": 0}, {"max_connections": 2.5}):
        with pytest.raises(ConfigError):
            Dashboard(etcd_url, port=0, **limits)


def _refused(socks: List[socket.socket], within: float = 5.0) -> int:
    """How many of ``socks`` the server answered 503 and closed, without being asked."""
    refused = 0
    with selectors.DefaultSelector() as waiting:  # epoll: select() stops at fd 1024
        for sock in socks:
            waiting.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + within
        while waiting.get_map() and time.monotonic() < deadline:
            for key, _ in waiting.select(max(0.0, deadline - time.monotonic())):
                waiting.unregister(key.fileobj)
                refused += _answered_busy(key.fileobj)  # type: ignore[arg-type]
    return refused


def _answered_busy(sock: socket.socket) -> bool:
    try:
        answer = sock.recv(65536)
    except ConnectionResetError:
        return True
    return answer == b"" or answer.startswith(b"HTTP/1.1 503")


def _enough_files(count: int) -> None:
    """Raise the soft limit of open files (both ends of each connection are ours)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count if hard == resource.RLIM_INFINITY else min(count, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < count:
        pytest.skip(f"needs {count} open files (ulimit -n)")
