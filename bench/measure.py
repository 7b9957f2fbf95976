"""The measurements.  Each runs once against a server it is given and returns plain figures.

Repetition, medians and tables are bench/run.py's and bench/report.py's job;
everything here is one run of one configuration.  Functions whose name starts
with ``_`` and take ``start`` first run inside a worker process (bench/procs.py).
"""
from __future__ import annotations

import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import urllib3

from etcdq_v2 import Queue

from .designs import DESIGNS, Target, open_design
from .peers import LOCK_TTL
from .procs import StartLine, Workers, run_workers
from .servers import EtcdOps, etcd_counters

#: A run that takes longer than this is broken, not slow: fail it.
RUN_TIMEOUT = 600.0


# -- 1. raw etcd write rate ----------------------------------------------------------------

_RAW_KEY = "/v2/keys/bench/raw"
_FORM = {"Content-Type": "application/x-www-form-urlencoded"}
WRK_SCRIPT = Path(__file__).with_name("wrk_put.lua")


def python_write_rate(url: str, seconds: float) -> float:
    """PUTs/s from one Python loop over one keep-alive urllib3 connection."""
    http = urllib3.PoolManager(maxsize=1, retries=False)
    writes = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        reply = http.request("PUT", url + _RAW_KEY, body="value=x", headers=_FORM)
        if reply.status >= 300:
            raise RuntimeError(f"raw PUT failed: {reply.status} {reply.data[:200]!r}")
        writes += 1
    return writes / (time.perf_counter() - began)


def _write_loop(start: StartLine, url: str, seconds: float) -> float:
    start()
    return python_write_rate(url, seconds)


def parallel_python_write_rate(url: str, seconds: float, processes: int) -> float:
    """Total PUTs/s of ``processes`` such loops at once, each in its own process.

    What Python clients as such can get out of etcd on this machine: the
    ceiling for any design that makes one HTTP request per write.
    """
    return sum(run_workers(_write_loop, [(url, seconds)] * processes, RUN_TIMEOUT))


def wrk_missing() -> Optional[str]:
    """Why the wrk row cannot run here, or None if it can."""
    return None if shutil.which("wrk") else "wrk is not installed (apt-get install wrk)"


def wrk_write_rate(url: str, seconds: float, connections: int, threads: int = 2) -> float:
    """PUTs/s from wrk (a C load generator) over ``connections`` keep-alive connections."""
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s",
               "-s", str(WRK_SCRIPT), url + _RAW_KEY]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60,
                          check=True)
    if "Non-2xx or 3xx responses" in done.stdout:
        raise RuntimeError(f"wrk saw failed requests:\n{done.stdout}")
    match = re.search(r"Requests/sec:\s*([\d.]+)", done.stdout)
    if match is None:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{done.stdout}")
    return float(match.group(1))


# -- filling a queue -------------------------------------------------------------------------

#: Fill with several producer processes from this many items up: a single
#: Python producer manages ~1,600 puts/s, so 100,000 items would take a minute.
PARALLEL_FILL_FROM = 5000
FILL_PRODUCERS = 3


def payloads(first: int, count: int) -> List[str]:
    """Unique payloads ``item-0000000``...: what consumers report back, to spot repeats."""
    return [f"item-{n:07d}" for n in range(first, first + count)]


def _produce(start: StartLine, target: Target, first: int, count: int) -> int:
    design = open_design(target)
    try:
        start()
        design.put_many(payloads(first, count))
        return count
    finally:
        design.close()


def fill(target: Target, first: int, count: int) -> None:
    """Put ``count`` items numbered from ``first`` into ``target``'s queue."""
    if count < PARALLEL_FILL_FROM:
        _produce(time.time, target, first, count)
        return
    share = -(-count // FILL_PRODUCERS)  # ceiling division
    chunks = [(target, lo, min(share, first + count - lo))
              for lo in range(first, first + count, share)]
    run_workers(_produce, chunks, RUN_TIMEOUT)


# -- 2. drain throughput, contention, etcd operations per item ----------------------------------

@dataclass
class ConsumerReport:
    """What one drain consumer did."""

    payloads: List[str]
    started: float
    requests: Dict[str, int]
    lock_failures: Optional[int]
    cpu_seconds: float = 0.0  # this process's CPU (user + system) from the start line on
    done_at: List[float] = field(default_factory=list)  # when each item was finished

    @property
    def last_done(self) -> float:
        """When its last item was finished (time.time()); its start if none was."""
        return self.done_at[-1] if self.done_at else self.started


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu_seconds(pid: int) -> float:
    """CPU (user + system) another process used so far, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _consume(start: StartLine, target: Target, interval: float = 0.0) -> ConsumerReport:
    """Claim and finish until nothing is free; ``interval``: seconds from one
    item's slot to the next (a paced drain, see drain), else none."""
    design = open_design(target)
    try:
        started = start()
        cpu = _cpu_seconds()
        done: List[str] = []
        done_at: List[float] = []
        while True:
            payload = design.claim()
            if payload is None:
                break
            design.finish()  # processing itself is a no-op: we measure the queue
            done.append(payload)
            done_at.append(time.time())
            if interval:  # the pace's slot, not a wait for anything
                time.sleep(max(0.0, started + len(done) * interval - time.time()))
        return ConsumerReport(done, started, dict(design.requests), design.lock_failures,
                              _cpu_seconds() - cpu, done_at)
    finally:
        design.close()


@dataclass
class DrainRun:
    """One drain of ``items`` items by ``consumers`` processes."""

    design: str
    consumers: int
    items: int
    seconds: float        # first consumer's start to last item finished
    items_per_s: float
    claims: int           # items handed out, repeats included
    run_twice: int        # items handed out more than once
    missing: int          # items never handed out
    lock_failures: Optional[int]
    requests: Dict[str, int]
    etcd_ops: Optional[EtcdOps]    # counted by etcd from before the fill to the end
    drain_ops: Optional[EtcdOps]   # counted by etcd while the consumers ran
    etcd_cpu_seconds: Optional[float] = None  # etcd's CPU while the consumers ran
    clients_cpu_seconds: float = 0.0          # the consumers' CPU, all together
    queues: int = 1       # the items split evenly over this many queues (see drain)
    #: items/s between the 10th and the 90th percentile of the items' finishing
    #: times: the drain without its start (every consumer's first listing) and its end
    steady_items_per_s: Optional[float] = None
    #: start line to a consumer's first item finished, the median consumer
    first_item_s: Optional[float] = None
    #: items/s the consumers were held to, all together (see drain); None: flat out
    paced: Optional[float] = None

    @property
    def etcd_cpu_ms_per_item(self) -> Optional[float]:
        if self.etcd_cpu_seconds is None:
            return None
        return 1000 * self.etcd_cpu_seconds / max(1, self.items - self.missing)

    @property
    def clients_cpu_ms_per_item(self) -> float:
        return 1000 * self.clients_cpu_seconds / max(1, self.items - self.missing)

    @property
    def lock_failures_per_claim(self) -> Optional[float]:
        return None if self.lock_failures is None else self.lock_failures / max(1, self.claims)

    @property
    def fsync_busy(self) -> Optional[float]:
        """The share of the drain etcd spent in WAL fsyncs: near 1, etcd's disk is the wall."""
        return None if self.drain_ops is None else self.drain_ops.fsync_seconds / self.seconds


def drain(target: Target, items: int, consumers: int,
          server_pid: Optional[int] = None, queues: int = 1,
          pace: Optional[float] = None) -> DrainRun:
    """Fill ``target``'s (new, empty) queue, then drain it with ``consumers`` processes;
    ``server_pid``: etcd's, to count its CPU during the drain.

    ``queues`` > 1 splits the items evenly over that many new queues instead
    (``target``'s name and ``-0``, ``-1``, ...), consumer i draining queue i mod
    ``queues`` only: with one queue per consumer, each consumer is alone on
    its own (bench/floor.py, "the queue's floor").

    ``pace``: the consumers together finish at most that many items a second
    (each sleeps until its next slot, ``consumers / pace`` seconds apart):
    a few consumers held to the rate that many reach (bench/floor.py, "paced")."""
    on_etcd = DESIGNS[target.design].backend == "etcd"
    targets = [replace(target, queue=f"{target.queue}-{n}") for n in range(queues)] \
        if queues > 1 else [target]
    share = items // queues

    def counters() -> Optional[Dict[str, float]]:
        return etcd_counters(target.address) if on_etcd else None

    before_fill = counters()
    for n, each in enumerate(targets):
        fill(each, n * share, share)
    items = share * queues
    before_drain = counters()
    interval = consumers / pace if pace else 0.0
    with Workers(_consume, [(targets[i % queues], interval)
                            for i in range(consumers)]) as workers:
        workers.go()
        # From the release on, as the floor's writes: spawning and importing
        # (seconds for 64 processes) are not the drain's.
        etcd_cpu = process_cpu_seconds(server_pid) if server_pid else None
        reports = workers.results(RUN_TIMEOUT)
    if server_pid and etcd_cpu is not None:
        etcd_cpu = process_cpu_seconds(server_pid) - etcd_cpu
    after = counters()

    handed_out = [payload for report in reports for payload in report.payloads]
    unique = len(set(handed_out))
    run_twice = len(handed_out) - unique
    recorded = [_recorded_twice(each) for each in targets]
    recorded_twice = None if None in recorded else sum(r or 0 for r in recorded)
    if recorded_twice is not None:
        run_twice = max(run_twice, recorded_twice)
    seconds = max(r.last_done for r in reports) - min(r.started for r in reports)
    failures = [r.lock_failures for r in reports]
    requests: Dict[str, int] = {}
    for report in reports:
        for method, count in report.requests.items():
            requests[method] = requests.get(method, 0) + count
    return DrainRun(
        design=target.design, consumers=consumers, items=items, seconds=seconds,
        items_per_s=unique / seconds if seconds > 0 else 0.0, claims=len(handed_out),
        run_twice=run_twice, missing=items - unique,
        lock_failures=None if None in failures else sum(f or 0 for f in failures),
        requests=requests,
        etcd_ops=EtcdOps.between(before_fill, after) if before_fill and after else None,
        drain_ops=EtcdOps.between(before_drain, after) if before_drain and after else None,
        etcd_cpu_seconds=etcd_cpu, clients_cpu_seconds=sum(r.cpu_seconds for r in reports),
        queues=queues, steady_items_per_s=steady_rate([t for r in reports for t in r.done_at]),
        first_item_s=_first_item_s(reports), paced=pace)


def steady_rate(finished: List[float], low: float = 0.1, high: float = 0.9) -> Optional[float]:
    """Items/s between the ``low`` and ``high`` quantiles of the finishing times; None
    for fewer than 10 items or no time between them."""
    if len(finished) < 10:
        return None
    ordered = sorted(finished)
    first, last = round(low * (len(ordered) - 1)), round(high * (len(ordered) - 1))
    span = ordered[last] - ordered[first]
    return (last - first) / span if span > 0 else None


def _first_item_s(reports: List[ConsumerReport]) -> Optional[float]:
    """Start line to the first item finished, the median of the consumers that had one."""
    firsts = [r.done_at[0] - r.started for r in reports if r.done_at]
    return statistics.median(firsts) if firsts else None


def _recorded_twice(target: Target) -> Optional[int]:
    design = open_design(target)
    try:
        return design.runs_recorded_twice()
    finally:
        design.close()


# -- 3. claim cost against queue length ------------------------------------------------------

@dataclass
class ClaimCostRun:
    """One consumer process making claims from a queue of ``pending`` items."""

    design: str
    pending: int
    claims: int
    claims_per_s: float           # time inside claim() only; finishing is not counted
    round_trips_median: float     # HTTP requests sent during one claim()
    first_claim_s: float          # the first claim, which may build a local view
    peak_rss_mb: float            # of the consumer process, at the end


def _probe_claims(start: StartLine, target: Target, pending: int, claims: int,
                  budget_s: float) -> ClaimCostRun:
    design = open_design(target)
    try:
        start()
        began = time.perf_counter()
        if design.claim() is None:
            raise RuntimeError(f"{target.queue} is empty; expected {pending} items")
        first_claim_s = time.perf_counter() - began
        design.finish()
        seconds: List[float] = []
        trips: List[int] = []
        give_up = time.perf_counter() + budget_s
        while len(seconds) < claims and time.perf_counter() < give_up:
            sent = sum(design.requests.values())
            began = time.perf_counter()
            if design.claim() is None:
                raise RuntimeError(f"{target.queue} ran dry after {len(seconds)} claims")
            seconds.append(time.perf_counter() - began)
            trips.append(sum(design.requests.values()) - sent)
            design.finish()
        # ru_maxrss is in KiB on Linux: the peak of this whole process.
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return ClaimCostRun(target.design, pending, len(seconds), len(seconds) / sum(seconds),
                            statistics.median(trips), first_claim_s, peak_kib / 1024)
    finally:
        design.close()


class QueueAtLength:
    """One queue topped up to a given length before every probe."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._put = 0    # items put so far (the next payload number)
        self._taken = 0  # items claimed so far

    def probe(self, pending: int, claims: int, budget_s: float) -> ClaimCostRun:
        """Top the queue up to ``pending`` items, then time claims in a fresh process."""
        missing = pending - (self._put - self._taken)
        if missing > 0:
            fill(self.target, self._put, missing)
            self._put += missing
        run = run_workers(_probe_claims, [(self.target, pending, claims, budget_s)],
                          RUN_TIMEOUT)[0]
        self._taken += run.claims + 1  # + the first claim
        return run


# -- 4. blocking-claim wake latency -------------------------------------------------------------

@dataclass
class WakeRun:
    """A consumer blocked in ``claim(timeout=None)``; a producer puts one item at a time."""

    puts: int
    latencies_ms: List[float]      # put() returned -> claim() returned, per put
    idle_s: float
    idle_requests_per_s: float     # requests etcd received while the consumer waited


def _blocked_consumer(start: StartLine, url: str, name: str, puts: int
                      ) -> List[Tuple[str, float]]:
    queue = Queue(url, name, lock_ttl=LOCK_TTL)
    try:
        # The queue is empty, so this returns None at once; it sets the queue up
        # (etcdq_v2 builds its view on the first claim), so that the idle
        # window the parent watches sees a consumer that is only waiting.
        queue.claim(timeout=0)
        start()
        woken = []
        for _ in range(puts):
            claim = queue.claim(timeout=None)
            assert claim is not None, "claim(timeout=None) returned None"
            woken.append((str(claim.payload), time.time()))
            claim.complete(None)
        return woken
    finally:
        queue.close()


def wake_latency(url: str, name: str, puts: int, idle_s: float) -> WakeRun:
    """Time put-return to claim-return for ``puts`` single puts, after an idle period."""
    producer = Queue(url, name, lock_ttl=LOCK_TTL)
    put_at: Dict[str, float] = {}
    try:
        with Workers(_blocked_consumer, [(url, name, puts)]) as workers:
            workers.go()
            time.sleep(0.2)  # the consumer is now inside claim(timeout=None)
            before = etcd_counters(url)
            time.sleep(idle_s)
            idle = EtcdOps.between(before, etcd_counters(url))
            for payload in payloads(0, puts):
                producer.put(payload)
                put_at[payload] = time.time()
                # Random gaps, so puts do not fall into step with anything periodic;
                # long enough that the consumer is blocked again before the next put.
                time.sleep(random.uniform(0.03, 0.08))
            woken = workers.results(RUN_TIMEOUT)[0]
    finally:
        producer.close()
    latencies = [(at - put_at[payload]) * 1000 for payload, at in woken]
    return WakeRun(puts, latencies, idle_s, idle.requests / idle_s)

