"""Every request the library makes passes through one function, ``driver.send``.

A test that puts a wrapper in its place sees every request etcd gets (the
steps', and the ones Protocol sends itself: the snapshot's recursive GET,
export's and import's streamed listings, the lock reads sent together, a
wait's and the view's watch streams, ls's GET), and a request it fails
reaches the caller as the library's exception.  Real etcd; what etcd got is
what the fault proxy (tests/faultproxy.py, passing everything) saw go up.
"""
from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Any, Callable, Iterator, List, Set, Tuple
from urllib.parse import unquote

import pytest

from etcdq_v2 import Queue, connect, driver
from etcdq_v2.errors import Unavailable
from etcdq_v2.protocol import queue_names
from etcdq_v2.steps import Request
from etcdq_v2.transport import Transport

from faultproxy import FaultProxy

#: A request as etcd gets it: its HTTP method, its key, the names in its query.
Line = Tuple[str, str, Tuple[str, ...]]

_REQUEST_LINE = re.compile(rb"(GET|PUT|POST|DELETE) /v2/keys(/[^?\s]*)(?:\?(\S*))? HTTP/1\.1")


def _etcd_got(proxy: FaultProxy) -> Tuple["Counter[Line]", List[bytes]]:
    """The keys API requests the proxy saw, and any other request line but
    wire's version question on a new connection (part of the POST it carries)."""
    got: "Counter[Line]" = Counter()
    other = []
    for line in list(proxy.requests):
        match = _REQUEST_LINE.fullmatch(line)
        if match is None:
            if line != b"GET /version HTTP/1.1":
                other.append(line)
            continue
        method, path, query = match.groups()
        names = sorted(pair.split(b"=")[0].decode() for pair in (query or b"").split(b"&")
                       if pair)
        got[method.decode(), unquote(path.decode()), tuple(names)] += 1
    return got, other


def _lines(request: Request, reply: Any) -> List[Line]:
    """The requests etcd gets for one request through send (none for a question)."""
    method = request.method
    if method in ("GET", "TREE", "LISTING", "STREAM"):
        names = {"GET": {"quorum": request.quorum, "sorted": request.sorted},
                 "LISTING": {"quorum": request.quorum, "sorted": request.sorted},
                 "TREE": {"quorum": request.quorum, "recursive": True},
                 "STREAM": {"wait": True, "recursive": True, "stream": True}}[method]
        return [("GET", request.key, tuple(sorted(name for name, on in names.items() if on)))]
    if method in ("PUT", "POST"):
        return [(method, request.key, ())]
    if method == "DELETE":
        return [("DELETE", request.key, tuple(sorted(
            name for name, value in (("prevIndex", request.prev_index),
                                     ("prevValue", request.prev_value)) if value is not None)))]
    if method == "ALL":
        return [line for one in request.together for line in _lines(one, None)]
    if method == "POSTS":  # the POSTs sent: a None stands for one not sent
        return [("POST", request.key, ())] * sum(1 for result in reply if result is not None)
    return []


@pytest.fixture
def through_send(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tuple["Counter[Line]", Set[str]]]:
    """What etcd gets for the requests passing through driver.send, and their methods."""
    lines: "Counter[Line]" = Counter()
    methods: Set[str] = set()
    send = driver.send
    lock = threading.Lock()  # the view's and the heartbeat's threads send too

    def recording(transport: Transport, request: Request) -> Any:
        with lock:
            methods.add(request.method)
            if request.method != "POSTS":  # what a request that raises asked for too
                lines.update(_lines(request, None))
        reply = send(transport, request)
        if request.method == "POSTS":
            with lock:
                lines.update(_lines(request, reply))
        return reply

    monkeypatch.setattr(driver, "send", recording)
    yield lines, methods


@pytest.fixture
def transport(proxy: FaultProxy) -> Iterator[Transport]:
    etcd = connect(proxy.url)
    yield etcd
    etcd.close()


def _workload(queue: Queue, etcd: Transport) -> None:
    """Every kind of call of the library, each making its own kinds of request."""
    first = queue.put({"n": 0})
    many = queue.put_many([{"n": n} for n in range(1, 5)], in_flight=2)
    queue.put({"delayed": True}, delay=1)
    claim = queue.claim(timeout=5)
    assert claim is not None and claim.id == first
    claim.refresh()  # the heartbeat's request
    claim.complete({"ok": True})
    released = queue.claim(timeout=5)
    assert released is not None
    released.release()
    failed = queue.claim(timeout=5)
    assert failed is not None
    failed.fail("boom")  # claimed again below: C3 reads its records together
    assert queue.items("pending")
    cancelled = many[-1]
    assert queue.cancel(cancelled)
    queue.requeue(cancelled)
    assert queue.wait(first, timeout=5) is not None
    lines = list(queue.export_items())
    assert lines
    queue.import_items(lines)  # every line is there already: skipped
    queue.stats()
    queue.overview()
    queue.get(first)
    assert queue.name in queue_names(etcd, "/etcdq")
    while True:  # until nothing is free: then the view watches the queue
        claim = queue.claim(timeout=0)
        if claim is None:
            break
        claim.complete()
    queue.purge(completed=True, failed=True)


def test_every_request_etcd_gets_passed_through_driver_send(
        proxy: FaultProxy, transport: Transport, queue_name: str,
        through_send: Tuple["Counter[Line]", Set[str]]) -> None:
    """Put, put_many, a delayed put, claims, a refresh, complete, release, fail,
    cancel, requeue, wait, export, import, stats, overview, get, ls, purge, and the
    view's listings and watch: each request etcd got is one that went through
    driver.send (none of them retried: nothing fails on the way)."""
    lines, methods = through_send
    with Queue(transport, queue_name, max_attempts=3, backoff=[0]) as queue:
        _workload(queue, transport)
    got, other = _etcd_got(proxy)
    assert other == []
    assert got - lines == Counter(), "etcd got requests that did not pass through driver.send"
    assert {"GET", "PUT", "DELETE", "POST", "ALL", "POSTS", "TREE", "LISTING",
            "STREAM"} <= methods


@pytest.mark.parametrize("method, call", [
    ("TREE", lambda queue: queue.stats()),
    ("LISTING", lambda queue: list(queue.export_items())),
    ("STREAM", lambda queue: queue.wait(queue.put({}), timeout=5)),
    ("GET", lambda queue: queue_names(queue.etcd, "/etcdq")),
])
def test_a_request_failed_in_driver_send_reaches_the_caller_as_the_library_exception(
        monkeypatch: pytest.MonkeyPatch, etcd_url: str, queue_name: str, method: str,
        call: Callable[[Queue], Any]) -> None:
    """A wrapper of driver.send that fails one kind of request: the call that
    makes it raises that very exception (TREE: stats' snapshot; LISTING:
    export; STREAM: a wait's watch; GET: ls)."""
    send = driver.send
    refused = Unavailable(f"driver.send refused a {method}")

    def refusing(transport: Transport, request: Request) -> Any:
        if request.method == method:
            raise refused
        return send(transport, request)

    with Queue(etcd_url, queue_name) as queue:
        monkeypatch.setattr(driver, "send", refusing)
        with pytest.raises(Unavailable) as raised:
            call(queue)
    assert raised.value is refused
