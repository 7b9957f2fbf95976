"""What a completed item costs, counted on the simulator, from 1 to 1,024 consumers.

``python bench/costs.py`` (``--consumers 1 8 64 256 1024``, ``--seed S``).

One queue on the simulator's 3-member model etcd, no faults.  A loader puts a
backlog of ``BACKLOG_PER_CONSUMER`` x C items (put_many); then C consumers
(each its own Transport and Queue, a real view, heartbeat and follower, as a
separate process would have) claim, work ``WORK`` virtual seconds and
complete, while two producers (put one at a time; put_many in batches) keep
the backlog topped up to its first size.  Counting (:mod:`etcdq_v2.testing.
sim.costs`) starts when the consumers do.  Two stretches are reported:

* *start*: from the consumers' start until every one of them has completed an
  item: each view's first listing of ``work/`` and ``locks/`` is here;
* *steady*: the next ``WINDOW_PER_CONSUMER`` x C completed items (``--window``).

Figures are per completed item of the stretch: requests by kind (of consumers
and producers alike: their puts are part of what an item costs), watch events
delivered, and the body bytes etcd sent the clients (replies and streams).
They are counts, not times: the same seed gives the same figures on any
machine.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from greenlet import getcurrent  # noqa: E402

from etcdq_v2 import view as view_module  # noqa: E402
from etcdq_v2.protocol import Protocol  # noqa: E402
from etcdq_v2.queue import Queue  # noqa: E402
from etcdq_v2.testing.sim.cluster import Cluster  # noqa: E402
from etcdq_v2.testing.sim.costs import Costs, Tally  # noqa: E402
from etcdq_v2.testing.sim.net import Network  # noqa: E402
from etcdq_v2.testing.sim.runtime import SimRuntime  # noqa: E402
from etcdq_v2.testing.sim.simulation import quiet_library  # noqa: E402
from etcdq_v2.transport import connect  # noqa: E402
from etcdq_v2.wire import Member  # noqa: E402

BACKLOG_PER_CONSUMER = 10
WINDOW_PER_CONSUMER = 10
#: A consumer's work on an item: uniform in this range (virtual seconds).
WORK = (0.05, 0.45)
#: The producers' batch: put_many of up to this many (in_flight 8).
BATCH = 64
LOCK_TTL = 30
NAME = "q"


@dataclass
class Stretch:
    """The counts of one stretch of a run, and the items completed in it."""

    items: int = 0
    virtual: float = 0.0
    kinds: Dict[str, Tally] = field(default_factory=dict)

    def total(self) -> Tally:
        return Costs(self.kinds).total()


#: Why a listing was made: the innermost of these calls it was made under
#: (a follower's round otherwise: the first listing, a watching round, a new
#: follower after a switch).
CAUSES: Tuple[Tuple[Any, str, str], ...] = (
    (Queue, "_lost_race", "miss limit (lost C1 races)"),
    (Queue, "_found_gone", "miss limit (items gone)"),
    (view_module.QueueView, "catch_up", "catch-up (own puts)"),
    (view_module.QueueView, "check_locks", "tick (lock TTL, confirm, delays)"),
    (view_module.QueueView, "starved", "starved (waited for a relist)"),
)
ROUND = "follower round"


@dataclass
class Listings:
    """Listings of work/ and locks/ by cause: (directory, cause) -> [count, nodes]."""

    counts: Dict[Tuple[str, str], List[int]] = field(default_factory=dict)
    #: Claim outcomes since the last cut: hits (C2 done) and misses.
    hits: int = 0
    misses: int = 0

    def reset(self) -> None:
        self.counts, self.hits, self.misses = {}, 0, 0


@contextmanager
def counting_causes(listings: Listings) -> Iterator[None]:
    """Patch the library's classes (this process only) so that each listing
    of a directory is counted under the cause it was made for."""
    stacks: Dict[Any, List[str]] = {}
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in CAUSES]

    def under(method: Callable[..., Any], cause: str) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            stack = stacks.setdefault(getcurrent(), [])
            stack.append(cause)
            try:
                return method(*args, **kwargs)
            finally:
                stack.pop()
        return wrapped

    original_list = Protocol.list

    def counted_list(self: Protocol, kind: str, **kwargs: Any) -> Any:
        result = original_list(self, kind, **kwargs)
        stack = stacks.get(getcurrent()) or [ROUND]
        tally = listings.counts.setdefault((kind, stack[-1]), [0, 0])
        tally[0] += 1
        tally[1] += len(result[1])
        return result

    original_missed = view_module.QueueView.missed
    original_locked_at = view_module.QueueView.locked_at

    def missed(self: Any, item_id: str) -> bool:
        listings.misses += 1
        return original_missed(self, item_id)

    def locked_at(self: Any, item_id: str, index: int, **kwargs: Any) -> None:
        if not kwargs and index:  # a claim of ours (C2 done): a hit
            listings.hits += 1
        return original_locked_at(self, item_id, index, **kwargs)

    for owner, name, cause in CAUSES:
        setattr(owner, name, under(getattr(owner, name), cause))
    Protocol.list = counted_list  # type: ignore[method-assign]
    view_module.QueueView.missed = missed  # type: ignore[method-assign]
    view_module.QueueView.locked_at = locked_at  # type: ignore[method-assign]
    try:
        yield
    finally:
        for owner, name, method in saved:
            setattr(owner, name, method)
        Protocol.list = original_list  # type: ignore[method-assign]
        view_module.QueueView.missed = original_missed  # type: ignore[method-assign]
        view_module.QueueView.locked_at = original_locked_at  # type: ignore[method-assign]


@dataclass
class Run:
    consumers: int
    backlog: int
    seed: int
    start: Stretch
    steady: Stretch
    seconds: float
    #: Listings by cause in the steady stretch, and its hits and misses.
    causes: Listings = field(default_factory=Listings)


def measure(consumers: int, seed: int = 0, window_per_consumer: int = WINDOW_PER_CONSUMER) -> Run:
    """One run of ``consumers`` on a backlog of BACKLOG_PER_CONSUMER x them."""
    started = time.perf_counter()
    sim = SimRuntime(seed)
    cluster = Cluster(3, start=0.0, shuffle=random.Random(f"shuffle-{seed}").shuffle)
    network = Network(sim, cluster, random.Random(f"network-{seed}"))
    backlog = BACKLOG_PER_CONSUMER * consumers
    window = window_per_consumer * consumers
    rng = random.Random(f"costs-{seed}")
    queues: List[Queue] = []
    done: List[str] = []  # consumers' names, one per completed item
    put = [0]
    stop = [False]
    stretches = [Stretch(), Stretch()]
    listings = Listings()

    def queue(node: str) -> Queue:
        factory = cast(Callable[[str], Member], network.members_of(node))
        transport = connect(network.urls(), runtime=sim, member_factory=factory, timeout=2.0)
        made = Queue(transport, NAME, lock_ttl=LOCK_TTL, node_id=node)
        queues.append(made)
        return made

    def consumer(made: Queue, name: str) -> None:
        while not stop[0]:
            claim = made.claim(timeout=2.0)
            if claim is None:
                continue
            sim.sleep(rng.uniform(*WORK))
            claim.complete({"by": name})
            done.append(name)

    def producer(made: Queue, batched: bool) -> None:
        while not stop[0]:
            room = backlog - (put[0] - len(done))
            if room <= 0:
                sim.sleep(0.02)
                continue
            size = min(room, BATCH) if batched else 1
            payloads = [f"item-{put[0] + n}" for n in range(size)]
            put[0] += size
            if batched:
                made.put_many(payloads, in_flight=8)
            else:
                made.put(payloads[0])

    def cut(stretch: Stretch, since: float, items: int) -> None:
        costs = network.costs
        assert costs is not None
        stretch.kinds, stretch.items, stretch.virtual = dict(costs.kinds), items, sim.now - since
        costs.reset()
        listings.reset()

    def main() -> None:
        sim.Thread(network.courier, name="courier").start()
        loader = queue("loader")
        loader.put_many([f"item-{n}" for n in range(backlog)], in_flight=64)
        put[0] = backlog
        network.costs = Costs()
        begun = sim.now
        takers = [sim.Thread(consumer, name=f"consumer-{n}", args=(queue(f"c{n}"), f"c{n}"))
                  for n in range(consumers)]
        makers = [sim.Thread(producer, name=f"producer-{n}", args=(queue(f"p{n}"), n == 1))
                  for n in range(2)]
        for thread in takers + makers:
            thread.start()
        while len(set(done)) < consumers:
            sim.sleep(0.01)
        cut(stretches[0], begun, len(done))
        steady_from, first = sim.now, len(done)
        while len(done) - first < window:
            sim.sleep(0.01)
        steady.counts, steady.hits, steady.misses = \
            listings.counts, listings.hits, listings.misses
        cut(stretches[1], steady_from, len(done) - first)
        network.costs = None
        stop[0] = True
        for made in queues:
            made.close()

    steady = Listings()
    with counting_causes(listings):
        sim.run(main)
    if sim.failures:
        raise RuntimeError(f"sim-threads died: {sim.failures[:3]}")
    return Run(consumers, backlog, seed, stretches[0], stretches[1],
               time.perf_counter() - started, steady)


def _per(value: float, items: int) -> str:
    return f"{value / items:.2f}" if items else "-"


def _units(runs: List[Run], stretch: str) -> List[Stretch]:
    """The stretches, each with ``items`` the divisor: completed items for
    steady, consumers for start (what one consumer's start costs)."""
    parts = [getattr(run, stretch) for run in runs]
    if stretch == "start":
        parts = [Stretch(run.consumers, part.virtual, part.kinds) for run, part in zip(runs, parts)]
    return parts


def _head(label: str, runs: List[Run], stretch: str) -> List[str]:
    unit = "consumer" if stretch == "start" else "item"
    return [f"| {label} {unit} | " + " | ".join(f"{run.consumers} c" for run in runs) + " |",
            "|---|" + "---:|" * len(runs)]


def table(runs: List[Run], stretch: str) -> str:
    """Per completed item of steady, per consumer of start: one row per kind."""
    parts = _units(runs, stretch)
    kinds = sorted({name for part in parts for name in part.kinds})
    lines = _head("per", runs, stretch)
    for name in kinds:
        cells = [_per(part.kinds[name].requests, part.items) if name in part.kinds else "0"
                 for part in parts]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    totals = [part.total() for part in parts]
    rows = [("**requests**", lambda t: t.requests),
            ("watch events delivered", lambda t: t.events),
            ("kB from etcd (reply bodies)", lambda t: t.received / 1000),
            ("kB from etcd (streams)", lambda t: t.streamed / 1000),
            ("**kB from etcd**", lambda t: t.from_etcd / 1000),
            ("kB to etcd (paths, forms)", lambda t: t.sent / 1000)]
    for label, value in rows:
        lines.append(f"| {label} | " + " | ".join(
            _per(value(total), part.items) for total, part in zip(totals, parts)) + " |")
    lines.append("| items completed (virtual s) | " + " | ".join(
        f"{getattr(run, stretch).items} ({part.virtual:.1f} s)"
        for run, part in zip(runs, parts)) + " |")
    return "\n".join(lines)


def bytes_table(runs: List[Run], stretch: str) -> str:
    """kB from etcd per item (steady) or consumer (start), by kind (kinds that sent any)."""
    parts = _units(runs, stretch)
    kinds = sorted({name for part in parts for name, t in part.kinds.items() if t.from_etcd})
    lines = _head("kB from etcd per", runs, stretch)
    for name in kinds:
        cells = [_per(part.kinds[name].from_etcd / 1000, part.items) if name in part.kinds
                 else "0" for part in parts]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def causes_table(runs: List[Run]) -> str:
    """Steady: listings per 100 completed items by directory and cause, and
    the nodes they carried per item; then the claims' hits and misses."""
    keys = sorted({key for run in runs for key in run.causes.counts})
    lines = _head("listings per 100 items (nodes per item) /", runs, "steady")
    for directory, cause in keys:
        cells = []
        for run in runs:
            count, nodes = run.causes.counts.get((directory, cause), [0, 0])
            items = run.steady.items
            cells.append(f"{100 * count / items:.1f} ({nodes / items:.0f})" if count else "0")
        lines.append(f"| `{directory}/`: {cause} | " + " | ".join(cells) + " |")
    for label, value in (("claim hits (C2 done)", lambda c: c.hits),
                         ("claim misses (taken or gone)", lambda c: c.misses)):
        lines.append(f"| {label} per item | " + " | ".join(
            _per(value(run.causes), run.steady.items) for run in runs) + " |")
    return "\n".join(lines)


def _per_item(part: Stretch, what: str) -> float:
    total = part.total()
    return (total.requests if what == "requests" else total.from_etcd) / part.items


def targets(runs: List[Run], stretch: str) -> List[str]:
    """The issue's targets, counted: requests per item at 64 <= 1.15x at 8 and
    at 1,024 <= 1.5x; bytes from etcd per item at 64 <= 1.25x at 8."""
    by = {run.consumers: getattr(run, stretch) for run in runs}
    out = []
    for many, what, bound in ((64, "requests", 1.15), (1024, "requests", 1.5),
                              (64, "bytes", 1.25)):
        if 8 not in by or many not in by:
            continue
        ratio = _per_item(by[many], what) / _per_item(by[8], what)
        out.append(f"{what} per item at {many} / at 8: {ratio:.3f} (target <= {bound}): "
                   + ("holds" if ratio <= bound else "FAILS"))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 8, 64, 256, 1024])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=WINDOW_PER_CONSUMER,
                        help="items per consumer in the steady stretch")
    parser.add_argument("--json", help="write every run's counts here")
    args = parser.parse_args(argv)
    runs = []
    for consumers in args.consumers:
        with quiet_library():
            run = measure(consumers, args.seed, args.window)
        print(f"costs: {consumers} consumers, backlog {run.backlog}: {run.seconds:.0f} s",
              file=sys.stderr)
        runs.append(run)
    for stretch, unit in (("steady", "completed item"), ("start", "consumer")):
        print(f"\n#### {stretch}: requests per {unit}, by kind\n")
        print(table(runs, stretch))
        print(f"\n#### {stretch}: kB from etcd per {unit}, by kind\n")
        print(bytes_table(runs, stretch))
    print("\n#### steady: listings by cause\n")
    print(causes_table(runs))
    print()
    for line in targets(runs, "steady"):
        print(f"- steady: {line}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump([{"consumers": run.consumers, "backlog": run.backlog, "seed": run.seed,
                        "seconds": run.seconds,
                        "causes": {f"{d} {c}": v for (d, c), v in run.causes.counts.items()},
                        "hits": run.causes.hits, "misses": run.causes.misses,
                        **{name: {"items": part.items, "virtual": part.virtual,
                                  "kinds": {k: vars(t) for k, t in part.kinds.items()}}
                           for name, part in (("start", run.start), ("steady", run.steady))}}
                       for run in runs], out, indent=1)
    return 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") is None:  # set order, and so the counts, replay
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    sys.exit(main())
