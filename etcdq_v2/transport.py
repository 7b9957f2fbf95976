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
  the next member, whatever its method;
* a request that may have been applied (read timeout, reset, etcd's
  500 "request timed out") is retried only if it is not a POST, and the
  reply is marked ``retried`` so that the protocol reads an "already exists"
  or "compare failed" as possibly its own earlier attempt;
* a POST whose outcome is unknown raises :class:`AmbiguousWrite`; the
  protocol resolves it by looking for the item's token (never a blind resend);
* members are rotated under a lock, so many threads may share one Transport.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from urllib3.exceptions import (HTTPError, NewConnectionError, ConnectTimeoutError,
                                ReadTimeoutError, SSLError)

from .errors import (AlreadyExists, AmbiguousWrite, AuthError, CompareFailed, ConfigError,
                     EtcdFailure, HistoryCleared, KeyMissing, NotADir, NotAFile, Unavailable)

_ERRORS = {cls.code: cls for cls in (KeyMissing, CompareFailed, AlreadyExists, NotAFile,
                                     NotADir, HistoryCleared)}
_RAFT_INTERNAL = 300
_NO_PERMISSION = 110

Node = Dict[str, Any]


class Reply:
    """One answer of etcd: the action, the node, the previous node, the index."""

    __slots__ = ("action", "node", "prev_node", "index", "retried")

    def __init__(self, doc: Dict[str, Any], index: int, retried: bool) -> None:
        self.action: str = doc.get("action", "")
        self.node: Node = doc.get("node") or {}
        self.prev_node: Optional[Node] = doc.get("prevNode")
        self.index = index
        self.retried = retried


class _Transient(Exception):
    """A failure worth another try; ``sent`` tells if the request may have applied."""

    def __init__(self, message: str, sent: bool, timed_out: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.timed_out = timed_out


def parse_endpoints(endpoints: Union[str, Sequence[str]]) -> List[str]:
    """``"http://a:2379,https://b:2379"`` -> a list of base URLs; ConfigError if bad."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    urls = [item.strip().rstrip("/") for item in items if item.strip()]
    if not urls:
        raise ConfigError("no etcd endpoint given")
    for url in urls:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None \
                or parts.path or parts.query:
            raise ConfigError(f"bad etcd endpoint {url!r}: expected http(s)://HOST:PORT")
    return urls


class Transport:
    """A thread-safe client for the etcd v2 keys API over one urllib3 pool.

    ``timeout`` bounds each request; ``deadline`` (default ``3 * timeout``)
    bounds a whole call including its retries on other members.
    """

    def __init__(self, endpoints: Union[str, Sequence[str]], *, timeout: float = 5.0,
                 deadline: Optional[float] = None, ca_cert: Optional[str] = None,
                 cert: Optional[str] = None, key: Optional[str] = None,
                 username: Optional[str] = None, password: Optional[str] = None,
                 pool_size: int = 32) -> None:
        self.endpoints = parse_endpoints(endpoints)
        if timeout <= 0:
            raise ConfigError("timeout must be positive")
        self.timeout = float(timeout)
        self.deadline = float(deadline) if deadline else 3 * self.timeout
        self._current = 0
        self._lock = threading.Lock()
        self.last_index = 0
        self.requests: Counter = Counter()
        self._headers = urllib3.make_headers(basic_auth=f"{username}:{password}") \
            if username is not None else {}
        self._http = urllib3.PoolManager(
            num_pools=len(self.endpoints) + 4, maxsize=pool_size, retries=False,
            **_tls_options(ca_cert, cert, key))

    @classmethod
    def from_client(cls, client: Any) -> "Transport":
        """Take endpoints, credentials, TLS files and timeout from an ``etcd.Client``."""
        pool_kw = getattr(client.http, "connection_pool_kw", {})
        endpoints = [client.base_uri] + [m for m in client._machines_cache if m != client.base_uri]
        timeout = client.read_timeout if client.read_timeout and client.read_timeout > 0 else 5.0
        return cls(endpoints, timeout=min(timeout, 5.0), ca_cert=pool_kw.get("ca_certs"),
                   cert=pool_kw.get("cert_file"), key=pool_kw.get("key_file"),
                   username=client.username, password=client.password)

    # -- the keys API ------------------------------------------------------
    def get(self, key: str, *, recursive: bool = False, sorted: bool = False,
            quorum: bool = False) -> Reply:
        query = {"recursive": recursive, "sorted": sorted, "quorum": quorum}
        return self._call("GET", key, query=query)

    def put(self, key: str, value: Optional[str] = None, *, ttl: Optional[int] = None,
            prev_exist: Optional[bool] = None, prev_value: Optional[str] = None,
            prev_index: Optional[int] = None, refresh: bool = False) -> Reply:
        form = {"value": value, "ttl": ttl, "prevExist": prev_exist, "prevValue": prev_value,
                "prevIndex": prev_index, "refresh": refresh}
        return self._call("PUT", key, form=form)

    def post(self, key: str, value: str) -> Reply:
        """Create an in-order key under ``key``; never resent once it may have applied."""
        return self._call("POST", key, form={"value": value})

    def delete(self, key: str, *, prev_value: Optional[str] = None,
               prev_index: Optional[int] = None, dir: bool = False,
               recursive: bool = False) -> Reply:
        query = {"prevValue": prev_value, "prevIndex": prev_index, "dir": dir,
                 "recursive": recursive}
        return self._call("DELETE", key, query=query)

    def wait(self, key: str, index: int, *, recursive: bool = True,
             timeout: float = 1.0) -> Optional[Reply]:
        """The first event at or after ``index`` under ``key``, or None after ``timeout``."""
        query = {"wait": True, "waitIndex": index, "recursive": recursive}
        try:
            return self._send("GET", self._url(self._endpoint(), key, query), None, timeout, False)
        except _Transient as exc:
            if exc.timed_out:
                return None
            raise Unavailable(str(exc)) from None

    def stream(self, key: str, *, idle_timeout: Optional[float] = None) -> "EventStream":
        """A live recursive watch of ``key``: every event after it was registered.

        etcd registers a streaming watcher only when it has no past event to
        answer with, so this never asks for a waitIndex; the caller lists the
        directory *after* this returns and skips events the listing includes.
        """
        endpoint = self._endpoint()
        url = self._url(endpoint, key, {"wait": True, "recursive": True, "stream": True})
        try:
            response = self._http.request(
                "GET", url, headers=self._headers, preload_content=False, redirect=False,
                timeout=urllib3.Timeout(connect=self.timeout, read=idle_timeout))
        except SSLError as exc:
            raise _tls_failure(endpoint, exc) from None
        except (HTTPError, OSError) as exc:
            self._failed(endpoint)
            raise Unavailable(f"cannot watch {key} at {endpoint}: {exc}") from None
        if response.status != 200:
            body = response.read()
            response.release_conn()
            raise self._error(endpoint, response.status, body)
        return EventStream(response, int(response.headers.get("X-Etcd-Index", 0)))

    def close(self) -> None:
        self._http.clear()

    # -- requests and retries ---------------------------------------------
    def _call(self, method: str, key: str, *, query: Optional[Dict[str, Any]] = None,
              form: Optional[Dict[str, Any]] = None) -> Reply:
        give_up = time.monotonic() + self.deadline
        retried, attempt, last = False, 0, ""
        while True:
            endpoint = self._endpoint()
            remaining = give_up - time.monotonic()
            try:
                return self._send(method, self._url(endpoint, key, query), form,
                                  min(self.timeout, max(remaining, 0.05)), retried)
            except _Transient as exc:
                last = f"{endpoint}: {exc}"
                self._failed(endpoint)
                if exc.sent and method == "POST":
                    raise AmbiguousWrite(f"POST {key} may or may not have applied ({last})",
                                         index_before=self.last_index) from None
                retried = retried or exc.sent
            attempt += 1
            pause = min(0.05 * 2 ** attempt, 1.0) if attempt >= len(self.endpoints) else 0.0
            if time.monotonic() + pause >= give_up:
                raise Unavailable(f"etcd did not answer {method} {key} within "
                                  f"{self.deadline:g}s (last error: {last})")
            time.sleep(pause)

    def _send(self, method: str, url: str, form: Optional[Dict[str, Any]], timeout: float,
              retried: bool) -> Reply:
        body, headers = None, self._headers
        if form is not None:
            body = _encode(form)
            headers = {**self._headers, "Content-Type": "application/x-www-form-urlencoded"}
        endpoint = url[:url.index("/v2/")]
        with self._lock:
            self.requests[method] += 1
        try:
            response = self._http.request(method, url, body=body, headers=headers,
                                          timeout=urllib3.Timeout(connect=timeout, read=timeout),
                                          redirect=False)
        except SSLError as exc:
            raise _tls_failure(endpoint, exc) from None
        except (NewConnectionError, ConnectTimeoutError) as exc:
            raise _Transient(_reason(exc), sent=False) from None
        except ReadTimeoutError:
            raise _Transient("timed out waiting for the reply", sent=True, timed_out=True) from None
        except (HTTPError, OSError) as exc:
            raise _Transient(_reason(exc), sent=True) from None
        index = int(response.headers.get("X-Etcd-Index", 0) or 0)
        if response.status in (200, 201):
            self._saw(index)
            return Reply(json.loads(response.data), index, retried)
        error = self._error(endpoint, response.status, response.data)
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
        if status == 401 and code != HistoryCleared.code or code == _NO_PERMISSION:
            return AuthError(f"etcd at {endpoint} refused access: {message or status}")
        if code in _ERRORS:
            return _ERRORS[code](message, code=code, index=doc.get("index"),
                                 cause=str(doc.get("cause", "")))
        if code == _RAFT_INTERNAL or status >= 500:
            return _Transient(f"HTTP {status} {message}", sent=True)
        if status == 404 and not doc:
            return ConfigError(f"{endpoint} does not serve the etcd v2 API "
                               "(start etcd 3.4/3.5 with --enable-v2)")
        return EtcdFailure(f"etcd at {endpoint}: HTTP {status} {message}", code=code,
                           index=doc.get("index"))

    def _url(self, endpoint: str, key: str, query: Optional[Dict[str, Any]]) -> str:
        url = f"{endpoint}/v2/keys{quote(key)}"
        params = _encode(query or {})
        return f"{url}?{params}" if params else url

    def _endpoint(self) -> str:
        with self._lock:
            return self.endpoints[self._current]

    def _failed(self, endpoint: str) -> None:
        """Move on from ``endpoint`` unless another thread already did."""
        with self._lock:
            if self.endpoints[self._current] == endpoint:
                self._current = (self._current + 1) % len(self.endpoints)

    def _saw(self, index: int) -> None:
        if index > self.last_index:
            self.last_index = index


class EventStream:
    """The events of one streaming watch, as dicts, until etcd or :meth:`close` ends it."""

    def __init__(self, response: Any, start_index: int) -> None:
        self._response = response
        self.start_index = start_index
        self._closed = False

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        buffer = b""
        try:
            for chunk in self._response.stream(1 << 16, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        except ReadTimeoutError:
            return  # idle for idle_timeout: the caller subscribes again
        except (HTTPError, OSError, ValueError) as exc:
            if not self._closed:
                raise Unavailable(f"watch stream broke: {_reason(exc)}") from None
        finally:
            self._response.release_conn()

    def close(self) -> None:
        """Unblock a reader waiting on this stream (from another thread)."""
        self._closed = True
        shutdown = getattr(self._response, "shutdown", None)
        if shutdown is not None:
            shutdown()
            return
        connection = getattr(self._response, "_connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(2)
            except OSError:
                pass


def _encode(params: Dict[str, Any]) -> str:
    """Form/query encoding with etcd's spelling of booleans.

    None is left out, and so is False except for prevExist, where false is
    the condition "must not exist yet".
    """
    pairs = []
    for name, value in params.items():
        if value is None or (value is False and name != "prevExist"):
            continue
        pairs.append((name, str(value).lower() if isinstance(value, bool) else str(value)))
    return urlencode(pairs)


def _tls_options(ca_cert: Optional[str], cert: Optional[str],
                 key: Optional[str]) -> Dict[str, Any]:
    options: Dict[str, Any] = {}
    if ca_cert:
        options.update(ca_certs=ca_cert, cert_reqs="CERT_REQUIRED")
    if cert:
        options["cert_file"] = cert
        if key:
            options["key_file"] = key
    elif key:
        raise ConfigError("a client key was given without its certificate")
    return options


def _tls_failure(endpoint: str, exc: Exception) -> ConfigError:
    return ConfigError(f"TLS with {endpoint} failed: {_reason(exc)} "
                       "(check the CA certificate and the client certificate/key)")


def _reason(exc: BaseException) -> str:
    """The innermost useful message of a urllib3 error chain."""
    reason = getattr(exc, "reason", None)
    return str(reason or exc).split(": ", 1)[-1] if reason is None else str(reason)


def connect(endpoints: Union[str, Sequence[str]], *, ca_cert: Optional[str] = None,
            cert: Optional[str] = None, key: Optional[str] = None,
            username: Optional[str] = None, password: Optional[str] = None,
            timeout: float = 5.0, deadline: Optional[float] = None) -> Transport:
    """A client for ``endpoints`` ("http://a:2379,http://b:2379", https for TLS).

    ``timeout`` bounds each request; a call that cannot succeed within
    ``deadline`` seconds (default ``3 * timeout``), retrying on the other
    members, raises :class:`~etcdq_v2.errors.Unavailable`.
    """
    for path in (ca_cert, cert, key):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"TLS file not found: {path}")
    if (username is None) != (password is None):
        raise ConfigError("give both a username and a password, or neither")
    return Transport(endpoints, timeout=timeout, deadline=deadline, ca_cert=ca_cert, cert=cert,
                     key=key, username=username, password=password)
