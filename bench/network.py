"""Across a network, and resources (issue 14): Worker processes a round trip away from etcd.

Each measurement runs once here; bench/run.py repeats them (``--only
network`` runs this section alone) and this module's tables print them.

* **drain**: a queue filled with N items is drained by P processes, each an
  :class:`etcdq_v2.Worker` with a no-op handler and concurrency C, either
  straight to etcd on loopback or through a delaying proxy
  (bench/delayproxy.py) that adds 0, 1 or 5 ms of round-trip time.
  *items/s* = items completed / (start line -> the last ``complete()``
  returned).  The time a ``complete()`` returned is taken from the Worker's
  own log line for it ("completed in ..."), caught by a logging handler in
  each process.  etcd's CPU comes from ``/proc/<pid>/stat``, the proxy's from
  ``/proc/<pid>/schedstat``, the workers' own from ``getrusage``.
* **latency**: the same Workers wait on an empty queue; 8 producer threads,
  through the same route, put items at a steady rate (half the rate of the
  slowest drain of the first round: the same for every row, below every
  configuration's capacity).  Latency = ``complete()`` returned (the log
  line) - ``put()`` called.
* **sockets**: one Worker process takes N items (10,000 by default); its
  TCP sockets to etcd are counted from ``/proc/net/tcp``: its own ends
  (remote port = etcd's) in any state, and etcd's ends in TIME-WAIT (which
  etcd's side holds for connections it closed first).  Only entries that
  were not there when the process started count.
* **depth**: one Worker process (concurrency 8) starts on a queue of 100,000
  pending items: the time from its start to its first handler call, and its
  peak RSS (``VmHWM``) after a few hundred items.
"""
from __future__ import annotations

import http.client
import logging
import multiprocessing.synchronize
import os
import resource
import statistics
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple
from urllib.parse import urlsplit

from etcdq_v2 import Queue, Worker

from .delayproxy import DelayProxy, ProxyBuild
from .designs import ETCDQ, Target
from .measure import RUN_TIMEOUT, fill
from .peers import LOCK_TTL
from .procs import StartLine, Workers, run_workers
from .servers import EtcdOps, etcd_counters, etcd_server

#: Route names: straight to etcd, or through the delaying proxy.
DIRECT, PROXY = "direct", "proxy"

# -- /proc readings ----------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def status_mb(name: str) -> float:
    """A memory field of this process's ``/proc/self/status`` (VmHWM, VmRSS), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {name} in /proc/self/status")


#: TCP states in /proc/net/tcp (include/net/tcp_states.h).
ESTABLISHED, TIME_WAIT, LISTEN = "01", "06", "0A"


def tcp_sockets(port: int) -> Dict[Tuple[str, str], Tuple[str, bool]]:
    """Sockets with ``port`` at one end: (local, remote) -> (state, ours), listeners left out.

    ``ours`` is True for a client's end (its remote port is ``port``), False
    for the server's (its local port is).
    """
    found: Dict[Tuple[str, str], Tuple[str, bool]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    local, remote, state = line.split()[1:4]
                    ports = int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)
                    if state != LISTEN and port in ports:
                        found[(local, remote)] = (state, ports[1] == port)
        except FileNotFoundError:
            continue
    return found


# -- the worker processes ----------------------------------------------------------------------


class _Completions(logging.Handler):
    """Catches the Worker's log line for each item it settles: when complete() returned.

    Worker logs ``"item %s (attempt %d) %s"`` once per item, right after
    recording its outcome; "completed in ..." for a completion.  Anything it
    logs at WARNING or above (a lost lock, a failure) is counted as a problem.
    """

    def __init__(self, done: Optional[Any] = None) -> None:
        super().__init__(logging.INFO)
        self.completed: List[Tuple[str, float]] = []
        self.problems = 0
        self._done = done  # a shared counter, for a parent waiting on the total

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) == 3 and str(args[2]).startswith("completed"):
            self.completed.append((str(args[0]), record.created))
            if self._done is not None:
                with self._done.get_lock():
                    self._done.value += 1
        elif record.levelno >= logging.WARNING:
            self.problems += 1


@contextmanager
def _caught(done: Optional[Any] = None) -> Iterator[_Completions]:
    logger = logging.getLogger("etcdq_v2.worker")
    handler = _Completions(done)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # nothing of it on the bench's stderr
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@dataclass
class WorkerReport:
    """What one Worker process did."""

    started: float                       # time.time() at the start line
    completed: List[Tuple[str, float]]   # (item id, time.time() complete() returned)
    handled: List[Any]                   # payloads the handler saw
    cpu_s: float                         # this process's CPU from the start line on
    requests: Dict[str, int]
    problems: int                        # warnings the Worker logged
    first_call: Optional[float] = None   # time.time() of the first handler call
    sockets: Dict[str, int] = field(default_factory=dict)
    peak_sockets: int = 0
    vm_hwm_mb: float = 0.0
    vm_rss_mb: float = 0.0


def _worker(url: str, name: str, concurrency: int, handled: List[Any],
            first_call: List[float], burst: bool = False) -> Tuple[Queue, Worker]:
    """A Queue and a Worker whose handler notes the payload; with ``burst`` it then
    waits until every slot's handler got there, so all the slots finish together."""
    queue = Queue(url, name, lock_ttl=LOCK_TTL)
    together = threading.Barrier(concurrency, timeout=RUN_TIMEOUT)

    def handler(payload: Any) -> None:
        if not first_call:
            first_call.append(time.time())
        handled.append(payload)
        if burst:
            together.wait()

    worker = Worker(queue, handler, concurrency=concurrency, install_signal_handlers=False)
    return queue, worker


def _report(started: float, cpu: float, caught: _Completions, handled: List[Any],
            queue: Queue, first_call: List[float]) -> WorkerReport:
    return WorkerReport(started, caught.completed, handled, own_cpu_seconds() - cpu,
                        dict(queue.etcd.requests), caught.problems,
                        first_call[0] if first_call else None)


def _draining_worker(start: StartLine, url: str, name: str, concurrency: int,
                     max_items: Optional[int] = None, *, until_empty: bool = True,
                     memory: bool = False) -> WorkerReport:
    """Run one Worker until the queue is empty (or ``max_items``); ``memory``:
    read its RSS too, before the queue (and its view of the backlog) is closed."""
    handled: List[Any] = []
    first_call: List[float] = []
    with _caught() as caught:
        queue, worker = _worker(url, name, concurrency, handled, first_call)
        try:
            started, cpu = start(), own_cpu_seconds()
            worker.run(until_empty=until_empty, max_items=max_items)
            report = _report(started, cpu, caught, handled, queue, first_call)
            if memory:
                report.vm_hwm_mb, report.vm_rss_mb = status_mb("VmHWM"), status_mb("VmRSS")
            return report
        finally:
            queue.close()


def _serving_worker(start: StartLine, url: str, name: str, concurrency: int,
                    stop: multiprocessing.synchronize.Event, done: Any) -> WorkerReport:
    """A Worker on an empty queue until ``stop`` is set; ``done`` counts completions."""
    handled: List[Any] = []
    first_call: List[float] = []
    with _caught(done) as caught:
        queue, worker = _worker(url, name, concurrency, handled, first_call)
        try:
            queue.claim(timeout=0)  # builds the view: the queue is empty, so no item is taken
            started, cpu = start(), own_cpu_seconds()
            threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
            worker.run()
            return _report(started, cpu, caught, handled, queue, first_call)
        finally:
            queue.close()


# -- drain ---------------------------------------------------------------------------------------


@dataclass
class Route:
    """How the workers reach etcd: straight, or through a delaying proxy of ``rtt_ms``."""

    name: str
    rtt_ms: float
    url: str
    proxy: Optional[DelayProxy] = None
    measured_ms: float = 0.0   # the round-trip time added, as measured (see round_trip_ms)

    @property
    def label(self) -> str:
        return "loopback" if self.proxy is None else f"proxy, +{self.rtt_ms:g} ms RTT"


@contextmanager
def route(etcd_url: str, rtt_ms: Optional[float], build: ProxyBuild) -> Iterator[Route]:
    """Straight to etcd (``rtt_ms`` None), or through a fresh proxy adding ``rtt_ms``."""
    if rtt_ms is None:
        yield Route(DIRECT, 0.0, etcd_url)
        return
    with build.proxy(etcd_url, rtt_ms) as proxy:
        added = round_trip_ms(proxy.url) - round_trip_ms(etcd_url)
        yield Route(PROXY, rtt_ms, proxy.url, proxy, added)


def round_trip_ms(url: str, requests: int = 30) -> float:
    """The median time of a ``GET /version`` on one kept-alive connection, in ms."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                            timeout=10)
    times = []
    try:
        for _ in range(requests):
            began = time.perf_counter()
            connection.request("GET", "/version")
            connection.getresponse().read()
            times.append((time.perf_counter() - began) * 1000)
    finally:
        connection.close()
    return statistics.median(times)


@dataclass
class ProxyUse:
    """What the proxy did during one run."""

    chunks: int
    cpu_s: float


@contextmanager
def proxy_use(way: Route) -> Iterator[List[ProxyUse]]:
    """Counts the proxy's chunks and CPU over the block (nothing when direct)."""
    found: List[ProxyUse] = []
    if way.proxy is None:
        yield found
        return
    chunks, cpu = way.proxy.counters().chunks, way.proxy.cpu_seconds()
    yield found
    found.append(ProxyUse(way.proxy.counters().chunks - chunks, way.proxy.cpu_seconds() - cpu))


@dataclass
class DrainRun:
    """P Worker processes of concurrency C drain N items over a route."""

    route: str
    rtt_ms: float
    processes: int
    concurrency: int
    items: int
    seconds: float
    items_per_s: float
    missing: int
    run_twice: int
    problems: int
    etcd_cpu_s: float
    clients_cpu_s: float
    requests: Dict[str, int]
    proxy: Optional[ProxyUse]
    round: int = 0   # which round of the section: runs of one round ran next to each other

    @property
    def key(self) -> Tuple[str, float, int, int]:
        return self.route, self.rtt_ms, self.processes, self.concurrency


def drain(etcd_pid: int, fill_url: str, way: Route, name: str, items: int,
          processes: int, concurrency: int) -> DrainRun:
    """Fill ``name`` with ``items`` items (straight to etcd), then drain it over ``way``."""
    fill(Target(ETCDQ, fill_url, name), 0, items)
    args = [(way.url, name, concurrency)] * processes
    with Workers(_draining_worker, args) as workers, proxy_use(way) as used:
        etcd_cpu = process_cpu_seconds(etcd_pid)
        workers.go()
        reports = workers.results(RUN_TIMEOUT)
        etcd_cpu = process_cpu_seconds(etcd_pid) - etcd_cpu
    handled = [payload for report in reports for payload in report.handled]
    done = {item for report in reports for item, _ in report.completed}
    ended = max((at for report in reports for _, at in report.completed), default=0.0)
    seconds = max(ended - min(report.started for report in reports), 1e-9)
    requests: Dict[str, int] = {}
    for report in reports:
        for method, count in report.requests.items():
            requests[method] = requests.get(method, 0) + count
    return DrainRun(way.name, way.rtt_ms, processes, concurrency, items, seconds,
                    len(done) / seconds, items - len(set(handled)),
                    len(handled) - len(set(handled)), sum(r.problems for r in reports),
                    etcd_cpu, sum(r.cpu_s for r in reports), requests,
                    used[0] if used else None)


# -- latency: put to completed, at a steady rate -----------------------------------------------


@dataclass
class LatencyRun:
    """Items put at ``rate``/s while P Workers of concurrency C wait for them."""

    route: str
    rtt_ms: float
    processes: int
    concurrency: int
    rate: float
    items: int
    latencies_ms: List[float]     # complete() returned - put() called, per item
    missing: int                  # put, never completed in the run's time
    failed_writes: int = 0        # counted by etcd: lost lock races, mostly

    @property
    def key(self) -> Tuple[str, float, int, int]:
        return self.route, self.rtt_ms, self.processes, self.concurrency


def _produce(queue: Queue, rate: float, items: int, began: float, first: int, step: int,
             put_at: Dict[str, float]) -> None:
    """Put items ``first``, ``first + step``, ... each at its slot ``began + n / rate``."""
    for n in range(first, items, step):
        pause = began + n / rate - time.time()
        if pause > 0:
            time.sleep(pause)
        called = time.time()
        put_at[queue.put({"n": n, "slot": began + n / rate})] = called


def _steady_puts(url: str, name: str, rate: float, items: int, producers: int = 8
                 ) -> Dict[str, float]:
    """``items`` puts at ``rate``/s from ``producers`` threads: item id -> put() called."""
    put_at: Dict[str, float] = {}
    with Queue(url, name, lock_ttl=LOCK_TTL) as queue:
        began = time.time() + 0.05
        threads = [threading.Thread(target=_produce, args=(queue, rate, items, began, k,
                                                           producers, put_at))
                   for k in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return put_at


def latency(etcd_url: str, way: Route, name: str, rate: float, items: int, processes: int,
            concurrency: int) -> LatencyRun:
    """Workers wait on an empty queue; ``items`` are put over ``way`` at ``rate``/s.

    Idle Workers all go for each new item (a claim takes the head of the
    queue); the failed writes etcd counts (lost lock creates) say how many.
    """
    stop = multiprocessing.get_context("spawn").Event()
    done = multiprocessing.get_context("spawn").Value("i", 0)
    args = [(way.url, name, concurrency, stop, done)] * processes
    with Workers(_serving_worker, args) as workers:
        workers.go()
        before = etcd_counters(etcd_url)
        put_at = _steady_puts(way.url, name, rate, items)
        give_up = time.monotonic() + 30.0
        while done.value < items and time.monotonic() < give_up:
            time.sleep(0.05)
        ops = EtcdOps.between(before, etcd_counters(etcd_url))
        stop.set()
        reports = workers.results(RUN_TIMEOUT)
    completed = {item: at for report in reports for item, at in report.completed}
    latencies = [(completed[item] - called) * 1000 for item, called in put_at.items()
                 if item in completed]
    return LatencyRun(way.name, way.rtt_ms, processes, concurrency, rate, items, latencies,
                      items - len(latencies), ops.failed_writes)


# -- resources: sockets after N items, memory at depth ------------------------------------------


@dataclass
class SocketRun:
    """One Worker process's TCP sockets to etcd after it took ``items`` items."""

    concurrency: int
    burst: bool          # every slot's handler returned at the same moment
    items: int
    established: int     # its connections open at the end
    time_wait: int       # TIME-WAIT entries of its connections (either end)
    other: int           # its connections in other states (closing)
    peak: int            # the most of all these seen at once during the run
    seconds: float

    @property
    def total(self) -> int:
        return self.established + self.time_wait + self.other


def _worker_sockets(port: int, before: Set[Tuple[str, str]]) -> Dict[str, int]:
    """The worker's sockets now, by state: its own ends, and etcd's ends in TIME-WAIT."""
    counts = {"established": 0, "time_wait": 0, "other": 0}
    for (local, remote), (state, ours) in tcp_sockets(port).items():
        if (local, remote) in before or not (ours or state == TIME_WAIT):
            continue
        kind = {ESTABLISHED: "established", TIME_WAIT: "time_wait"}.get(state, "other")
        counts[kind] += 1
    return counts


class _SocketSampler:
    """Samples the worker's socket count every ``interval`` seconds, from a thread."""

    def __init__(self, port: int, before: Set[Tuple[str, str]], interval: float = 0.25) -> None:
        self.port, self.before, self.interval = port, before, interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        self.peak = max(self.peak, sum(_worker_sockets(self.port, self.before).values()))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _socket_worker(start: StartLine, url: str, name: str, concurrency: int,
                   port: int, burst: bool) -> WorkerReport:
    before = set(tcp_sockets(port))
    handled: List[Any] = []
    first_call: List[float] = []
    with _caught() as caught:
        queue, worker = _worker(url, name, concurrency, handled, first_call, burst)
        try:
            started, cpu = start(), own_cpu_seconds()
            sampler = _SocketSampler(port, before)
            worker.run(until_empty=True)
            sampler.stop()
            report = _report(started, cpu, caught, handled, queue, first_call)
            report.sockets = _worker_sockets(port, before)
            report.peak_sockets = sampler.peak
            return report
        finally:
            queue.close()


def sockets_after(etcd_url: str, name: str, items: int, concurrency: int,
                  burst: bool = False) -> SocketRun:
    """Fill ``items`` items, then let one Worker process take them all; count its sockets.

    ``burst``: every slot's handler waits for all the others, so the slots
    complete their items at the same moment (``items`` a multiple of
    ``concurrency``): the most connections the worker's requests can need.
    """
    fill(Target(ETCDQ, etcd_url, name), 0, items)
    port = int(etcd_url.rsplit(":", 1)[1])
    report = run_workers(_socket_worker, [(etcd_url, name, concurrency, port, burst)],
                         RUN_TIMEOUT)[0]
    ended = max((at for _, at in report.completed), default=report.started)
    counts = report.sockets
    return SocketRun(concurrency, burst, len(report.completed), counts["established"],
                     counts["time_wait"], counts["other"], report.peak_sockets,
                     ended - report.started)


@dataclass
class DepthRun:
    """A Worker process started on a queue of ``pending`` items."""

    pending: int
    concurrency: int
    first_claim_s: float   # start line -> the handler's first call
    items: int             # items it took before its RSS was read
    vm_hwm_mb: float       # peak RSS
    vm_rss_mb: float


def _depth_worker(start: StartLine, url: str, name: str, concurrency: int,
                  items: int) -> WorkerReport:
    return _draining_worker(start, url, name, concurrency, items, until_empty=False,
                            memory=True)


def depth(etcd_url: str, name: str, pending: int, concurrency: int, items: int) -> DepthRun:
    """Fill ``pending`` items, then start one Worker process on them; its memory and first claim."""
    fill(Target(ETCDQ, etcd_url, name), 0, pending)
    report = run_workers(_depth_worker, [(etcd_url, name, concurrency, items)],
                         RUN_TIMEOUT)[0]
    first = report.first_call if report.first_call is not None else float("nan")
    return DepthRun(pending, concurrency, first - report.started, len(report.completed),
                    report.vm_hwm_mb, report.vm_rss_mb)



# -- the section: what runs, in which order --------------------------------------------------


@dataclass(frozen=True)
class NetworkPlan:
    """How much of the section to run (bench/run.py: ``--quick`` and ``--repeats``)."""

    repeats: int
    items: int = 3000                     # per drain
    processes: int = 8
    concurrencies: Tuple[int, ...] = (1, 8, 32)
    rtts_ms: Tuple[float, ...] = (1.0, 5.0)
    #: Drains through the proxy at 0 ms, against loopback: what the proxy itself costs.
    zero_concurrencies: Tuple[int, ...] = (1, 8)
    latency_s: float = 2.5                # of steady puts, per latency run
    #: The latency runs' put rate: this share of the slowest drain of the first round.
    latency_share: float = 0.5
    socket_items: int = 10_000
    #: Rounds of "every slot finishes at once" for the burst rows (concurrency 8, 32).
    burst_rounds: int = 20
    depth_pending: int = 100_000
    depth_items: int = 200
    depth_concurrency: int = 8

    @classmethod
    def choose(cls, quick: bool, repeats: Optional[int]) -> "NetworkPlan":
        if quick:
            return cls(repeats=repeats or 1, items=1000, latency_s=1.5, socket_items=2000,
                       depth_pending=20_000)
        return cls(repeats=repeats or 3)

    def drain_configs(self) -> List[Tuple[Optional[float], int]]:
        """(added RTT in ms, None = straight to etcd; concurrency), in the order of a
        round: each concurrency's routes one after the other, so that a ratio to
        loopback compares runs made a few seconds apart (the machine is shared)."""
        return [(rtt, c) for c in self.concurrencies for rtt in self._routes(c)]

    def latency_configs(self) -> List[Tuple[Optional[float], int]]:
        return [(rtt, c) for c in self.concurrencies for rtt in [None, *self.rtts_ms]]

    def _routes(self, concurrency: int) -> List[Optional[float]]:
        zero = [0.0] if concurrency in self.zero_concurrencies else []
        return [None, *zero, *self.rtts_ms]


@dataclass
class NetworkResults:
    """Every run of the section, as measured, and the plan they followed."""

    plan: NetworkPlan = field(default_factory=lambda: NetworkPlan(repeats=0))
    proxy: str = ""                      # which proxy ran (C, or the Python fallback)
    proxy_note: str = ""                 # why not the C one
    latency_rate: float = 0.0            # items/s put in the latency runs
    added_rtt_ms: Dict[str, List[float]] = field(default_factory=dict)  # set -> measured
    drains: List[DrainRun] = field(default_factory=list)
    latencies: List[LatencyRun] = field(default_factory=list)
    sockets: List[SocketRun] = field(default_factory=list)
    depths: List[DepthRun] = field(default_factory=list)
    skipped: Dict[str, str] = field(default_factory=dict)   # part -> why it did not run


Progress = Any  # a callable taking one message (bench/run.py's progress)


@contextmanager
def _part(results: NetworkResults, name: str, progress: Progress) -> Iterator[None]:
    """One part of the section; a failure is noted (and printed) and the rest goes on."""
    try:
        yield
    except Exception as exc:
        traceback.print_exc()
        last_line = (str(exc).strip().splitlines() or [""])[-1]
        results.skipped[name] = f"failed: {type(exc).__name__}: {last_line}"
        progress(f"network: {name}: FAILED")


def run_section(plan: NetworkPlan, workdir: Path, progress: Progress) -> NetworkResults:
    """Every part of the section, each round on a fresh etcd; returns the raw runs."""
    build = ProxyBuild()
    results = NetworkResults(plan, proxy=build.kind, proxy_note=build.why_not_c)
    try:
        for repeat in range(plan.repeats):
            with etcd_server(workdir) as server:
                _drains(plan, server, build, results, repeat, progress)
                _latencies(plan, server.url, build, results, repeat, progress)
        with _part(results, "sockets", progress), etcd_server(workdir) as server:
            for concurrency in plan.concurrencies:
                progress(f"network: sockets, concurrency {concurrency}, "
                         f"{plan.socket_items:,} items")
                results.sockets.append(sockets_after(server.url, f"sockets-{concurrency}",
                                                     plan.socket_items, concurrency))
            for concurrency in plan.concurrencies[1:]:
                progress(f"network: sockets, concurrency {concurrency}, every slot at once")
                results.sockets.append(sockets_after(
                    server.url, f"burst-{concurrency}", concurrency * plan.burst_rounds,
                    concurrency, burst=True))
        with _part(results, "depth", progress), etcd_server(workdir) as server:
            progress(f"network: first claim at {plan.depth_pending:,} pending")
            results.depths.append(depth(server.url, "depth", plan.depth_pending,
                                        plan.depth_concurrency, plan.depth_items))
    finally:
        build.close()
    return results


def _drains(plan: NetworkPlan, server: Any, build: ProxyBuild, results: NetworkResults,
            repeat: int, progress: Progress) -> None:
    for n, (rtt, concurrency) in enumerate(plan.drain_configs()):
        with _part(results, f"drain {rtt} ms x {concurrency}", progress), \
                route(server.url, rtt, build) as way:
            progress(f"network: drain, {way.label}, {plan.processes} x {concurrency}, "
                     f"run {repeat + 1}")
            if way.proxy is not None:
                results.added_rtt_ms.setdefault(f"{rtt:g}", []).append(way.measured_ms)
            run = drain(server.pid, server.url, way, f"drain-{repeat}-{n}", plan.items,
                        plan.processes, concurrency)
            run.round = repeat
            results.drains.append(run)


def _latencies(plan: NetworkPlan, url: str, build: ProxyBuild, results: NetworkResults,
               repeat: int, progress: Progress) -> None:
    if not results.latency_rate:
        rates = [run.items_per_s for run in results.drains]
        if not rates:
            return
        results.latency_rate = round(plan.latency_share * min(rates))
    rate = results.latency_rate
    for n, (rtt, concurrency) in enumerate(plan.latency_configs()):
        with _part(results, f"latency {rtt} ms x {concurrency}", progress), \
                route(url, rtt, build) as way:
            progress(f"network: latency at {rate:g}/s, {way.label}, "
                     f"{plan.processes} x {concurrency}, run {repeat + 1}")
            results.latencies.append(latency(url, way, f"latency-{repeat}-{n}", rate,
                                             max(50, int(rate * plan.latency_s)),
                                             plan.processes, concurrency))
