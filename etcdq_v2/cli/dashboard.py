"""``etcdq dashboard``: the web dashboard of the queues under the prefix, until a stop signal.

The page, its API and who may use them are :mod:`etcdq_v2.dashboard`'s.
This verb connects with the global options, checks that etcd answers (so a
wrong endpoint or credentials exits 3 or 4 now, not as a page of errors),
prints the URL on stdout (one line, flushed, for a script to read) and,
when it generated one, the token on the next line, then serves until
SIGTERM or SIGINT (:class:`~etcdq_v2.signals.StopSignals`, as ``etcdq
server`` does) and exits 0.  The dashboard is imported in the handler: the
other verbs do not load an HTTP server.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from ..protocol import queue_names
from ..signals import StopSignals
from .exits import EXIT_FAILURE, EXIT_OK, PROG
from .options import connect_from, secret_option, verb

if TYPE_CHECKING:
    from ..dashboard import Dashboard

#: The issue's defaults (also etcdq_v2.dashboard's; repeated so that parsing needs no import).
DEFAULT_PORT = 8080
DEFAULT_BIND = "127.0.0.1"
TOKEN_ENV = "ETCDQ_DASHBOARD_TOKEN"
TOKEN_FILE_ENV = "ETCDQ_DASHBOARD_TOKEN_FILE"
#: How often the main thread looks at the stop signals and the serving thread.
POLL = 0.1


def add_verbs(verbs: Any) -> None:
    parser = verb(verbs, "dashboard", cmd_dashboard,
                  "serve a web page of the queues under the prefix",
                  log_level=logging.INFO,
                  epilog="The page lists every queue under --prefix with its counts, the "
                         "throughput of the last ten minutes, the running items and the dead "
                         "letters, updated every 2 s (on a big queue: four times as long as a read of "
                         "etcd takes). It prints its URL on stdout (and the "
                         "token on the next line when it generated one). A bind other than "
                         "loopback requires a token: give one, or one is generated. "
                         "SIGTERM or Ctrl-C stops it.")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="N",
                        help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--bind", default=DEFAULT_BIND, metavar="ADDRESS",
                        help=f"address to listen on (default {DEFAULT_BIND}); any other than "
                             "loopback requires a token")
    parser.add_argument("--allow-actions", action="store_true",
                        help="requeue and purge buttons (POSTs guarded against cross-site "
                             "requests); the etcd user then needs write access")
    # An empty variable (a unit file's blank) is no token, not a too-short one.
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV) or None, metavar="T",
                        help=f"required by the API as a bearer token, on any bind (env "
                             f"{TOKEN_ENV}; prefer it or --token-file: arguments show in "
                             "ps); off loopback one is generated when none is given")
    parser.add_argument("--token-file", default=os.environ.get(TOKEN_FILE_ENV) or None,
                        metavar="FILE", help=f"file whose first line is the token (env "
                                             f"{TOKEN_FILE_ENV})")


def cmd_dashboard(args: argparse.Namespace) -> int:
    """``etcdq dashboard``: serve until SIGTERM/SIGINT, then exit 0."""
    from ..dashboard import Dashboard
    token = secret_option(args.token, args.token_file, "token")
    transport = connect_from(args)
    try:
        with Dashboard(transport, prefix=args.prefix, bind=args.bind, port=args.port,
                       allow_actions=args.allow_actions, token=token) as board:
            queue_names(transport, board.prefix)  # exit 3 or 4 now, not a page of errors
            return _serve(board, args.bind)
    finally:
        transport.close()


def _serve(board: "Dashboard", bind: str) -> int:
    stop = StopSignals()
    # Installed before the URL is printed: from then on a signal stops it cleanly.
    with stop.installed():
        board.start()
        _announce(board, bind)
        while board.is_serving() and not stop.requested():
            time.sleep(POLL)
        if stop.requested():
            print(f"{PROG} dashboard: stopped", file=sys.stderr, flush=True)
            return EXIT_OK
    print(f"{PROG} dashboard: the server thread ended (see the log above)", file=sys.stderr)
    return EXIT_FAILURE


def _announce(board: "Dashboard", bind: str) -> None:
    """The URL (and a generated token) on stdout; what is served, on stderr."""
    print(board.url, flush=True)
    if board.token_generated:
        print(f"token: {board.token}", flush=True)
    actions = "with requeue and purge" if board.allow_actions else \
        "read-only (--allow-actions adds requeue and purge)"
    asks = "; the page asks for the token" if board.token else ""
    print(f"{PROG} dashboard: the queues under {board.prefix}, {actions}, on {bind}{asks}; "
          "SIGTERM or Ctrl-C stops it", file=sys.stderr, flush=True)
