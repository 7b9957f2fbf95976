"""Talking HTTP to a member without python-etcd; free ports; bounded polling.

The harness does not depend on the client code it is there to test, so it
asks etcd with urllib.  All waiting is bounded polling with a deadline;
nothing sleeps "long enough" and hopes.
"""
from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from typing import Any, Callable, List, Optional, Tuple, TypeVar

#: Members listen on loopback only: test and demo servers, never exposed on a network.
LOOPBACK = "127.0.0.1"
POLL_INTERVAL = 0.05
_PROBE_TIMEOUT = 1.0

_T = TypeVar("_T")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    The kernel picks it; another process may take it before etcd binds it.
    :meth:`EtcdServer.wait_ready` then fails with etcd's bind error in the
    message, and does not mistake the other process for our member.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> List[int]:
    """``count`` distinct ports on 127.0.0.1 that were free a moment ago (see
    :func:`free_port`): all held open until all are picked, so the kernel
    cannot hand one out twice, as a cluster's members need."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _http_get(url: str, timeout: float) -> Tuple[int, bytes]:
    """GET ``url``; return (status, body) for any HTTP answer, raise OSError otherwise.

    Proxies from the environment are ignored (the members are on loopback),
    and https certificates are not verified: this only checks liveness and
    reads public stats, it never sends or trusts data.
    """
    handlers: List[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https:"):
        handlers.append(urllib.request.HTTPSHandler(context=_unverified_context()))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as reply:
            return int(reply.status), reply.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _unverified_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def get_json(url: str) -> Any:
    """The decoded JSON of a 200 answer to ``GET url``; None for anything else."""
    try:
        status, body = _http_get(url, _PROBE_TIMEOUT)
        return json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        return None


def answers_v2(url: str) -> bool:
    """True if ``url`` serves the v2 keys API (a 200 on ``/v2/keys/``)."""
    return get_json(url.rstrip("/") + "/v2/keys/") is not None


def poll(deadline: float, attempt: Callable[[], Optional[_T]]) -> Optional[_T]:
    """Call ``attempt`` every poll interval until it returns non-None or the deadline passes."""
    while True:
        result = attempt()
        if result is not None or time.monotonic() >= deadline:
            return result
        time.sleep(POLL_INTERVAL)
