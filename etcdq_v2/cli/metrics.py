"""``etcdq metrics``: a Prometheus exporter of queue counts (the ``metrics`` extra).

It serves :func:`etcdq_v2.metrics.export_queues` until SIGTERM or SIGINT;
``etcdq work --metrics-port`` (:mod:`.work`) serves a worker's own metrics.
Both leave out prometheus_client's ``_created`` series (a gauge per counter
saying when it was created): the process is ours, so that global switch is
ours to turn, and the series are noise in Prometheus.
"""
from __future__ import annotations

import argparse
import logging
import time
from typing import Any, List

from ..keys import check_name
from ..metrics import DEFAULT_MIN_INTERVAL, export_queues, prometheus
from ..signals import StopSignals
from .exits import EXIT_OK, PROG, UsageError
from .options import open_queues, verb

log = logging.getLogger("etcdq_v2.cli")

#: Seconds between two looks at the stop signals while serving.
_POLL = 0.2


def add_verbs(verbs: Any) -> None:
    parser = verb(
        verbs, "metrics", cmd_metrics, "serve queue counts to Prometheus",
        intermixed="queues", log_level=logging.INFO,
        usage=f"{PROG} metrics --port N [--bind ADDR] [--min-interval S] QUEUE...",
        epilog="Serves etcdq_queue_items{queue,state} (pending, running, completed, "
               "failed) and the exporter's etcd requests at http://ADDR:N/metrics, and "
               "prints that URL. Each queue is read at most once per --min-interval "
               "however often it is scraped: one GET of the queue's directory, which "
               "carries every value in the queue (etcd v2 has no count), so raise it for "
               "big queues. Runs until SIGTERM/SIGINT. Needs the metrics extra: "
               "pip install 'etcdq_v2[metrics]'.")
    parser.add_argument("queues", nargs="+", metavar="QUEUE", help="queue names")
    parser.add_argument("--port", type=int, required=True, metavar="N",
                        help="TCP port to serve on (0: any free port)")
    parser.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                        help="address to listen on (default 127.0.0.1; 0.0.0.0: every "
                             "interface)")
    parser.add_argument("--min-interval", type=float, default=DEFAULT_MIN_INTERVAL,
                        metavar="S", help="read each queue at most every S seconds "
                                          f"(default {DEFAULT_MIN_INTERVAL:g})")


def cmd_metrics(args: argparse.Namespace) -> int:
    """Serve the counts of ``args.queues`` until a stop signal; 0 after a clean stop."""
    names = _distinct(args.queues)
    quiet_created_series()
    stop = StopSignals()
    with stop.installed(), open_queues(args, names) as queues:
        for queue in queues:
            queue.stats(quorum=False)  # fail now (exit 3/4), not on every scrape
        server = export_queues(queues, args.port, args.bind, min_interval=args.min_interval)
        try:
            print(server.url, flush=True)
            log.info("serving the counts of %s at %s", ", ".join(names), server.url)
            while not stop.requested():
                time.sleep(_POLL)
        finally:
            server.close()
    log.info("stopped")
    return EXIT_OK


def quiet_created_series() -> None:
    """Leave out the ``_created`` series (in this process); ConfigError without the extra."""
    prometheus().disable_created_metrics()  # (untyped in prometheus_client: through the module)


def _distinct(names: List[str]) -> List[str]:
    checked = [check_name(name) for name in names]
    if len(set(checked)) != len(checked):
        raise UsageError(f"a queue is named twice in {' '.join(names)}")
    return checked
