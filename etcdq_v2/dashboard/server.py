"""The dashboard's HTTP server: the page, its JSON API and its two actions.

Routes::

    GET  /                  the page (static/index.html, the CSRF token written in)
    GET  /static/app.js     its script; /static/app.css its style
    GET  /api/overview      every queue: counts, running items, dead letters, throughput
    GET  /api/item?queue=Q&id=ID  one item as Queue.get finds it (a requeued dead
                            letter followed to its new item: "requeued_from")
    POST /api/requeue       {"queue": Q, "id": ID}: the dead letter back to work/
    POST /api/purge         {"queue": Q, "kind": "failed"|"completed"}: remove those records

The server is the standard library's threading HTTP server: a thread per
connection suits a page polled every few seconds by a handful of operators,
the JSON is answered from a shared snapshot (see snapshots.py), and the
package keeps its one dependency.  Each request has ``connection_timeout``
seconds to arrive, and at most ``max_connections`` are served at once
(:mod:`etcdq_v2.httpd`).  guard.py says who may read and act.
A request refused before its body was read (any refusal of a POST before
the checks pass, one with Transfer-Encoding: 411) ends its connection, so
that the unread body is never parsed as a request of its own.
"""
from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Dict, List, Optional, Tuple, Type
from urllib.parse import parse_qs, urlsplit

from ..errors import (ConfigError, EtcdqError, InvalidArgument, InvalidName,
                      NotFound, Unavailable)
from ..httpd import (DEFAULT_MAX_CONNECTIONS, DEFAULT_TIMEOUT, LimitedServer, check_limits,
                     deadline_input)
from ..keys import check_prefix
from ..queue import Queue
from ..transport import Transport, connect
from .guard import Guard, Refused, check_token, is_local, new_token
from .snapshots import Snapshots, item_document

log = logging.getLogger("etcdq_v2.dashboard")

DEFAULT_BIND = "127.0.0.1"
DEFAULT_PORT = 8080
#: The largest action body read (an action is a few dozen bytes of JSON).
MAX_BODY = 64 * 1024
STATIC = Path(__file__).with_name("static")
#: The page loads nothing from elsewhere, and may not be framed (clickjacking).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_ASSETS = {"/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
           "/static/app.css": ("app.css", "text/css; charset=utf-8")}
_JSON = "application/json"

Response = Tuple[int, str, bytes]


class Dashboard:
    """A web dashboard of the queues under ``prefix``, served on ``bind``:``port``.

    ``client``: endpoint URLs or a :class:`Transport`.  ``allow_actions``: the
    page gets requeue and purge buttons (POSTs guarded against cross-site
    requests).  ``token``: required by every API request as a bearer token;
    on a bind other than loopback one is generated when none is given
    (:attr:`token`).  ``interval``: seconds a snapshot of etcd is reused for
    (and the page's polling period); ``window`` and ``bucket``: the seconds
    of throughput shown, and per bar.  ``port`` 0 picks a free port.
    ``connection_timeout``: seconds a request may take to arrive (and a
    kept-alive connection may sit idle); ``max_connections``: connections
    served at once, more are refused (:mod:`etcdq_v2.httpd`).
    """

    def __init__(self, client: Any, *, prefix: str = "/etcdq", bind: str = DEFAULT_BIND,
                 port: int = DEFAULT_PORT, allow_actions: bool = False,
                 token: Optional[str] = None, interval: float = 2.0, window: float = 600.0,
                 bucket: float = 10.0, connection_timeout: float = DEFAULT_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        _check_times(interval, window, bucket)
        check_limits(connection_timeout, max_connections)
        self.prefix = check_prefix(prefix)
        self.allow_actions = allow_actions
        local = is_local(bind)
        #: True when the token was generated here (to be shown to the operator).
        self.token_generated = token is None and not local
        self.token = check_token(token) if token is not None else (
            None if local else new_token())
        self.guard = Guard(local=local, token=self.token, bind=bind)
        self.etcd, self._owns_transport = _transport(client)
        self.snapshots = Snapshots(self.etcd, self.prefix, interval=interval, window=window,
                                   bucket=bucket, actions=allow_actions)
        self._page = _read("index.html").replace(b"{{csrf}}", self.guard.csrf.encode())
        self._httpd = _listen(bind, port, self)
        self._httpd.limit(connection_timeout, max_connections)
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        """The page's URL (on a wildcard bind: through the loopback address)."""
        host, port = self._httpd.server_address[:2]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(str(host), str(host))
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/"

    def start(self) -> "Dashboard":
        """Serve in a background thread; returns self."""
        # Polled for shutdown 10 times a second (not 2): close() returns promptly.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.1,),
                                        name="etcdq-dashboard", daemon=True)
        self._thread.start()
        return self

    def is_serving(self) -> bool:
        """True while the thread :meth:`start` began serves (not before, nor after close)."""
        return self._thread is not None and self._thread.is_alive()

    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`close` (from another thread) or an interrupt."""
        self._httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()
        self.snapshots.close()
        if self._owns_transport:
            self.etcd.close()

    def __enter__(self) -> "Dashboard":
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    # -- the routes (called by the handler) -------------------------------------
    def get(self, path: str, headers: Any, query: str = "") -> Response:
        if path in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", self._page
        if path in _ASSETS:
            name, kind = _ASSETS[path]
            return 200, kind, _read(name)
        if path == "/api/overview":
            self.guard.check_token(headers)
            status, body = self.snapshots.current()
            return status, _JSON, body
        if path == "/api/item":
            self.guard.check_token(headers)
            return 200, _JSON, self._item(parse_qs(query))
        raise Refused(404, f"no page {path}")

    def post(self, path: str, headers: Any, body: bytes) -> Response:
        self.guard.check_token(headers)
        if path not in ("/api/requeue", "/api/purge"):
            raise Refused(404, f"no action {path}")
        if not self.allow_actions:
            raise Refused(403, "actions are disabled: start the dashboard with "
                               "--allow-actions (allow_actions=True)")
        self.guard.check_action(headers)
        request = _json_object(body)
        act = self._requeue if path == "/api/requeue" else self._purge
        answer = act(self.snapshots.queue(_field(request, "queue")), request)
        log.info("dashboard: %s %s", path.rsplit("/", 1)[-1], answer)
        self.snapshots.invalidate()
        return 200, _JSON, json.dumps(answer).encode("utf-8")

    def _item(self, query: Dict[str, List[str]]) -> bytes:
        """One item, read now (not from the snapshot): InvalidName, NotFound as 400, 404."""
        name, item_id = (query.get(field, [""])[0] for field in ("queue", "id"))
        if not name or not item_id:
            raise InvalidArgument("give the item as ?queue=Q&id=ID")
        info = self.snapshots.queue(name).get(item_id)
        return json.dumps(item_document(info)).encode("utf-8")

    def _requeue(self, queue: Queue, request: Dict[str, Any]) -> Dict[str, Any]:
        item_id = _field(request, "id")
        return {"queue": queue.name, "id": item_id, "new_id": queue.requeue(item_id)}

    def _purge(self, queue: Queue, request: Dict[str, Any]) -> Dict[str, Any]:
        kind = _field(request, "kind")
        if kind not in ("failed", "completed"):
            raise InvalidArgument(f"kind must be failed or completed, not {kind!r}")
        removed = queue.purge(completed=kind == "completed", failed=kind == "failed")
        return {"queue": queue.name, "kind": kind, "removed": removed}


class _Handler(BaseHTTPRequestHandler):
    """One connection: routes to the Dashboard, maps its errors to statuses."""

    server: "_Server"
    server_version = "etcdq-dashboard"
    sys_version = ""
    protocol_version = "HTTP/1.1"  # keep-alive: a polling page reuses its connection

    def setup(self) -> None:
        super().setup()
        self._input = deadline_input(self)

    def handle_one_request(self) -> None:
        self._input.restart()  # the next request (or the first) has its own deadline
        super().handle_one_request()

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self._answer(lambda path: self.server.dashboard.get(
            path, self.headers, urlsplit(self.path).query))

    def do_POST(self) -> None:  # noqa: N802
        self._answer(lambda path: self.server.dashboard.post(path, self.headers, self._body()))

    def _answer(self, route: Any) -> None:
        extra: Dict[str, str] = {}
        self._body_read = False
        try:
            _check_framing(self.headers)
            self.server.dashboard.guard.check_host(self.headers)
            status, kind, body = route(urlsplit(self.path).path)
        except Refused as exc:
            status, kind, body = exc.status, _JSON, _error(str(exc))
            if exc.status == 401:
                extra["WWW-Authenticate"] = 'Bearer realm="etcdq dashboard"'
        except EtcdqError as exc:
            status, kind, body = _status_of(exc), _JSON, _error(str(exc))
        except Exception as exc:  # a bug: logged with its traceback, the server goes on
            log.exception("dashboard: %s %s failed", self.command, self.path)
            status, kind, body = 500, _JSON, _error(f"internal error: {type(exc).__name__}")
        if self._unread_body():
            # Whatever is left of the request's body would be read as the next request
            # (smuggled past the checks above): end the connection instead.
            extra["Connection"] = "close"
            self.close_connection = True
        self._send(status, kind, body, extra)

    def _unread_body(self) -> bool:
        """The request may carry a body this handler did not read (any but a plain GET)."""
        if self._body_read:
            return False
        return self.command != "GET" or any(
            name in self.headers for name in ("Content-Length", "Transfer-Encoding"))

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise Refused(411, "an action needs a Content-Length")
        if int(length) > MAX_BODY:
            raise Refused(413, f"an action's body is at most {MAX_BODY} bytes")
        body = self.rfile.read(int(length))
        self._body_read = True
        return body

    def _send(self, status: int, kind: str, body: bytes, extra: Dict[str, str]) -> None:
        try:
            self.send_response(status)
            for name, value in {**SECURITY_HEADERS, **extra, "Content-Type": kind,
                                "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the page went away: nothing to answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - its signature
        # A page polls every few seconds: one log line each would bury the rest.
        log.debug("dashboard: %s " + format, self.address_string(), *args)


class _Server(LimitedServer, HTTPServer):
    def __init__(self, address: Tuple[str, int], dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        super().__init__(address, _Handler)


class _Server6(_Server):
    address_family = socket.AF_INET6


def _listen(bind: str, port: int, dashboard: Dashboard) -> _Server:
    """The listening server, or ConfigError for an address that cannot be bound."""
    kind = _Server6 if ":" in bind else _Server
    try:
        return kind((bind, port), dashboard)
    except (OSError, OverflowError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"the dashboard cannot listen on {bind} port {port}: "
                          f"{reason}") from None


def _check_times(interval: float, window: float, bucket: float) -> None:
    for name, value in (("interval", interval), ("window", window), ("bucket", bucket)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 < value < float("inf"):
            raise ConfigError(f"{name} must be a number of seconds > 0, not {value!r}")
    if bucket > window:
        raise ConfigError(f"bucket ({bucket:g} s) must not be longer than window "
                          f"({window:g} s)")


def _check_framing(headers: Any) -> None:
    """A body comes with a Content-Length only: a chunked one (Transfer-Encoding) is
    never read, and its content must not be taken for the next request."""
    if "Transfer-Encoding" in headers:
        raise Refused(411, "a request's body needs a Content-Length (no Transfer-Encoding)")


def _transport(client: Any) -> Tuple[Transport, bool]:
    """``(transport, whether the dashboard owns it)`` from URLs or a Transport."""
    if isinstance(client, Transport):
        return client, False
    if isinstance(client, str):
        return connect(client), True
    raise ConfigError(f"expected endpoint URLs or a Transport, not {client!r}")


def _read(name: str) -> bytes:
    return (STATIC / name).read_bytes()


def _json_object(body: bytes) -> Dict[str, Any]:
    try:
        request = json.loads(body.decode("utf-8"))
    except ValueError:
        raise InvalidArgument("an action's body must be a JSON object") from None
    if not isinstance(request, dict):
        raise InvalidArgument("an action's body must be a JSON object")
    return request


def _field(request: Dict[str, Any], name: str) -> str:
    value = request.get(name)
    if not isinstance(value, str):
        raise InvalidArgument(f"the action needs {name!r} (a string)")
    return value


def _status_of(error: EtcdqError) -> int:
    """The HTTP status of a library error: the caller's fault (4xx) or etcd's (5xx)."""
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, (InvalidName, InvalidArgument)):
        return 400
    if isinstance(error, Unavailable):
        return 503
    return 502  # etcd refused: the dashboard's credentials (AuthError), or a request


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode("utf-8")
