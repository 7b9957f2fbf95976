"""Prometheus metrics: a queue exporter and a worker's own metrics (the ``metrics`` extra).

prometheus_client is imported only when metrics are asked for, so the package
runs without it; asking without it raises ConfigError naming the extra.

The exporter (``etcdq metrics``, :func:`export_queues`) serves, per queue::

    etcdq_queue_items{queue, state="pending|running|completed|failed"}   gauge
    etcdq_queue_read_errors_total{queue}        reads of the queue that failed
    etcdq_queue_read_duration_seconds{queue}    how long the last read took

What a scrape costs: for each queue whose last read is older than
``min_interval`` (default 5 s), ONE GET of ``{prefix}/{queue}?recursive=true``,
served by the member from its own copy (no quorum: no round of consensus,
counts at most a moment behind); every other scrape within the interval
costs nothing, and a scrape that comes while a read is under way waits for
that read instead of starting another.  That one GET downloads every key
and value of the queue, payloads included: the counts need work/ (is each
item finished? its value says), locks/ (running, or a delay?) and the names
of completed/ and failed/ (a requeued dead letter's tombstone is no record,
its value says), and etcd v2 has neither a keys-only listing nor a count.
So a read costs about the queue's size in bytes (records included, until
their TTL expires them): with large queues raise ``min_interval``, and keep
Prometheus' ``scrape_timeout`` above the transport's deadline.  (A watch,
as consumers keep, would download each value once; the exporter keeps no
state between reads instead, and needs no stream per queue.)

A worker (``Worker(..., metrics_port=N)``) serves, from a registry of its
own so that several workers in one process do not clash::

    etcdq_worker_items_total{queue, outcome="completed|failed|lost|released"}
    etcdq_worker_item_duration_seconds{queue}     histogram: claim to settlement
    etcdq_worker_claims_in_flight{queue}          gauge: claimed, not yet settled

Both serve the requests their transports made (Transport.add_observer)::

    etcdq_etcd_requests_total{method}             GET PUT POST DELETE watch
    etcdq_etcd_request_errors_total{method, error}
    etcdq_etcd_request_duration_seconds{method}   histogram

``error`` is what the request raised: KeyMissing, CompareFailed and
AlreadyExists are etcd's answers in races the protocol expects (a lock
another claim took); Timeout, NotSent, Lost and ServerError are failures a
retry may mend; AuthError and ConfigError are not.
"""
from __future__ import annotations

import logging
import math
import socket
import threading
import time
from types import ModuleType
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional,
                    Sequence, Tuple)
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .errors import ConfigError, EtcdqError
from .httpd import (DEFAULT_MAX_CONNECTIONS, DEFAULT_TIMEOUT, LimitedServer, check_limits,
                    deadline_input)
from .queue import Queue
from .transport import Transport

if TYPE_CHECKING:  # pragma: no cover - only for the annotations
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector as _Collector
else:
    _Collector = object

__all__ = ["DEFAULT_MIN_INTERVAL", "MetricsServer", "QueueCollector", "RequestMetrics",
           "WorkerMetrics", "check_port", "export_queues", "prometheus"]

log = logging.getLogger("etcdq_v2.metrics")

#: Seconds between two reads of one queue by the exporter, however often it is scraped.
DEFAULT_MIN_INTERVAL = 5.0

_ITEM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_OUTCOMES = ("completed", "failed", "lost", "released")


def prometheus() -> ModuleType:
    """The prometheus_client module; ConfigError naming the extra when it is missing.

    Every use below calls it first, then imports the names it needs.
    """
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError("Prometheus metrics need the prometheus_client package: "
                          "pip install 'etcdq_v2[metrics]'") from None
    return prometheus_client


# -- serving ---------------------------------------------------------------------

class _Server(LimitedServer, WSGIServer):
    """A thread per scrape, each with a deadline, so many at most (etcdq_v2.httpd)."""


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def setup(self) -> None:
        super().setup()
        deadline_input(self)  # one request per connection: its deadline starts now

    def handle(self) -> None:
        try:
            super().handle()
        except TimeoutError:
            self.close_connection = True  # too slow: closed (by the server) unanswered

    def log_message(self, format: str, *args: Any) -> None:
        """Not a line per scrape on stderr."""


class MetricsServer:
    """An HTTP server of one registry's exposition (any path), in daemon threads.

    ``port`` 0 takes a free port (read it back from ``.port``).  The default
    ``addr`` is the loopback: metrics reveal queue names, so serving them
    further is a choice ("0.0.0.0", "::").  ConfigError if it cannot bind.
    ``connection_timeout`` and ``max_connections``: what a client may hold of
    it (:mod:`etcdq_v2.httpd`).
    """

    def __init__(self, registry: "CollectorRegistry", port: int, addr: str = "127.0.0.1", *,
                 on_close: Optional[Callable[[], None]] = None,
                 connection_timeout: float = DEFAULT_TIMEOUT,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        prometheus()
        from prometheus_client import make_wsgi_app
        app = make_wsgi_app(registry)
        check_port(port)
        check_limits(connection_timeout, max_connections)
        self._on_close = on_close
        server_class = _Server6 if ":" in addr else _Server
        try:
            self._httpd = make_server(addr, port, app, server_class, _QuietHandler)
        except (OSError, OverflowError) as exc:
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
        self._httpd.limit(connection_timeout, max_connections)
        self.addr = addr
        self.port: int = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name=f"etcdq-metrics-{self.port}")
        self._thread.start()

    @property
    def url(self) -> str:
        """Where to scrape it (the loopback when it listens on every address)."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.addr, self.addr)
        return f"http://[{host}]:{self.port}/metrics" if ":" in host \
            else f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()
        if self._on_close is not None:
            self._on_close()


def check_port(port: object) -> int:
    """A TCP port number 0-65535 (0: any free one), else ConfigError."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"metrics port must be a whole number from 0 to 65535, not {port!r}")
    return port


# -- etcd requests ---------------------------------------------------------------

class RequestMetrics:
    """etcd requests by method, their errors and durations, for one registry.

    An observer for :meth:`Transport.add_observer`: :meth:`watch` adds it to
    transports, :meth:`unwatch` takes it off again.
    """

    def __init__(self, registry: "CollectorRegistry") -> None:
        prometheus()
        from prometheus_client import Counter, Histogram
        self.requests = Counter(
            "etcdq_etcd_requests", "Requests sent to etcd members, retries included",
            ["method"], registry=registry)
        self.errors = Counter(
            "etcdq_etcd_request_errors", "etcd requests that failed, by what they raised",
            ["method", "error"], registry=registry)
        self.duration = Histogram(
            "etcdq_etcd_request_duration_seconds", "Time of an etcd request",
            ["method"], registry=registry, buckets=_REQUEST_BUCKETS)
        self._transports: List[Transport] = []

    def __call__(self, method: str, seconds: float, error: Optional[str]) -> None:
        self.requests.labels(method).inc()
        self.duration.labels(method).observe(seconds)
        if error is not None:
            self.errors.labels(method, error).inc()

    def watch(self, transports: Iterable[Transport]) -> None:
        """Count the requests of ``transports`` (each once, however often given)."""
        for transport in transports:
            if all(transport is not known for known in self._transports):
                transport.add_observer(self)
                self._transports.append(transport)

    def unwatch(self) -> None:
        """Stop counting the requests of the transports given to :meth:`watch`."""
        for transport in self._transports:
            transport.remove_observer(self)
        self._transports.clear()


# -- a worker --------------------------------------------------------------------

class WorkerMetrics:
    """One worker's metrics, in a CollectorRegistry of its own (``.registry``).

    The worker calls :meth:`claimed` when it takes an item, :meth:`settled`
    once per item with its outcome, and :meth:`ended` when it forgets it.
    """

    def __init__(self, queue_names: Sequence[str]) -> None:
        prometheus()
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.registry = CollectorRegistry()
        self.items = Counter(
            "etcdq_worker_items", "Items this worker settled, by outcome",
            ["queue", "outcome"], registry=self.registry)
        self.duration = Histogram(
            "etcdq_worker_item_duration_seconds",
            "Seconds from an item's claim to its settlement, whatever the outcome",
            ["queue"], registry=self.registry, buckets=_ITEM_BUCKETS)
        self.in_flight = Gauge(
            "etcdq_worker_claims_in_flight", "Items claimed and not yet settled",
            ["queue"], registry=self.registry)
        self.etcd = RequestMetrics(self.registry)
        for name in queue_names:  # every series from the start, at 0
            self.in_flight.labels(name)
            self.duration.labels(name)
            for outcome in _OUTCOMES:
                self.items.labels(name, outcome)

    def claimed(self, queue: str) -> None:
        self.in_flight.labels(queue).inc()

    def settled(self, queue: str, outcome: str, seconds: float) -> None:
        self.items.labels(queue, outcome).inc()
        self.duration.labels(queue).observe(seconds)

    def ended(self, queue: str) -> None:
        self.in_flight.labels(queue).dec()

    def serve(self, port: int, addr: str = "127.0.0.1") -> MetricsServer:
        return MetricsServer(self.registry, port, addr)


# -- the queue exporter ------------------------------------------------------------

class _QueueCounts:
    """One queue's counts, read from etcd at most once per ``min_interval``.

    The lock is held during the read: a scrape that comes meanwhile waits for
    it and takes its result, rather than reading again (a read that ended
    after the scrape came is fresh enough for it, whatever the interval).
    """

    def __init__(self, queue: Queue, min_interval: float) -> None:
        self.queue = queue
        self.min_interval = min_interval
        self.counts: Optional[Dict[str, int]] = None
        self.errors = 0
        self.duration = 0.0
        self._read_at: Optional[float] = None
        self._lock = threading.Lock()

    def current(self) -> Optional[Dict[str, int]]:
        """The counts (None: the last read failed), read again if they are too old."""
        asked = time.monotonic()
        with self._lock:
            if self._read_at is None or self._read_at < asked - self.min_interval:
                self._read()
            return self.counts

    def _read(self) -> None:
        started = time.monotonic()
        try:
            self.counts = self.queue.stats(quorum=False)
        except Exception as exc:  # any failure is this queue's alone
            # No counts rather than old ones: a stale gauge looks healthy.  Not
            # only EtcdqError: an unexpected error must neither fail the whole
            # scrape (every queue's gauges) nor be read again at each scrape.
            self.counts = None
            self.errors += 1
            if isinstance(exc, EtcdqError):
                log.warning("cannot read queue %s for metrics: %s", self.queue.name, exc)
            else:
                log.exception("cannot read queue %s for metrics", self.queue.name)
        self._read_at = time.monotonic()  # a failure waits its interval too
        self.duration = self._read_at - started


class QueueCollector(_Collector):
    """A Prometheus collector of ``etcdq_queue_items`` for ``queues`` (see the module
    docstring for what each scrape costs)."""

    def __init__(self, queues: Sequence[Queue], min_interval: float = DEFAULT_MIN_INTERVAL
                 ) -> None:
        if isinstance(min_interval, bool) or not isinstance(min_interval, (int, float)) \
                or not math.isfinite(min_interval) or min_interval < 0:
            raise ConfigError(f"min_interval must be a finite number of seconds >= 0, "
                              f"not {min_interval!r}")
        names = [queue.name for queue in queues]
        if len(set(names)) != len(names) or not names:
            raise ConfigError(f"expected distinct queues, not {names}")
        self._queues = [_QueueCounts(queue, float(min_interval)) for queue in queues]

    def describe(self) -> List["Metric"]:
        """The families, without reading etcd (a registry asks on registration)."""
        return list(self._families())

    def collect(self) -> Iterator["Metric"]:
        items, errors, duration = self._families()
        for counts in self._queues:
            current = counts.current()
            for state, number in (current or {}).items():
                items.add_metric([counts.queue.name, state], number)
            errors.add_metric([counts.queue.name], counts.errors)
            duration.add_metric([counts.queue.name], counts.duration)
        return iter((items, errors, duration))

    @staticmethod
    def _families() -> Tuple["GaugeMetricFamily", "CounterMetricFamily", "GaugeMetricFamily"]:
        prometheus()
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        return (GaugeMetricFamily("etcdq_queue_items", "Items of the queue, by state",
                                  labels=["queue", "state"]),
                CounterMetricFamily("etcdq_queue_read_errors",
                                    "Reads of the queue for these metrics that failed",
                                    labels=["queue"]),
                GaugeMetricFamily("etcdq_queue_read_duration_seconds",
                                  "How long the last read of the queue took", labels=["queue"]))


def export_queues(queues: Sequence[Queue], port: int, addr: str = "127.0.0.1", *,
                  min_interval: float = DEFAULT_MIN_INTERVAL,
                  connection_timeout: float = DEFAULT_TIMEOUT,
                  max_connections: int = DEFAULT_MAX_CONNECTIONS) -> MetricsServer:
    """Serve ``etcdq_queue_items`` of ``queues``, and the requests they make, on ``port``.

    The server's registry is its own (``prometheus_client.REGISTRY``, with
    the process metrics, is left alone).  Stop it with ``.close()``.
    """
    prometheus()
    from prometheus_client import CollectorRegistry
    registry = CollectorRegistry()
    registry.register(QueueCollector(queues, min_interval))
    requests = RequestMetrics(registry)
    requests.watch(queue.etcd for queue in queues)
    try:
        return MetricsServer(registry, port, addr, on_close=requests.unwatch,
                             connection_timeout=connection_timeout,
                             max_connections=max_connections)
    except ConfigError:
        requests.unwatch()
        raise
