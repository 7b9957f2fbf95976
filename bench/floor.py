"""The floor (issue 14, target 1): bare etcd writes from 8, 32 and 64 processes.

``python bench/run.py --only floor``.  Not a queue at all: each process
writes its own ten keys in a loop (``transport.put``, 100-byte values), a
fixed total of writes split evenly over the processes, all released together
(bench/procs.py).  Each run gets a fresh etcd; the repeats go round the
process counts, so that the machine's noise falls on every count alike.

What it shows is how the cost of one write, etcd's and the clients', grows
with the number of client processes on this machine when nothing else
grows: no events, no listing, no lost races.  A queue item costs a few such
writes and more; if its CPU grows at least as a write's does (the queue
making no fewer or cheaper requests per item at 64 processes than at 8),
:func:`rate_bound` turns that into a ceiling on the 64-consumer drain rate.

The queue's floor (:func:`measure_drains`) is etcdq_v2 itself with nothing
shared: the drains' items split evenly over one queue per consumer, each
consumer alone on its own (``measure.drain(queues=...)``), so no consumer
lists another's items, loses a race or hears another's events.  What 64
such consumers cost against 8 is what 64 processes making etcdq_v2's
requests cost this machine; the rest of the drains' growth is what sharing
one queue costs.  The same function drains one shared queue beside it, each
drain on a fresh etcd like the floor's (the drains section runs every count
on one etcd, one after the other).
"""
from __future__ import annotations

import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from etcdq_v2.transport import connect

from .designs import ETCDQ, Target
from .measure import DrainRun, drain, process_cpu_seconds
from .procs import StartLine, Workers
from .report import Spread, markdown_table, ratio
from .servers import etcd_server

VALUE = "x" * 100
KEYS_PER_PROCESS = 10
#: A run that takes longer than this is broken, not slow.
RUN_TIMEOUT = 600.0


@dataclass
class FloorRun:
    """``processes`` processes wrote ``writes`` keys in all, in ``seconds`` (first start
    to last end); the CPU both sides spent meanwhile."""

    processes: int
    repeat: int
    writes: int
    seconds: float
    etcd_cpu_seconds: Optional[float]  # None where /proc is missing
    clients_cpu_seconds: float         # every writer's user + system, from its start

    @property
    def writes_per_s(self) -> float:
        return self.writes / self.seconds

    @property
    def etcd_us_per_write(self) -> Optional[float]:
        if self.etcd_cpu_seconds is None:
            return None
        return 1e6 * self.etcd_cpu_seconds / self.writes

    @property
    def clients_us_per_write(self) -> float:
        return 1e6 * self.clients_cpu_seconds / self.writes


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _write_loop(start: StartLine, url: str, index: int, writes: int
                ) -> Tuple[float, float, float]:
    """``writes`` PUTs of this process's own keys: (started, ended, CPU seconds)."""
    transport = connect(url)
    keys = [f"/bench/floor/{index}/k{n}" for n in range(KEYS_PER_PROCESS)]
    try:
        transport.put(keys[0], VALUE)  # opens the connection before the start line
        started = start()
        cpu = _cpu_seconds()
        for n in range(writes):
            transport.put(keys[n % KEYS_PER_PROCESS], VALUE)
        return started, time.time(), _cpu_seconds() - cpu
    finally:
        transport.close()


def _etcd_cpu(pid: Optional[int]) -> Optional[float]:
    try:
        return process_cpu_seconds(pid) if pid else None
    except OSError:
        return None


def one_run(url: str, pid: Optional[int], processes: int, writes: int,
            repeat: int = 0) -> FloorRun:
    """``writes`` writes (rounded down to a multiple of ``processes``) against one etcd.

    etcd's CPU is read once the writers are released and again when all have
    reported: their start (spawning, imports, the first connection) is not in it.
    """
    each = writes // processes
    with Workers(_write_loop, [(url, i, each) for i in range(processes)]) as workers:
        workers.go()
        etcd_before = _etcd_cpu(pid)
        reports = workers.results(RUN_TIMEOUT)
        etcd_after = _etcd_cpu(pid)
    seconds = max(r[1] for r in reports) - min(r[0] for r in reports)
    spent = None if etcd_before is None or etcd_after is None else etcd_after - etcd_before
    return FloorRun(processes, repeat, each * processes, seconds, spent,
                    sum(r[2] for r in reports))


def measure(workdir: Path, counts: Sequence[int], writes: int, repeats: int,
            progress: Callable[[str], None] = lambda message: None) -> List[FloorRun]:
    """Every process count once per repeat, each on a fresh etcd."""
    runs = []
    for repeat in range(repeats):
        for processes in counts:
            progress(f"floor: {writes:,} writes from {processes} processes, run {repeat + 1}")
            with etcd_server(workdir) as server:
                runs.append(one_run(server.url, server.pid, processes, writes, repeat))
    return runs


def measure_drains(workdir: Path, counts: Sequence[int], items: int, repeats: int,
                   progress: Callable[[str], None] = lambda message: None) -> List[DrainRun]:
    """The queue's floor and the shared queue beside it: for every consumer count
    once per repeat, ``items`` drained from one queue that all the consumers
    share (``queues`` 1), then split over one queue per consumer, each alone on
    its own; each drain on a fresh etcd, so that neither inherits the other's
    keys or lingering locks, and the noise falls on both alike."""
    runs = []
    for repeat in range(repeats):
        for consumers in counts:
            for queues in sorted({1, consumers}):
                how = "one shared queue" if queues == 1 else "alone on a queue each"
                progress(f"floor: {items:,} items, {consumers} consumers, {how}, run {repeat + 1}")
                with etcd_server(workdir) as server:
                    target = Target(ETCDQ, server.url, f"floor-{consumers}-{repeat}")
                    runs.append(drain(target, items, consumers, server.pid, queues=queues))
    return runs


def shared(runs: Sequence[DrainRun]) -> List[DrainRun]:
    """Of measure_drains' runs, the drains of one shared queue."""
    return [run for run in runs if run.queues == 1]


def alone(runs: Sequence[DrainRun]) -> List[DrainRun]:
    """Of measure_drains' runs, the queue's floor: each consumer alone on its own queue."""
    return [run for run in runs if run.queues > 1]


# -- the tables ------------------------------------------------------------------------------

def _by_count(runs: Sequence[FloorRun]) -> List[Tuple[int, List[FloorRun]]]:
    counts = sorted({run.processes for run in runs})
    return [(n, [run for run in runs if run.processes == n]) for n in counts]


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def _floor_medians(runs: Sequence[FloorRun], processes: int
                   ) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    """(writes/s, etcd µs/write, clients' µs/write), medians over the repeats."""
    same = [run for run in runs if run.processes == processes]
    return (_median([r.writes_per_s for r in same]), _median([r.etcd_us_per_write for r in same]),
            _median([r.clients_us_per_write for r in same]))


def _spread_and_ratio(values: Sequence[Optional[float]], reference: Optional[float],
                      digits: int) -> List[str]:
    known = [value for value in values if value is not None]
    if not known:
        return ["–", "–"]
    return [Spread.of(known).text(digits), ratio(statistics.median(known), reference)]


def table(runs: Sequence[FloorRun]) -> str:
    """Writes/s and CPU per write at each process count, with ratios to the fewest."""
    groups = _by_count(runs)
    first = groups[0][0] if groups else 0
    reference = _floor_medians(runs, first)
    rows = []
    for processes, same in groups:
        rows.append([str(processes), f"{same[0].writes:,}",
                     *_spread_and_ratio([r.writes_per_s for r in same], reference[0], 0),
                     *_spread_and_ratio([r.etcd_us_per_write for r in same], reference[1], 0),
                     *_spread_and_ratio([r.clients_us_per_write for r in same],
                                        reference[2], 0)])
    return markdown_table(["processes", "writes", "writes/s", f"× {first}",
                           "etcd CPU µs/write", f"× {first}", "clients' CPU µs/write",
                           f"× {first}"], rows)


# -- next to the drains, and the bound they give ---------------------------------------------

def rate_bound(rate: float, etcd_ms: float, clients_ms: float, etcd_factor: float,
               clients_factor: float) -> float:
    """The most items/s at more consumers, if an item's CPU grows as a bare write's does.

    At ``rate`` items/s an item costs ``etcd_ms`` of etcd's CPU and
    ``clients_ms`` of the clients'; if each part grows by at least the
    floor's factor and the machine's CPU stays as busy, the rate falls by
    (E + C) / (E·fe + C·fc).
    """
    return rate * (etcd_ms + clients_ms) / (etcd_ms * etcd_factor + clients_ms * clients_factor)


def drain_medians(drains: Sequence[DrainRun], consumers: int
                  ) -> Optional[Tuple[float, float, float]]:
    """etcdq_v2's drains with ``consumers``: (items/s, etcd ms/item, clients' ms/item)."""
    same = [run for run in drains if run.design == ETCDQ and run.consumers == consumers]
    rate = _median([r.items_per_s for r in same])
    etcd = _median([r.etcd_cpu_ms_per_item for r in same])
    clients = _median([r.clients_cpu_ms_per_item for r in same])
    if rate is None or etcd is None or clients is None:
        return None
    return rate, etcd, clients


def _factors(low: Sequence[Optional[float]], high: Sequence[Optional[float]]
             ) -> Optional[List[float]]:
    """high ÷ low, value by value; None if any is missing."""
    if None in low or None in high or 0 in low:
        return None
    return [h / lo for lo, h in zip(low, high)]  # type: ignore[operator]


def comparison(runs: Sequence[FloorRun], drains: Sequence[DrainRun], low: int,
               high: int, alone: Sequence[DrainRun] = (),
               label: str = "etcdq_v2 drains (items)") -> Optional[str]:
    """The drains' ratios (``high`` against ``low`` processes; ``label`` names
    them) next to the floor's (and the queue's floor's, from ``alone``, if it
    measured both), and the bound on the drain rate at ``high``; None unless
    both were measured at both counts."""
    drain_low, drain_high = drain_medians(drains, low), drain_medians(drains, high)
    floor = _factors(_floor_medians(runs, low), _floor_medians(runs, high))
    if drain_low is None or drain_high is None or floor is None:
        return None
    growth = _factors(drain_low, drain_high)
    assert growth is not None  # drain_medians never holds a None
    rows = [[label, *(f"{f:.2f}×" for f in growth)]]
    alone_low, alone_high = drain_medians(alone, low), drain_medians(alone, high)
    if alone_low is not None and alone_high is not None:
        apart = _factors(alone_low, alone_high)
        assert apart is not None
        rows.append(["each consumer alone on its own queue, the queue's floor (items)",
                     *(f"{f:.2f}×" for f in apart)])
    rows += [["bare writes, the floor", *(f"{f:.2f}×" for f in floor)],
             ["issue 14's target", "≥ 0.80×", "≤ 1.25×", "–"]]
    text = markdown_table([f"{high} processes against {low}", "rate", "etcd CPU per item/write",
                           "clients' CPU per item/write"], rows)
    return text + "\n\n" + bound_text(drain_low, floor[1], floor[2], low, high)


def bound_text(drain_low: Tuple[float, float, float], etcd_factor: float,
               clients_factor: float, low: int, high: int) -> str:
    rate, etcd_ms, clients_ms = drain_low
    bound = rate_bound(rate, etcd_ms, clients_ms, etcd_factor, clients_factor)
    return (f"Bound: with {low} consumers an item costs etcd E = {etcd_ms:.2f} ms and the "
            f"clients C = {clients_ms:.2f} ms at {rate:,.0f} items/s; bare writes cost etcd "
            f"fe = {etcd_factor:.2f}× and the clients fc = {clients_factor:.2f}× as much at "
            f"{high} processes. With no extra work per item and the CPU as busy, {high} "
            f"consumers drain at most {rate:,.0f} × (E + C) / (E·fe + C·fc) = "
            f"**{bound:,.0f} items/s**, {bound / rate:.2f}× the {low}-consumer rate.")
