"""The threaded (blocking) driver of the protocol's steps (steps.py).

:func:`run` drives one step to its end on a :class:`~etcdq_v2.transport.Transport`;
:func:`send` is the one function through which every request the library
makes passes, real or simulated (a simulated etcd is a Transport on a
simulated network), so a test can observe or alter them in one place: each
request of a step, and the requests :class:`~etcdq_v2.protocol.Protocol`
sends itself (a recursive GET, a streamed listing, the lock reads sent
together, a watch stream, the view's included), as one
:class:`~etcdq_v2.steps.Request` each.  A request is one call of the keys
API as the library asks for it; what the transport does to carry it is that
request: its retries on the same or another member, the wait again for a
listing's reply on its connection, and a new connection's version question
before a POST goes on it (wire.Member's proof that the member answers).
The driver holds no rule: it sends what it is asked and hands back what came.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

from .errors import EtcdqError
from .steps import Request, Step, T
from .transport import Reply, Transport


def run(step: Step[T], transport: Transport) -> T:
    """Drive ``step``: send each request it yields (:func:`send`), then send it
    the reply, or throw into it the exception the request raised; return
    what the step returns (or raise what it raises)."""
    # Every request of the library passes here: the loop is written for the
    # common case, a reply sent on.
    error: Optional[BaseException] = None
    try:
        request = step.send(None)
        while True:
            try:
                reply = send(transport, request)
            except BaseException as exc:  # the step decides, and re-raises what it cannot handle
                error = exc
            else:
                request = step.send(reply)
                continue
            try:  # outside the except block: what the step raises is not chained to it
                request = step.throw(error)
            finally:
                # The exception's traceback holds this frame, which held the
                # exception: dropped here, a failed request leaves no cycle.
                error = None
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def send(transport: Transport, request: Request) -> Any:
    """One request, on ``transport``: etcd's Reply (raising the library's
    exception for an error reply or a request that failed), a list of
    replies and errors for ``ALL`` and ``POSTS``, a Listing or an EventStream
    for ``LISTING`` and ``STREAM`` (:func:`_read`), or the answer to a
    question (:func:`_answer`).  Callers outside this module call it as
    ``driver.send``, so that a wrapper put in its place sees their requests."""
    method = request.method
    if method == "GET":
        return transport.get(request.key, quorum=request.quorum, sorted=request.sorted)
    if method == "PUT":
        return transport.put(request.key, request.value, ttl=request.ttl,
                             prev_exist=request.prev_exist, prev_value=request.prev_value,
                             prev_index=request.prev_index, refresh=request.refresh)
    if method == "DELETE":
        return transport.delete(request.key, prev_value=request.prev_value,
                                prev_index=request.prev_index)
    if method == "POST":
        return transport.post(request.key, request.value or "", ttl=request.ttl)
    if method == "ALL":
        return _all(transport, request.together)
    if method == "POSTS":
        return transport.post_many(request.key, [post.value or "" for post in request.together],
                                   lanes=request.lanes, depth=1)
    return _answer(transport, request)


def _answer(transport: Transport, request: Request) -> Any:
    """A step's question to the driver: its clocks, a sleep, a token, its transport's
    highest index seen and deadline; else a read :func:`_read` sends."""
    if request.method == "NOW":
        return transport.runtime.boot_clock()
    if request.method == "WALL":
        return transport.runtime.wall()
    if request.method == "MONOTONIC":
        return transport.runtime.monotonic()
    if request.method == "SLEEP":
        return transport.runtime.sleep(request.seconds)
    if request.method == "TOKEN":
        return transport.runtime.token()
    if request.method == "SEEN":
        return transport.seen_index
    if request.method == "DEADLINE":
        return transport.deadline
    return _read(transport, request)


def _read(transport: Transport, request: Request) -> Any:
    """A recursive GET, a streamed listing or a watch: a few per call of the
    library (a snapshot, an export, a wait, a view's round), none per item, so
    last in the chain."""
    if request.method == "TREE":
        return transport.get(request.key, recursive=True, quorum=request.quorum)
    if request.method == "LISTING":
        return transport.listing(request.key, sorted=request.sorted, quorum=request.quorum)
    if request.method == "STREAM":
        return transport.stream(request.key, idle_timeout=request.seconds)
    raise ValueError(f"no such request: {request.method}")


def _all(transport: Transport, requests: Sequence[Request]
         ) -> List[Union[Reply, EtcdqError]]:
    """Requests sent at once on parallel connections (transport.delete_all, get_all)."""
    if all(request.method == "DELETE" for request in requests):
        return transport.delete_all([(request.key, _condition(request)) for request in requests])
    if all(request.method == "GET" and request.quorum == requests[0].quorum
           for request in requests):
        return transport.get_all([request.key for request in requests],
                                 quorum=requests[0].quorum)
    raise ValueError("requests sent together are all DELETEs or all GETs of one kind")


def _condition(request: Request) -> Dict[str, Any]:
    condition: Dict[str, Any] = {}
    if request.prev_index is not None:
        condition["prevIndex"] = request.prev_index
    if request.prev_value is not None:
        condition["prevValue"] = request.prev_value
    return condition
