"""Who may read the dashboard, and which requests may act on the queues.

Every request, in this order:

1. **Host.** On a loopback bind without a token, the ``Host`` header must
   name a loopback address (``127.0.0.1``, ``localhost``, ``[::1]``, or the
   bind address itself, e.g. ``127.0.0.2``): a page
   of another site whose name was re-pointed at 127.0.0.1 (DNS rebinding) is
   same-origin with the dashboard as far as the browser knows, and is
   refused here.  With a token that page is refused anyway (it has no
   token), so any Host is served: a reverse proxy may pass its own name.
2. **Token.** With a token (required on any other bind: the page is then
   reachable by others), ``/api/`` requests must carry
   ``Authorization: Bearer <token>``; without it, or with another: 401.  The
   page, its script and its style are served to anyone (they hold no data):
   the page asks for the token and keeps it in the tab's sessionStorage.
   The token is never in a cookie, so a browser never sends it by itself.

An action (POST) must also pass, before anything is written:

3. **Origin.** An ``Origin`` header, if sent, must be this page's own
   origin (``http`` or ``https``, for a TLS proxy, with the request's
   ``Host``); ``Sec-Fetch-Site``, if sent, must say ``same-origin`` (or ``none``).
   Browsers send both on every POST, other sites' pages included.
4. **JSON body.** ``Content-Type: application/json``: the types an HTML
   form can send across sites (form-encoded, multipart, text/plain) are
   refused, and a cross-site script cannot send JSON without a CORS
   preflight, which this server never grants.
5. **CSRF token.** ``X-CSRF-Token`` must equal the random token the server
   made at its start and wrote into the page.  Another site can neither read
   the page (same-origin policy) nor set that header across sites.

Each check alone stops a cross-site request in a current browser; together
they leave no gap for an older one.
"""
from __future__ import annotations

import hmac
import secrets
from email.message import Message
from typing import Optional
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..transport import is_loopback

#: The shortest token accepted: long enough that it cannot be guessed online.
MIN_TOKEN = 16
#: The names a browser may use for a dashboard bound to a loopback address.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: Media types an HTML form can send to another site without a preflight.
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")


class Refused(Exception):
    """A request the guard turns away: the HTTP status and why. Internal."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def is_local(bind: str) -> bool:
    """True for a loopback address (or ``localhost``): only this host can connect."""
    return is_loopback(bind)


def check_token(token: object) -> str:
    """``token`` if it is usable in a header and hard to guess, else ConfigError."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN \
            or not all("!" <= char <= "~" for char in token):
        raise ConfigError(f"the dashboard token must be at least {MIN_TOKEN} visible ASCII "
                          "characters (no spaces)")
    return token


def new_token() -> str:
    """A random token (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


class Guard:
    """The checks above, for one server: its bind, its token and its CSRF token."""

    def __init__(self, *, local: bool, token: Optional[str], bind: str = "") -> None:
        self.local = local
        self.token = token
        #: The Host names accepted by check 1: an IP literal (the bind) cannot be rebound.
        self.names = LOOPBACK_NAMES + ((bind.lower(),) if bind else ())
        self.csrf = secrets.token_urlsafe(32)

    def check_host(self, headers: Message) -> None:
        """1: on a loopback bind without a token, refuse a Host that is not a loopback name."""
        host = headers.get("Host", "")
        if self.local and self.token is None and _hostname(host) not in self.names:
            raise Refused(403, f"Host {host!r} is not this dashboard: open it as "
                               "http://127.0.0.1:<port>/ or http://localhost:<port>/")

    def check_token(self, headers: Message) -> None:
        """2: the bearer token, when the server has one."""
        if self.token is None:
            return
        scheme, _, given = headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not _same(given.strip(), self.token):
            raise Refused(401, "this dashboard needs its token "
                               "(Authorization: Bearer <token>)")

    def check_action(self, headers: Message) -> None:
        """3-5: an action comes from this dashboard's own page (or a client with the token)."""
        origin = headers.get("Origin")
        if origin is not None and not _same_origin(origin, headers.get("Host", "")):
            raise Refused(403, f"cross-site request refused (Origin {origin!r})")
        site = headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            raise Refused(403, f"cross-site request refused (Sec-Fetch-Site {site!r})")
        kind = headers.get_content_type() if headers.get("Content-Type") else ""
        if kind != "application/json":
            form = " (a form's type)" if kind in _FORM_TYPES else ""
            raise Refused(415, f"an action's body must be application/json, not "
                               f"{kind or 'untyped'}{form}")
        if not _same(headers.get("X-CSRF-Token", ""), self.csrf):
            raise Refused(403, "missing or wrong X-CSRF-Token: reload the dashboard's page")


def _hostname(host: str) -> str:
    """The name in a Host header, without its port or IPv6 brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.partition(":")[0]


def _same_origin(origin: str, host: str) -> bool:
    """``origin`` is this server's, as the browser reached it: http(s)://<Host>."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host \
        and not parts.path


def _same(given: str, expected: str) -> bool:
    """Compared in constant time, so the time taken tells nothing of the token."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))
