"""The v2 keys API's HTTP layer: a request as the transport sends it, in; a reply, out.

A transcription of etcd's ``v2http/client.go`` (parseKeyRequest,
writeKeyEvent, writeKeyError, handleKeyWatch) and of the v2 applier
(``etcdserver/apply_v2.go``): which store operation a request becomes, and
what reply etcd writes.  A request is ``(method, target, body)`` exactly as
:meth:`etcdq_v2.wire.Member.request` sends it: ``target`` is
``/v2/keys/<quoted key>?<query>``, ``body`` a form (PUT and POST) or None.

Parsing happens where the request arrives, with that member's clock: a TTL
becomes an absolute expiry there (client.go), so a request delivered late
expires later.  Applying happens when the member applies the raft entry.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Dict, List, Optional, Tuple
from urllib.parse import unquote, unquote_to_bytes

from .store import SECOND, Action, Code, Event, Store, V2Error, Watcher, clean

KEYS_PREFIX = "/v2/keys"
#: Go's net/http refuses a form body larger than this (ParseForm: "http: POST too large").
MAX_FORM = 10 << 20
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


class Route(Enum):
    """Where a request is answered: from the member's own store, or through raft."""

    LOCAL_GET = "local"
    WATCH = "watch"
    RAFT = "raft"


@dataclass
class Reply:
    """What etcd answers: status, headers (lower-case names), body; a watch for wait=true.

    A watch reply's body is empty: its events come from ``watch.take()``,
    one JSON line each, as they would on the connection.
    """

    status: int
    headers: Dict[str, str]
    body: bytes
    watch: Optional[Watcher] = None


@dataclass
class Request:
    """A parsed keys request (etcdserverpb.Request plus noValueOnSuccess)."""

    method: str
    key: str
    value: str = ""
    dir: bool = False
    prev_value: str = ""
    prev_index: int = 0
    prev_exist: Optional[bool] = None
    wait: bool = False
    since: int = 0
    recursive: bool = False
    sorted: bool = False
    quorum: bool = False
    stream: bool = False
    refresh: bool = False
    expire: Optional[int] = None
    no_value_on_success: bool = False

    @property
    def route(self) -> Route:
        if self.method == "GET" and not self.quorum:
            return Route.WATCH if self.wait else Route.LOCAL_GET
        return Route.RAFT


def error_reply(error: V2Error) -> Reply:
    body = (error.json() + "\n").encode("utf-8", "surrogateescape")
    return Reply(error.status, _headers(error.index), body)


def raft_timeout(leader_failed: bool) -> Reply:
    """A proposal that was never committed: 500/300 once the server gives up on it."""
    cause = "etcdserver: request timed out"
    if leader_failed:
        cause += ", possibly due to previous leader failure"
    return error_reply(V2Error(Code.RAFT_INTERNAL, cause, 0))


def parse(method: str, target: str, body: Optional[str], now: int) -> Request:
    """The request, or the V2Error etcd answers before proposing anything (index 0)."""
    path, _, query = target.partition("?")
    if not path.startswith(KEYS_PREFIX):
        raise V2Error(Code.INVALID_FORM, "incorrect key prefix", 0)
    form = _form(method, query, body)
    key = path[len(KEYS_PREFIX):]
    request = Request(method, clean(_unquote(key)))
    request.prev_index = _uint(form, "prevIndex")
    request.since = _uint(form, "waitIndex")
    for name in ("recursive", "sorted", "wait", "dir", "quorum", "stream"):
        setattr(request, name, _bool(form, name, f'invalid value for "{name}"'))
    if request.wait and method != "GET":
        raise V2Error(Code.INVALID_FIELD, '"wait" can only be used with GET requests', 0)
    if "prevValue" in form and not form["prevValue"][0]:
        raise V2Error(Code.PREV_VALUE_REQUIRED, '"prevValue" cannot be empty', 0)
    request.prev_value = _first(form, "prevValue")
    request.no_value_on_success = _bool(form, "noValueOnSuccess",
                                        'invalid value for "noValueOnSuccess"')
    ttl = _ttl(form)
    if "prevExist" in form:
        request.prev_exist = _bool(form, "prevExist", "invalid value for prevExist")
    if "refresh" in form:
        request.refresh = _bool(form, "refresh", "invalid value for refresh")
        if request.refresh and _first(form, "value"):
            raise V2Error(Code.REFRESH_VALUE, "A value was provided on a refresh", 0)
        if request.refresh and ttl is None:
            raise V2Error(Code.REFRESH_TTL_REQUIRED, "No TTL value set", 0)
    request.value = _first(form, "value")
    if ttl is not None:
        request.expire = now + ttl * SECOND
    return request


def answer_local(store: Store, request: Request, now: int) -> Reply:
    """A GET (wait or not) answered from this member's store, without raft."""
    try:
        if request.wait:
            watcher = store.watch(request.key, request.recursive, request.stream, request.since)
            return Reply(200, _headers(watcher.start_index), b"", watcher)
        return _event_reply(store.get(request.key, request.recursive, request.sorted, now),
                            request)
    except V2Error as exc:
        return error_reply(exc)


def apply(store: Store, request: Request, now: int, answer: bool = True) -> Optional[Reply]:
    """A committed request applied to ``store`` (applierV2store), and its reply
    if ``answer`` (only the member that received it answers)."""
    try:
        event = _applied(store, request, now)
    except V2Error as exc:
        return error_reply(exc) if answer else None
    return _event_reply(event, request) if answer else None


def _applied(store: Store, r: Request, now: int) -> Event:
    if r.method == "GET":  # quorum=true: QGET through raft (a wait is ignored there)
        return store.get(r.key, r.recursive, r.sorted, now)
    if r.method == "POST":
        return store.create(r.key, r.dir, r.value, True, r.expire, now)
    if r.method == "DELETE":
        if r.prev_index > 0 or r.prev_value:
            return store.compare_and_delete(r.key, r.prev_value, r.prev_index, now)
        return store.delete(r.key, r.dir, r.recursive, now)
    if r.prev_exist is not None:
        if not r.prev_exist:
            return store.create(r.key, r.dir, r.value, False, r.expire, now)
        if r.prev_index == 0 and not r.prev_value:
            return store.update(r.key, r.value, r.expire, r.refresh, now)
    elif not (r.prev_index > 0 or r.prev_value):
        return store.set(r.key, r.dir, r.value, r.expire, r.refresh, now)
    return store.compare_and_swap(r.key, r.prev_value, r.prev_index, r.value, r.expire,
                                  r.refresh, now)


_SHRUNK = (Action.SET, Action.COMPARE_AND_SWAP, Action.CREATE, Action.UPDATE)


def _event_reply(event: Event, request: Request) -> Reply:
    created = event.action == Action.CREATE or (event.action == Action.SET
                                                  and event.prev is None)
    shrink = request.no_value_on_success and event.action in _SHRUNK
    body = (event.json(without_nodes=shrink) + "\n").encode("utf-8", "surrogateescape")
    return Reply(201 if created else 200, _headers(event.etcd_index), body)


def _headers(index: int) -> Dict[str, str]:
    return {"content-type": "application/json", "x-etcd-index": str(index)}


def _form(method: str, query: str, body: Optional[str]) -> Dict[str, List[str]]:
    """r.Form: a PUT's or POST's body fields first, then the query's (Go's ParseForm)."""
    pairs: List[Tuple[str, str]] = []
    if body is not None and method in ("PUT", "POST", "PATCH"):
        if len(body) > MAX_FORM:
            raise V2Error(Code.INVALID_FORM, "http: POST too large", 0)
        pairs += _pairs(body)
    pairs += _pairs(query)
    form: Dict[str, List[str]] = {}
    for name, value in pairs:
        form.setdefault(name, []).append(value)
    return form


def _pairs(text: str) -> List[Tuple[str, str]]:
    """url.ParseQuery's pairs, as ``parse_qsl(text, keep_blank_values=True,
    errors="surrogateescape")`` gives them, without its cost for the many forms
    that need no unquoting."""
    quoted = "%" in text or "+" in text
    pairs = []
    for field in text.split("&"):
        if field:
            name, _, value = field.partition("=")
            if quoted:
                name, value = _unquote(name.replace("+", " ")), _unquote(value.replace("+", " "))
            pairs.append((name, value))
    return pairs


def _unquote(text: str) -> str:
    """``unquote(text, errors="surrogateescape")``; an ASCII text (what the transport
    sends) is one piece for it, so its regular expression is skipped."""
    if "%" not in text:
        return text
    if text.isascii():
        return unquote_to_bytes(text).decode("utf-8", "surrogateescape")
    return unquote(text, errors="surrogateescape")


def _first(form: Dict[str, List[str]], name: str) -> str:
    return form[name][0] if name in form else ""


def _bool(form: Dict[str, List[str]], name: str, cause: str) -> bool:
    """strconv.ParseBool of the first value; absent is False."""
    if name not in form:
        return False
    text = form[name][0]
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise V2Error(Code.INVALID_FIELD, cause, 0)


def _uint(form: Dict[str, List[str]], name: str) -> int:
    """strconv.ParseUint of the first value; absent is 0."""
    if name not in form:
        return 0
    text = form[name][0]
    if not text.isdigit() or not text.isascii() or int(text) >= 1 << 64:
        raise V2Error(Code.INDEX_NAN, f'invalid value for "{name}"', 0)
    return int(text)


def _ttl(form: Dict[str, List[str]]) -> Optional[int]:
    """Seconds, None when absent or empty (client.go: "ttl is nullable")."""
    if not _first(form, "ttl"):
        return None
    text = form["ttl"][0]
    if not text.isdigit() or not text.isascii() or int(text) >= 1 << 64:
        raise V2Error(Code.TTL_NAN, 'invalid value for "ttl"', 0)
    return int(text)
