"""HTTP to the etcd v2 keys API: one request at a time, retries under our control.

Why not python-etcd's own request path: it lets urllib3 resend a timed-out
PUT up to four times, resends a POST to another member on any error
(duplicate items), rotates members without a lock (unsafe from threads), and
does not quote keys.  See ../shared/etcd-v2-notes.md §9.  This module keeps
python-etcd for what it is good at — an ``etcd.Client`` given by the user is
the configuration (:meth:`Transport.from_client`) — and sends requests itself:

* every request has a ``timeout``; a call retries for at most ``deadline``
  seconds in all, then raises :class:`~etcdq_v2.errors.Unavailable`;
* a request that never reached a member (connection refused) is retried on
  the next member, whatever its method; but once every member refused the
  connection in two rounds in a row, nothing listens there: the call raises
  :class:`Refused` (an Unavailable) at once, not at the deadline.  A member
  that accepts and does not answer (frozen, cut off) still gets the deadline;
* a request that may have been applied (read timeout, reset, etcd's
  500 "request timed out") is retried only if it is not a POST, and the
  reply is marked ``retried`` so that the protocol reads an "already exists"
  or "compare failed" as possibly its own earlier attempt;
* a POST whose outcome is unknown raises :class:`AmbiguousWrite`; the
  protocol resolves it by looking for the item's token (never a blind resend);
  :meth:`Transport.post_many` sends many POSTs at once and returns each one's
  outcome, AmbiguousWrite for those in doubt, the same way;
* members are rotated under a lock, so many threads may share one Transport;
* observers (:meth:`Transport.add_observer`) are told of every request: its
  method, its time and how it failed, which is what metrics count.

wire.py carries the bytes (keep-alive HTTP/1.1, a pool of connections per
member shared by all threads); this module decides what a failure means, in
one place (:class:`_translated`).
"""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import string
import math
from collections import Counter
from contextlib import contextmanager
from typing import (Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union,
                    overload)
from urllib.parse import urlsplit

from .errors import (AlreadyExists, AmbiguousWrite, AuthError, CompareFailed, ConfigError,
                     EtcdFailure, EtcdqError, KeyMissing, Unavailable)
from .listing import listed_nodes
from .runtime import SYSTEM, Runtime
from .wire import (Connection, Lost, Member, NotSent, Response, TLSFailed, Unanswered,
                   tls_context)
from .wire import Refused as _RefusedConnect

log = logging.getLogger("etcdq_v2.transport")

_ERRORS = {cls.code: cls for cls in (KeyMissing, CompareFailed, AlreadyExists)}
_RAFT_INTERNAL = 300
_NO_PERMISSION = 110

Node = Dict[str, Any]
T = TypeVar("T")
#: ``observer(method, seconds, error)``, told of every request (see Transport.add_observer).
Observer = Callable[[str, float, Optional[str]], None]


class UndecodableReply(Unavailable):
    """etcd's reply came, but its JSON cannot be decoded (not JSON, or nested
    too deep): sending the same request again would get the same reply."""


class Refused(Unavailable):
    """Every endpoint refused the connection, in two rounds in a row: no etcd
    listens there (not started, or the wrong address); ``endpoints`` names them."""

    def __init__(self, message: str, endpoints: Sequence[str]) -> None:
        super().__init__(message)
        self.endpoints = list(endpoints)


class Reply:
    """One answer of etcd: its node (decoded when first asked for) and etcd's index.

    Most writes' replies are never read (a lock create, a record), so their
    JSON is not decoded.
    """

    __slots__ = ("_body", "_node", "index")

    def __init__(self, body: bytes, index: int) -> None:
        self._body = body
        self._node: Optional[Node] = None
        self.index = index

    @property
    def node(self) -> Node:
        if self._node is None:
            try:
                self._node = json.loads(self._body.decode("utf-8")).get("node") or {}
            except (ValueError, AttributeError):  # not JSON, or not an object
                raise UndecodableReply(f"etcd sent a reply that is not etcd's JSON: "
                                       f"{self._body[:80]!r}") from None
            except RecursionError:  # a recursive GET of directories nested ~500 deep
                raise UndecodableReply("etcd sent a reply nested too deep to decode (a "
                                       "directory tree hundreds of levels deep)") from None
        return self._node

    @property
    def written_index(self) -> int:
        """A write's modifiedIndex.  etcd sends it as the X-Etcd-Index header
        (each write has an index of its own), so the JSON is decoded only if
        that header is missing."""
        return self.index or int(self.node["modifiedIndex"])


class _Transient(Exception):
    """A failure worth another try; ``sent`` tells if the request may have applied,
    ``refused`` that the member refused the connection (nothing listens).

    ``label`` names it for observers: Timeout, NotSent (never reached etcd),
    Lost (the connection broke after sending), or the one given (ServerError).
    """

    def __init__(self, message: str, sent: bool, timed_out: bool = False,
                 label: Optional[str] = None, refused: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.refused = refused
        self.timed_out = timed_out
        self.label = label or ("Timeout" if timed_out else "Lost" if sent else "NotSent")


def parse_endpoints(endpoints: Union[str, Sequence[str]]) -> List[str]:
    """``"http://a:2379,https://b:2379"`` -> a list of base URLs; ConfigError if bad.

    An endpoint with credentials in it (``http://user:pw@host:port``) is
    refused, and its message leaves them out: credentials come from
    ``username``/``password`` only, and a URL is printed in errors and logs.
    """
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    urls = [item.strip().rstrip("/") for item in items if item.strip()]
    if not urls:
        raise ConfigError("no etcd endpoint given")
    for url in urls:
        parts = urlsplit(url)
        if "@" in parts.netloc:
            raise ConfigError(
                f"etcd endpoint {parts.scheme}://...@{parts.netloc.rpartition('@')[2]} "
                "carries credentials: give the user with --username (username=) and the "
                "password with ETCDQ_PASSWORD (password=), never in the URL")
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None \
                or parts.path or parts.query:
            raise ConfigError(f"bad etcd endpoint {url!r}: expected http(s)://HOST:PORT")
    return urls


def is_loopback(host: str) -> bool:
    """True for a loopback address (or ``localhost``): only this host reaches it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_cleartext(urls: List[str], tls: bool, auth: bool) -> None:
    """ConfigError for TLS files with an http:// endpoint (they would be ignored, and
    the password sent in clear); a warning for a password sent in clear off this host."""
    plain = [url for url in urls if urlsplit(url).scheme == "http"]
    if tls and plain:
        raise ConfigError(f"TLS files were given but {', '.join(plain)} is http://: "
                          "use https:// endpoints (or leave out the TLS files)")
    remote = [url for url in plain if not is_loopback(urlsplit(url).hostname or "")]
    if auth and remote:
        log.warning("the etcd password goes in clear text (basic auth over http://) to %s: "
                    "use https:// endpoints", ", ".join(remote))


class _translated:  # noqa: N801  (a context manager, named like contextlib.suppress)
    """The one place where wire errors become the library's; every path to a
    member runs inside it: requests, parallel deletes, streams.

    * NotSent -> _Transient(sent=False): nothing reached etcd, resend anywhere
      (``refused`` for wire's Refused: nothing listens);
    * Lost -> _Transient(sent=True): it may have been applied;
    * TLSFailed -> ConfigError: a certificate or a TLS alert, no retry mends it;
    * any other socket, ssl or parsing error (wire.py should have named it) ->
      _Transient(sent=True).

    Our own errors, and BaseExceptions such as KeyboardInterrupt, pass
    through.  A class, not @contextmanager: this runs on every request, and a
    generator costs four times as much (0.7 against 0.2 µs).
    """

    __slots__ = ("_endpoint",)

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Optional[type], exc: Optional[BaseException],
                 traceback: Any) -> None:
        if isinstance(exc, (EtcdqError, _Transient)):
            return
        if isinstance(exc, (NotSent, Lost, TLSFailed, OSError, ValueError, IndexError)):
            raise _translation(self._endpoint, exc) from None


def _translation(endpoint: str, exc: Exception) -> Exception:
    if isinstance(exc, TLSFailed):
        return ConfigError(f"TLS with {endpoint} failed: {exc} "
                           "(check the CA certificate and the client certificate/key)")
    if isinstance(exc, NotSent):
        return _Transient(str(exc), sent=False, refused=isinstance(exc, _RefusedConnect))
    if isinstance(exc, Lost):
        return _Transient(str(exc), sent=True, timed_out=exc.timed_out)
    timed_out = isinstance(exc, (socket.timeout, BlockingIOError))
    return _Transient(f"{type(exc).__name__}: {exc}", sent=True, timed_out=timed_out)


class Transport:
    """A thread-safe client for the etcd v2 keys API.

    ``timeout`` bounds each request; ``deadline`` (default ``3 * timeout``)
    bounds a whole call including its retries on other members.
    """

    def __init__(self, endpoints: Union[str, Sequence[str]], *, timeout: float = 5.0,
                 deadline: Optional[float] = None, ca_cert: Optional[str] = None,
                 cert: Optional[str] = None, key: Optional[str] = None,
                 username: Optional[str] = None, password: Optional[str] = None,
                 runtime: Runtime = SYSTEM,
                 member_factory: Optional[Callable[[str], Member]] = None) -> None:
        #: The clocks, locks and randomness of this client and the queues on it.
        self.runtime = runtime
        self.endpoints = parse_endpoints(endpoints)
        if timeout <= 0:
            raise ConfigError("timeout must be positive")
        self.timeout = float(timeout)
        self.deadline = float(deadline) if deadline else 3 * self.timeout
        tls = tls_context(ca_cert, cert, key) if (ca_cert or cert or key) else None
        # member_factory(url): what carries the requests to each endpoint
        # instead of wire.Member (the simulator's network); None: the real one.
        self._members = [member_factory(url) if member_factory is not None else
                         Member(url, tls=tls, username=username, password=password)
                         for url in self.endpoints]
        self._current = 0
        self._lock = runtime.Lock()
        self._limit = runtime.local()
        self.requests: Counter[str] = Counter()
        self._observers: Tuple[Observer, ...] = ()
        #: The largest X-Etcd-Index of a reply so far.  etcd applied that index
        #: before it answered, so a write sent after this was read lands above it.
        self.seen_index = 0

    @classmethod
    def from_client(cls, client: Any, runtime: Runtime = SYSTEM) -> "Transport":
        """Take endpoints, credentials, TLS files and timeout from an ``etcd.Client``."""
        pool_kw = getattr(client.http, "connection_pool_kw", {})
        endpoints = [client.base_uri] + [m for m in client._machines_cache if m != client.base_uri]
        timeout = client.read_timeout if client.read_timeout and client.read_timeout > 0 else 5.0
        return cls(endpoints, timeout=min(timeout, 5.0), ca_cert=pool_kw.get("ca_certs"),
                   cert=pool_kw.get("cert_file"), key=pool_kw.get("key_file"),
                   username=client.username, password=client.password, runtime=runtime)

    def add_observer(self, observer: Observer) -> None:
        """Call ``observer(method, seconds, error)`` after every request to a member.

        ``method`` is GET, PUT, POST, DELETE, or "watch" (a stream's start, up
        to etcd's headers); ``seconds`` its time; ``error`` None for a success,
        else the name of what it raised: KeyMissing, CompareFailed,
        AlreadyExists (answers the protocol expects in races), AuthError,
        EtcdFailure, ConfigError, or a failure that is retried: Timeout,
        NotSent, Lost, ServerError (etcd's 5xx).  Each retry is a request of
        its own, and so is a retry that waits again for a listing's reply on
        its connection (see _call; :attr:`requests` counts only what was
        sent).  Observers run in the requesting thread and must be quick; one
        that raises is logged and does not affect the request.
        """
        with self._lock:
            self._observers = self._observers + (observer,)

    def remove_observer(self, observer: Observer) -> None:
        """Stop calling ``observer`` (added by :meth:`add_observer`); no-op if absent."""
        with self._lock:
            self._observers = tuple(o for o in self._observers if o is not observer)

    # -- the keys API ------------------------------------------------------
    def get(self, key: str, *, sorted: bool = False, quorum: bool = False,
            recursive: bool = False) -> Reply:
        query = {"sorted": sorted, "quorum": quorum, "recursive": recursive}
        # A directory's read (this library lists sorted or recursively, and
        # reads a key neither way) is waited for when unanswered; a key's is
        # sent again (see _call).
        return self._call("GET", key, query=query, wait_unanswered=sorted or recursive)

    def put(self, key: str, value: Optional[str] = None, *, ttl: Optional[int] = None,
            prev_exist: Optional[bool] = None, prev_value: Optional[str] = None,
            prev_index: Optional[int] = None, refresh: bool = False) -> Reply:
        # Spelled out rather than a dict through _encode: this is every claim's
        # and completion's request, and the generic loop cost more than the rest.
        fields = [] if value is None else [f"value={_quote(value, _FORM_QUOTING)}"]
        if ttl is not None:
            fields.append(f"ttl={ttl}")
        if prev_exist is not None:
            fields.append("prevExist=true" if prev_exist else "prevExist=false")
        if prev_value is not None:
            fields.append(f"prevValue={_quote(prev_value, _FORM_QUOTING)}")
        if prev_index is not None:
            fields.append(f"prevIndex={prev_index}")
        if refresh:
            fields.append("refresh=true")
        return self._call("PUT", key, body="&".join(fields))

    def post(self, key: str, value: str, *, ttl: Optional[int] = None) -> Reply:
        """Create an in-order key under ``key``; never resent once it may have applied."""
        body = f"value={_quote(value, _FORM_QUOTING)}"
        return self._call("POST", key, body=body if ttl is None else f"{body}&ttl={ttl}")

    def post_many(self, key: str, values: Sequence[str], *, lanes: int, depth: int
                  ) -> List[Union[Reply, EtcdqError, None]]:
        """POST each value under ``key`` (in-order keys), several in flight, in order.

        They travel as :meth:`wire.Member.pipeline` sends them: on ``lanes``
        connections, ``depth`` awaiting their replies on each.  Each asks for
        ``noValueOnSuccess``: etcd then answers a success without the node
        (no echo of the value to encode and send), and the Reply's ``index``
        (etcd's X-Etcd-Index header, the POST's own index) is what names the
        key.  Each result is the Reply; an AmbiguousWrite (it may have applied: its reply was lost,
        or etcd answered "request timed out"), which is never resent; another
        EtcdqError that etcd answered; or None: not sent, because an earlier
        POST failed.  The Nones are always the last results: the caller
        settles the others first, then posts those values again.  A round
        that sends nothing is tried again on the next member, until the
        deadline (Unavailable).
        """
        requests = _Posts(_path(key, None), values)
        return self._retrying("POST", key, lambda member, timeout, retried: self._piped(
            member, key, requests, timeout, lanes, depth), observed=False)

    def _piped(self, member: Member, key: str, requests: Sequence[Tuple[str, str, Optional[str]]],
               timeout: float, lanes: int, depth: int) -> List[Union[Reply, EtcdqError, None]]:
        """One round of post_many on ``member``; _Transient(sent=False) if it sent
        nothing, which observers see as one POST that failed."""
        started = self.runtime.monotonic()
        try:
            with _translated(member.url):
                piped = member.pipeline(requests, timeout, lanes=lanes, depth=depth)
            if all(isinstance(outcome, NotSent) for outcome, _ in piped):
                raise _Transient("no connection could carry the POSTs", sent=False)
        except _Transient:
            with self._observed("POST", self.runtime.monotonic() - started):
                raise
        sent = sum(1 for outcome, _ in piped if not isinstance(outcome, NotSent))
        with self._lock:
            self.requests["POST"] += sent
        results = [self._posted(member, key, outcome, seconds) for outcome, seconds in piped]
        if any(isinstance(result, AmbiguousWrite) for result in results):
            self._failed(member)  # the next round (and request) tries the next member
        return results

    def _posted(self, member: Member, key: str, outcome: Union[Response, Exception],
                seconds: float) -> Union[Reply, EtcdqError, None]:
        """One post_many result, reported to the observers with its own time."""
        if isinstance(outcome, NotSent):
            return None
        try:
            with self._observed("POST", seconds), _translated(member.url):
                if isinstance(outcome, Exception):
                    raise outcome
                return self._reply(member, outcome, retried=False)
        except _Transient as exc:
            return AmbiguousWrite(f"POST {key} may or may not have applied ({member.url}: {exc})")
        except EtcdqError as exc:
            return exc

    def delete(self, key: str, *, prev_value: Optional[str] = None,
               prev_index: Optional[int] = None) -> Reply:
        query = {"prevValue": prev_value, "prevIndex": prev_index}
        return self._call("DELETE", key, query=query)

    def delete_all(self, deletes: Sequence[Tuple[str, Dict[str, Any]]]
                   ) -> List[Union[Reply, EtcdqError]]:
        """Conditional deletes ``(key, {"prevValue"|"prevIndex": ...})``, sent at once.

        They travel on parallel connections, so etcd commits them together;
        one that fails on the way is redone alone, with the usual retries.
        Each result is the reply or the EtcdqError its delete raised.
        """
        return self._all("DELETE", deletes)

    def get_all(self, keys: Sequence[str], *, quorum: bool = False
                ) -> List[Union[Reply, EtcdqError]]:
        """GETs of ``keys``, sent at once as :meth:`delete_all` sends its deletes:
        quorum reads in flight together share etcd's raft batch and WAL fsync,
        and cost one round trip, not one each.  KeyMissing for a key not there."""
        return self._all("GET", [(key, {"quorum": quorum}) for key in keys])

    def _all(self, method: str, calls: Sequence[Tuple[str, Dict[str, Any]]]
             ) -> List[Union[Reply, EtcdqError]]:
        """``method`` on each ``(key, query)``, on parallel connections to one
        member, within one request timeout; one that failed on the way is sent
        again alone, with the usual retries."""
        member = self._member()
        with self._lock:
            self.requests[method] += len(calls)
        requests = [(method, _path(key, query), None) for key, query in calls]
        answers: Sequence[Union[Response, Exception]]
        started = self.runtime.monotonic()
        try:
            with _translated(member.url):
                answers = member.request_all(requests, self.timeout)
        except _Transient as exc:
            answers = [exc] * len(requests)
        seconds = self.runtime.monotonic() - started
        if any(isinstance(answer, Exception) for answer in answers):
            self._failed(member)  # those redone go to the next member
        results: List[Union[Reply, EtcdqError]] = []
        down: List[Unavailable] = []  # a redo that spent its deadline on every member
        for (key, query), answer in zip(calls, answers):
            results.append(self._one_of_all(member, method, key, query, answer, seconds, down))
        return results

    def _one_of_all(self, member: Member, method: str, key: str, query: Dict[str, Any],
                    answer: Union[Response, Exception], seconds: float,
                    down: List[Unavailable]) -> Union[Reply, EtcdqError]:
        """One :meth:`_all` result: its reply, its error, or the outcome of redoing it.

        Observers see each request with the time of the whole batch (they
        travelled together).  Once one redo of the batch was Unavailable (it
        tried every member for a deadline), the others fail with it at once:
        they would ask the same members, and a batch must cost one deadline,
        not one per request.
        """
        try:
            with self._observed(method, seconds), _translated(member.url):
                if isinstance(answer, Exception):
                    raise answer
                return self._reply(member, answer, retried=False)
        except _Transient:
            if down:
                return down[0]
            try:
                return self._call(method, key, query=query)
            except Unavailable as exc:
                down.append(exc)
                return exc
            except EtcdqError as exc:
                return exc
        except EtcdqError as exc:
            return exc

    def stream(self, key: str, *, idle_timeout: Optional[float] = None) -> "EventStream":
        """A live recursive watch of ``key``: every event after it was registered.

        etcd registers a streaming watcher only when it has no past event to
        answer with, so this never asks for a waitIndex; the caller lists the
        directory *after* this returns and skips events the listing includes.
        Like every request, it moves on to the next member when one fails,
        until the deadline.
        """
        path = _path(key, {"wait": True, "recursive": True, "stream": True})
        return self._retrying("watch", key, lambda member, timeout, retried:
                              self._watch(member, path, idle_timeout, timeout))

    def _watch(self, member: Member, path: str, idle_timeout: Optional[float],
               timeout: float) -> "EventStream":
        with _translated(member.url):
            connection, response = member.stream(path, idle_timeout, timeout)
            if response.status != 200:
                raise self._error(member.url, response.status, response.body)
        return EventStream(connection, member.url,
                           int(response.headers.get("x-etcd-index") or 0))

    def listing(self, key: str, *, sorted: bool = False, quorum: bool = False) -> "Listing":
        """A directory's listing, read as it arrives (:meth:`Listing.nodes`).

        Sent as a GET is, on a connection of its own, and retried on the next
        member until the deadline (one unanswered at its timeout is waited
        for again, as _call waits for a listing); KeyMissing for a missing
        directory.  Once
        its body is being read a failure cannot be retried without yielding
        children twice: it raises Unavailable, and the caller lists again.
        """
        path = _path(key, {"sorted": sorted, "quorum": quorum})
        waiting: Dict[int, Any] = {}  # as _call's for a listing
        try:
            return self._retrying("GET", key, lambda member, timeout, retried:
                                  self._open_listing(member, path, timeout, waiting))
        finally:
            _close_kept(waiting)

    def _open_listing(self, member: Member, path: str, timeout: float,
                      waiting: Dict[int, Any]) -> "Listing":
        """One attempt: sent, or waited for again on this call's connection
        to ``member`` whose reply had not begun (see _call)."""
        again = waiting.pop(id(member), None)
        if again is None:
            with self._lock:
                self.requests["GET"] += 1
        with _translated(member.url):
            try:
                # The body is read with the request timeout between its bytes: an
                # attempt's ``timeout`` is what is left of the deadline, which a
                # listing waited for (begun in the call's last attempt) has little of.
                connection, response = member.stream(path, self.timeout, timeout,
                                                     waiting=again, may_wait=True)
            except Unanswered as exc:
                waiting[id(member)] = exc.waiting
                raise
            if response.status != 200:
                raise self._error(member.url, response.status, response.body)
        return Listing(connection, response.headers, member.url)

    @contextmanager
    def time_limit(self, seconds: float) -> Iterator[None]:
        """Calls made by this thread inside the block give up after ``seconds``.

        The heartbeat uses it: a refresh that cannot succeed before the lock
        would expire is worthless, so it must not wait out the full deadline.
        """
        previous = getattr(self._limit, "seconds", None)
        self._limit.seconds = seconds
        try:
            yield
        finally:
            self._limit.seconds = previous

    def spending(self) -> "_Spending":
        """One call of the library's (a claim): inside the block, once
        :meth:`spent` is called, this thread's later requests try for one
        ``timeout`` each, not a whole deadline.

        A listing the view could not make within its deadline, and went on
        without, must not leave the claim's next request another whole
        deadline (a frozen etcd raised Unavailable only after two).  A
        request that merely took long, and answered, spends nothing: a lock
        create stalled by a failover still gets its deadline.
        """
        return _Spending(self._limit)

    def spent(self) -> None:
        """This thread's call spent its deadline on a request it went on
        without (see :meth:`spending`; outside that block, nothing)."""
        if getattr(self._limit, "until", None) is not None:
            self._limit.until = self.runtime.monotonic()

    def arriving(self) -> bool:
        """Whether a reply is arriving: bytes of one still being read came within
        the last request ``timeout``.  A large listing on a slow link keeps
        arriving for longer than a deadline; a member that stopped answering
        sends nothing."""
        return any(member.arriving(self.timeout) for member in self._members)

    def close(self) -> None:
        """Close every pooled connection, whichever thread opened it.

        A connection in use closes when its request ends; a later call opens
        new ones.  Streams are closed by their own :meth:`EventStream.release`.
        """
        for member in self._members:
            member.close()

    # -- requests and retries ---------------------------------------------
    def _call(self, method: str, key: str, *, query: Optional[Dict[str, Any]] = None,
              body: Optional[str] = None, wait_unanswered: bool = False) -> Reply:
        """One request, retried (_retrying).  ``wait_unanswered`` (a listing):
        one whose reply had not begun when it timed out (Unanswered) is waited
        for again when the call comes back to its member, not sent there
        again: etcd goes on encoding a listing its client gave up on (whole,
        before its first byte), and one more only doubles its work.  Another
        member may still answer first.  A key's read is sent again instead: it
        costs etcd little, and a read etcd dropped (a quorum read during a
        leader change) is answered only when sent again, not on its connection
        (etcd answers that one after its own 7 s timeout).  Only within this
        call: a later call's read must not take a reply from before it (a
        read-back after a write)."""
        path = _path(key, query)
        # id(member) -> its Unanswered.waiting; None: nothing is waited for
        waiting: Optional[Dict[int, Any]] = {} if wait_unanswered else None
        try:
            return self._retrying(method, key, lambda member, timeout, retried: self._send(
                member, method, path, body, timeout, retried, waiting))
        finally:
            if waiting:
                _close_kept(waiting)

    def _retrying(self, method: str, key: str, attempt: Callable[[Member, float, bool], T],
                  observed: bool = True) -> T:
        """``attempt(member, timeout, retried)`` until it succeeds, moving to the
        next member after each transient failure, for at most the deadline.
        ``observed=False``: the attempt reports its requests itself.

        Once a round of attempts over every member failed, each attempt waits
        first, the pause doubling with each round (up to 1 s).  A round in
        which every member refused the connection, twice in a row, ends the
        call (:class:`Refused`): nothing listens there, and waiting out the
        deadline would only make a user of a mistyped endpoint wait.  Any
        other failure (a timeout, a reset, a 5xx) starts the count again.
        """
        limit = getattr(self._limit, "seconds", None)
        deadline = min(self.deadline, limit) if limit is not None else self.deadline
        until = getattr(self._limit, "until", None)
        if until is not None and until < math.inf:  # see spending()
            deadline = min(deadline, max(until - self.runtime.monotonic(), self.timeout))
        give_up = self.runtime.monotonic() + deadline
        retried, attempts, last = False, 0, ""
        # member -> refused connects in a row; a dict, not a Counter: one is
        # made per request, and a Counter costs a few microseconds to make
        refusals: Dict[int, int] = {}
        while True:
            member = self._member()
            remaining = give_up - self.runtime.monotonic()
            try:
                if not (observed and self._observers):  # nobody to tell: no _Observed
                    return attempt(member, min(self.timeout, max(remaining, 0.05)), retried)
                with self._observed(method):
                    return attempt(member, min(self.timeout, max(remaining, 0.05)), retried)
            except _Transient as exc:
                last = f"{member.url}: {exc}"
                self._failed(member)
                if exc.sent and method == "POST":
                    raise AmbiguousWrite(f"POST {key} may or may not have applied ({last})"
                                         ) from None
                retried = retried or exc.sent
                self._count_refusal(refusals, member, exc, method, key)
            attempts += 1
            rounds = attempts // len(self._members)
            pause = min(0.05 * 2 ** rounds, 1.0) if rounds else 0.0
            if self.runtime.monotonic() + pause >= give_up:
                raise Unavailable(f"etcd did not answer {method} {key} within "
                                  f"{deadline:g}s (last error: {last})")
            self.runtime.sleep(pause)

    def _count_refusal(self, refusals: Dict[int, int], member: Member, exc: _Transient,
                       method: str, key: str) -> None:
        """Count a refused connect to ``member`` (any other failure clears the
        count); Refused once every member refused twice in a row."""
        if not exc.refused:
            refusals.clear()
            return
        refusals[id(member)] = refusals.get(id(member), 0) + 1
        if len(refusals) == len(self._members) and min(refusals.values()) >= 2:
            raise Refused(f"no etcd listens at {', '.join(self.endpoints)}: every endpoint "
                          f"refused the connection, twice ({method} {key})",
                          self.endpoints) from None

    def _observed(self, method: str, seconds: Optional[float] = None) -> "_Observed":
        """Report the request made inside the block to the observers (timed
        from here unless ``seconds`` is given)."""
        return _Observed(self._observers, method, seconds, self.runtime)

    def _send(self, member: Member, method: str, path: str, body: Optional[str],
              timeout: float, retried: bool, waiting: Optional[Dict[int, Any]]) -> Reply:
        """One attempt: sent, or, if ``member`` has this call's unanswered
        listing in ``waiting``, waited for again (see _call)."""
        again = None if waiting is None else waiting.pop(id(member), None)
        if again is None:
            with self._lock:
                self.requests[method] += 1
        with _translated(member.url):
            try:
                response = member.request(method, path, body, timeout, waiting=again,
                                          may_wait=waiting is not None)
            except Unanswered as exc:  # raised only with may_wait: waiting is this call's
                if waiting is not None:
                    waiting[id(member)] = exc.waiting
                raise
            return self._reply(member, response, retried)

    def _reply(self, member: Member, response: Response, retried: bool) -> Reply:
        """The Reply of a success; raises the error (or _Transient) of a failure."""
        if response.status in (200, 201):
            index = int(response.headers.get("x-etcd-index") or 0)
            if index > self.seen_index:  # a lost race keeps a smaller one: still a bound
                self.seen_index = index
            return Reply(response.body, index)
        error = self._error(member.url, response.status, response.body)
        if isinstance(error, EtcdFailure):
            error.retried = retried
        raise error

    def _error(self, endpoint: str, status: int, data: bytes) -> Exception:
        """Turn an error reply into our exception (raised, or retried if _Transient)."""
        try:
            doc = json.loads(data)
            code = int(doc.get("errorCode", 0))
        except (ValueError, TypeError, AttributeError):
            doc, code = {}, 0
        message = f"{doc.get('message', '')} [{doc.get('cause', '')}]".strip()
        if status == 401 or code == _NO_PERMISSION:
            return AuthError(f"etcd at {endpoint} refused access: {message or status}")
        if code in _ERRORS:
            return _ERRORS[code](message, code=code, index=doc.get("index"))
        if code == _RAFT_INTERNAL or status >= 500:
            return _Transient(f"HTTP {status} {message}", sent=True, label="ServerError")
        if status == 404 and not doc:
            return ConfigError(f"{endpoint} does not serve the etcd v2 API "
                               "(start etcd 3.4/3.5 with --enable-v2)")
        return EtcdFailure(f"etcd at {endpoint}: HTTP {status} {message}", code=code,
                           index=doc.get("index"))

    def _member(self) -> Member:
        members = self._members
        if len(members) == 1:  # the usual single endpoint: no lock to take
            return members[0]
        with self._lock:
            return members[self._current]

    def _failed(self, member: Member) -> None:
        """Move on from ``member`` unless another thread already did."""
        with self._lock:
            if self._members[self._current] is member:
                self._current = (self._current + 1) % len(self._members)


class _Spending:
    """Transport.spending's block: a class, not @contextmanager, since every
    claim runs inside one (a generator's context is a generator and four calls
    more)."""

    __slots__ = ("_limit", "_previous")

    def __init__(self, limit: Any) -> None:
        self._limit = limit
        self._previous: Optional[float] = None

    def __enter__(self) -> None:
        self._previous = getattr(self._limit, "until", None)
        self._limit.until = math.inf

    def __exit__(self, kind: Optional[type], exc: Optional[BaseException],
                 traceback: Any) -> None:
        self._limit.until = self._previous


class _Observed:
    """The observers' report of one request: a context manager around it.

    A class like :class:`_translated`, for the same reason; with no observer
    it does nothing but compare a tuple.  Exceptions pass through unchanged.
    """

    __slots__ = ("_observers", "_method", "_seconds", "_started", "_runtime")

    def __init__(self, observers: Tuple[Observer, ...], method: str,
                 seconds: Optional[float], runtime: Runtime = SYSTEM) -> None:
        self._observers = observers
        self._runtime = runtime
        self._method = method
        self._seconds = seconds
        self._started = 0.0

    def __enter__(self) -> None:
        if self._observers and self._seconds is None:
            self._started = self._runtime.monotonic()

    def __exit__(self, kind: Optional[type], exc: Optional[BaseException],
                 traceback: Any) -> None:
        if not self._observers or (exc is not None and not isinstance(exc, Exception)):
            return  # nobody listens, or a KeyboardInterrupt: not a request's outcome
        seconds = self._seconds if self._seconds is not None \
            else self._runtime.monotonic() - self._started
        error = None if exc is None else _error_label(exc)
        for observer in self._observers:
            try:
                observer(self._method, seconds, error)
            except Exception:  # a metrics bug must not fail the request
                log.exception("request observer %r failed", observer)


def _error_label(exc: BaseException) -> str:
    """How observers name a request's failure (see Transport.add_observer)."""
    return exc.label if isinstance(exc, _Transient) else type(exc).__name__


class EventStream:
    """The events of one streaming watch, until etcd or :meth:`close` ends it."""

    def __init__(self, connection: Connection, endpoint: str, index: int = 0) -> None:
        self._connection = connection
        self._endpoint = endpoint
        #: etcd's index when it registered the watch (X-Etcd-Index; 0: not
        #: given): every event after it comes on this stream.
        self.index = index

    def blocks(self) -> Iterator[bytes]:
        """Events as raw JSON lines, in blocks; ends quietly after ``idle_timeout``."""
        try:
            with _translated(self._endpoint):
                yield from self._connection.blocks()
        except _Transient as exc:
            if exc.timed_out:
                return  # idle for idle_timeout: the caller subscribes again
            if not self._connection.closed:
                raise Unavailable(f"watch stream from {self._endpoint} broke: {exc}") from None
        finally:
            self._connection.close()

    def set_idle_timeout(self, seconds: float) -> None:
        """End :meth:`blocks` after ``seconds`` without events from now (the reading
        thread only): a reader with a deadline shortens the wait as it nears."""
        self._connection.set_timeout(max(seconds, 0.001))

    def close(self) -> None:
        """Unblock a reader waiting on this stream (from another thread)."""
        self._connection.interrupt()

    def release(self) -> None:
        """Close the connection: for the reading thread, once it is done reading."""
        self._connection.close()


class Listing:
    """A directory listing whose body is still to be read: etcd's index, and its children."""

    def __init__(self, connection: Connection, headers: Dict[str, str], endpoint: str) -> None:
        self._connection = connection
        self._headers = headers
        self._endpoint = endpoint
        #: The X-Etcd-Index of the reply: the listing shows the store at this index.
        self.index = int(headers.get("x-etcd-index") or 0)

    def nodes(self) -> Iterator[Node]:
        """The children, decoded one by one as the body arrives; the connection is
        closed at the end (or when the caller stops).  Unavailable if it breaks off."""
        try:
            with _translated(self._endpoint):
                yield from listed_nodes(self._connection.pieces(self._headers))
        except _Transient as exc:
            raise Unavailable(f"a listing from {self._endpoint} broke off: {exc}") from None
        finally:
            self._connection.close()


_Request = Tuple[str, str, Optional[str]]


class _Posts(Sequence[_Request]):
    """post_many's requests, each form-encoded only when the pipeline takes it
    (just before it is sent): a form-encoded value is up to three times the
    value, so a chunk of large values encoded at once would hold them all."""

    def __init__(self, path: str, values: Sequence[str]) -> None:
        self._path, self._values = path, values

    def __len__(self) -> int:
        return len(self._values)

    @overload
    def __getitem__(self, index: int) -> _Request: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[_Request]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[_Request, Sequence[_Request]]:
        if isinstance(index, slice):
            return [self._request(value) for value in self._values[index]]
        return self._request(self._values[index])

    def _request(self, value: str) -> _Request:
        return ("POST", self._path, f"value={_quote(value, _FORM_QUOTING)}&noValueOnSuccess=true")


def _quoting(safe: str, space: str) -> List[str]:
    """A ``str.translate`` table for UTF-8 bytes decoded as Latin-1: what
    ``urllib.parse.quote`` (or ``quote_plus`` when ``space`` is "+") produces.

    A drain's profile had ``urlencode`` at a third of a consumer's CPU (its
    quoting loops over every character in Python); one C-level translate of
    the whole value gives the same text.
    """
    kept = set(string.ascii_letters + string.digits + "_.-~" + safe)
    return [space if byte == 0x20 else chr(byte) if chr(byte) in kept else f"%{byte:02X}"
            for byte in range(256)]


_PATH_QUOTING = _quoting("/", "%20")
_FORM_QUOTING = _quoting("", "+")


def _quote(text: str, table: List[str]) -> str:
    return text.encode("utf-8").decode("latin-1").translate(table)


def _close_kept(waiting: Dict[int, Any]) -> None:
    """Close the connections a call kept for its unanswered listings: a later
    call must not take a reply from before it (a read-back after a write)."""
    for connection in waiting.values():
        connection.close()


def _path(key: str, query: Optional[Dict[str, Any]]) -> str:
    path = f"/v2/keys{_quote(key, _PATH_QUOTING)}"
    params = _encode(query) if query else ""
    return f"{path}?{params}" if params else path


def _encode(params: Dict[str, Any]) -> str:
    """Query encoding with etcd's spelling of booleans; None and False are left out.

    (PUT forms, where prevExist=false is a condition, are built by Transport.put.)
    """
    pairs = []
    for name, value in params.items():
        if value is None or value is False:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        pairs.append(f"{name}={_quote(text, _FORM_QUOTING)}")
    return "&".join(pairs)


def connect(endpoints: Union[str, Sequence[str]], *, ca_cert: Optional[str] = None,
            cert: Optional[str] = None, key: Optional[str] = None,
            username: Optional[str] = None, password: Optional[str] = None,
            timeout: float = 5.0, deadline: Optional[float] = None,
            runtime: Runtime = SYSTEM,
            member_factory: Optional[Callable[[str], Member]] = None) -> Transport:
    """A client for ``endpoints`` ("http://a:2379,http://b:2379", https for TLS).

    ``timeout`` bounds each request; a call that cannot succeed within
    ``deadline`` seconds (default ``3 * timeout``), retrying on the other
    members, raises :class:`~etcdq_v2.errors.Unavailable`.  ``runtime``: the
    clocks, threads and randomness of the client and of the queues on it
    (:mod:`etcdq_v2.runtime`; default the real ones).  ``member_factory``:
    ``f(url)`` returns what carries the requests to that endpoint, with
    :class:`etcdq_v2.wire.Member`'s methods and errors (default: a
    wire.Member); the simulator passes its network's
    (:mod:`etcdq_v2.testing.sim.net`).
    """
    for path in (ca_cert, cert, key):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"TLS file not found: {path}")
    if (username is None) != (password is None):
        raise ConfigError("give both a username and a password, or neither")
    _check_cleartext(parse_endpoints(endpoints), tls=any((ca_cert, cert, key)),
                     auth=username is not None)
    return Transport(endpoints, timeout=timeout, deadline=deadline, ca_cert=ca_cert, cert=cert,
                     key=key, username=username, password=password, runtime=runtime,
                     member_factory=member_factory)
