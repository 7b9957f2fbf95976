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

The first listings (:func:`measure_listings`) are the one cost of sharing a
queue that no consumer's view can avoid on etcd v2: each consumer learns the
backlog by listing ``work/`` once (etcd v2 cannot page, nor list keys
without their values), so 64 consumers starting on a backlog make etcd
encode it 64 times.  Each run lists one queue of the drains' size from every
process at once, and nothing else: etcd's CPU for it, per item of the queue,
is what those listings add to each item of a drain.  Each process lists it
LISTING_ROUNDS times in a row, and the figures are per round: one round is
too little for /proc's 10 ms ticks.
"""
from __future__ import annotations

import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from etcdq_v2 import Queue
from etcdq_v2.transport import connect

from .designs import ETCDQ, Target
from .measure import DrainRun, drain, fill, process_cpu_seconds
from .procs import StartLine, Workers
from .report import Spread, markdown_table, ratio
from .servers import etcd_server

VALUE = "x" * 100
KEYS_PER_PROCESS = 10
#: Listings per process in a first-listings run (see the module's docstring).
LISTING_ROUNDS = 10
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


@dataclass
class ListingRun:
    """``processes`` processes each listed the ``items`` items of one queue's
    work/ ``rounds`` times, released together; etcd's CPU from the release to
    the last listing's end."""

    processes: int
    repeat: int
    items: int
    etcd_cpu_seconds: Optional[float]  # None where /proc is missing
    rounds: int = LISTING_ROUNDS

    @property
    def etcd_ms_per_item(self) -> Optional[float]:
        """What one round (a listing per process) adds to each item of a drain of the queue."""
        if self.etcd_cpu_seconds is None:
            return None
        return 1e3 * self.etcd_cpu_seconds / self.items / self.rounds


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
                runs.append(_fresh_drain(workdir, f"floor-{consumers}-{repeat}", items,
                                         consumers, queues=queues))
        if min(counts) < max(counts):
            runs.append(_paced_drain(workdir, runs, items, min(counts), max(counts), repeat,
                                     progress))
    return runs


def _fresh_drain(workdir: Path, name: str, items: int, consumers: int, queues: int = 1,
                 pace: Optional[float] = None) -> DrainRun:
    with etcd_server(workdir) as server:
        target = Target(ETCDQ, server.url, name)
        return drain(target, items, consumers, server.pid, queues=queues, pace=pace)


def _paced_drain(workdir: Path, runs: Sequence[DrainRun], items: int, low: int, high: int,
                 repeat: int, progress: Callable[[str], None]) -> DrainRun:
    """``low`` consumers on one shared queue, held to the rate that ``high`` reached
    on it in this repeat (its last such drain): etcd's CPU per item at the same
    rate.  On this machine etcd commits one raft batch (and a WAL fsync) per
    round whatever arrives, so an item costs it more when items come slower
    (bench/README.md, "etcd's CPU follows the rate")."""
    rate = [run.items_per_s for run in shared(runs) if run.consumers == high][-1]
    progress(f"floor: {items:,} items, {low} consumers held to {rate:,.0f} items/s, "
             f"run {repeat + 1}")
    return _fresh_drain(workdir, f"floor-paced-{low}-{repeat}", items, low, pace=rate)


def _list_rounds(start: StartLine, url: str, queue: str, rounds: int) -> int:
    """``rounds`` listings of ``queue``'s work/, as a consumer's view makes
    first: the entries of each."""
    with Queue(url, queue) as consumer:
        consumer._protocol.list("locks")  # connects before the start line
        start()
        listed = {len(consumer._protocol.list("work")[1]) for _ in range(rounds)}
    if len(listed) != 1:
        raise RuntimeError(f"the queue changed between listings: {sorted(listed)}")
    return listed.pop()


def one_listing_run(url: str, pid: Optional[int], queue: str, processes: int, items: int,
                    repeat: int = 0) -> ListingRun:
    """Every one of ``processes`` processes lists ``queue`` (``items`` items)
    LISTING_ROUNDS times."""
    with Workers(_list_rounds, [(url, queue, LISTING_ROUNDS)] * processes) as workers:
        workers.go()
        etcd_before = _etcd_cpu(pid)
        listed = workers.results(RUN_TIMEOUT)
        etcd_after = _etcd_cpu(pid)
    if listed != [items] * processes:
        raise RuntimeError(f"listed {listed}, expected {items} each")
    spent = None if etcd_before is None or etcd_after is None else etcd_after - etcd_before
    return ListingRun(processes, repeat, items, spent)


def measure_listings(workdir: Path, counts: Sequence[int], items: int, repeats: int,
                     progress: Callable[[str], None] = lambda message: None
                     ) -> List[ListingRun]:
    """The first listings: for every process count once per repeat, a fresh
    etcd holding one queue of ``items`` items, listed once by each process."""
    runs = []
    for repeat in range(repeats):
        for processes in counts:
            progress(f"floor: {processes} first listings of {items:,} items, run {repeat + 1}")
            with etcd_server(workdir) as server:
                target = Target(ETCDQ, server.url, f"listed-{processes}-{repeat}")
                fill(target, 0, items)
                runs.append(one_listing_run(server.url, server.pid, target.queue, processes,
                                            items, repeat))
    return runs


def listings_table(runs: Sequence[ListingRun]) -> str:
    """etcd's CPU for every process's first listing, per item of the queue."""
    counts = sorted({run.processes for run in runs})
    rows = []
    for processes in counts:
        same = [run.etcd_ms_per_item for run in runs if run.processes == processes]
        known = [value for value in same if value is not None]
        per_entry = [1e3 * v / processes for v in known]
        rows.append([str(processes), f"{runs[0].items:,}",
                     Spread.of(known).text(3) if known else "–",
                     Spread.of(per_entry).text(2) if per_entry else "–"])
    return markdown_table(["processes, one listing each", "items in work/",
                           "etcd CPU ms per item", "etcd CPU µs per listed entry"], rows)


def shared(runs: Sequence[DrainRun]) -> List[DrainRun]:
    """Of measure_drains' runs, the drains of one shared queue, flat out."""
    return [run for run in runs if run.queues == 1 and run.paced is None]


def paced(runs: Sequence[DrainRun]) -> List[DrainRun]:
    """Of measure_drains' runs, the few consumers held to the many's rate."""
    return [run for run in runs if run.paced is not None]


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


def listing_medians(listings: Sequence[ListingRun], processes: int) -> Optional[float]:
    """etcd ms per item of the first listings by ``processes`` processes, median."""
    return _median([run.etcd_ms_per_item for run in listings if run.processes == processes])


def comparison(runs: Sequence[FloorRun], drains: Sequence[DrainRun], low: int,
               high: int, alone: Sequence[DrainRun] = (),
               label: str = "etcdq_v2 drains (items)",
               listings: Sequence[ListingRun] = (),
               held: Sequence[DrainRun] = ()) -> Optional[str]:
    """The drains' ratios (``high`` against ``low`` processes; ``label`` names
    them) next to the floor's (and the queue's floor's, from ``alone``, if it
    measured both; with the first listings added, from ``listings``; against
    ``low`` consumers held to ``high``'s rate, from ``held``), and the bound
    on the drain rate at ``high``; None unless both were measured at both
    counts."""
    drain_low, drain_high = drain_medians(drains, low), drain_medians(drains, high)
    floor = _factors(_floor_medians(runs, low), _floor_medians(runs, high))
    if drain_low is None or drain_high is None or floor is None:
        return None
    growth = _factors(drain_low, drain_high)
    assert growth is not None  # drain_medians never holds a None
    rows = [[label, *(f"{f:.2f}×" for f in growth)]]
    held_low = drain_medians(held, low)
    if held_low is not None:
        same_rate = _factors(held_low, drain_high)
        assert same_rate is not None
        rows.append([f"the same, against {low} consumers held to the {high} consumers' rate "
                     "(items)", *(f"{f:.2f}×" for f in same_rate)])
    alone_low, alone_high = drain_medians(alone, low), drain_medians(alone, high)
    if alone_low is not None and alone_high is not None:
        apart = _factors(alone_low, alone_high)
        assert apart is not None
        rows.append(["each consumer alone on its own queue, the queue's floor (items)",
                     *(f"{f:.2f}×" for f in apart)])
        rows += _with_listings(alone_low[1], alone_high[1], listings, low, high)
    rows += [["bare writes, the floor", *(f"{f:.2f}×" for f in floor)],
             ["issue 14's target", "≥ 0.80×", "≤ 1.25×", "–"]]
    text = markdown_table([f"{high} processes against {low}", "rate", "etcd CPU per item/write",
                           "clients' CPU per item/write"], rows)
    return text + "\n\n" + bound_text(drain_low, floor[1], floor[2], low, high)


def _with_listings(etcd_low: float, etcd_high: float, listings: Sequence[ListingRun],
                   low: int, high: int) -> List[List[str]]:
    """The queue's floor's etcd CPU per item with each consumer's first listing
    of the shared backlog added: what a shared queue costs at least, if every
    consumer lists it once (none if the listings were not measured)."""
    add_low, add_high = listing_medians(listings, low), listing_medians(listings, high)
    if add_low is None or add_high is None:
        return []
    return [["the queue's floor, plus one listing of the whole backlog per consumer "
             f"(+{add_low:.3f} and +{add_high:.3f} ms per item)", "–",
             f"{(etcd_high + add_high) / (etcd_low + add_low):.2f}×", "–"]]


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
