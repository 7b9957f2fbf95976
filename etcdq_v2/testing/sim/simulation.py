"""One simulated run: the real library against the model, under SimRuntime(seed).

:func:`simulate` builds a 3-member model cluster, the network
(:mod:`.net`, faults until ``FAULTS_FOR`` virtual seconds), 2 producers
(put, delayed put; put_many with in_flight) and ``consumers`` consumers,
each with its own Transport and Queue (node id from the seed), all
sim-threads of one SimRuntime.  The main sim-thread waits until the
producers are done, the faults over and every stored item has its record,
or until LIVENESS_BOUND past the end of the faults; then the invariants
(:mod:`.invariants`) judge the run.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, cast

from ...keys import Layout
from ...queue import Queue
from ...transport import connect
from ...wire import Member
from . import invariants
from .actors import History, Plan, canceller, consumer, producer
from .cluster import SWEEP_PERIOD, Cluster
from .invariants import Violation
from .net import NO_FAULTS, FaultRates, Network
from .runtime import Deadlock, SimRuntime

LOCK_TTL = 5
#: Virtual seconds during which faults strike.
FAULTS_FOR = 60.0
#: Once faults stop (and the producers are done), every stored item reaches its
#: record within this many virtual seconds while consumers keep claiming: a
#: lock TTL for a lock taken just before, etcd's 0.5 s sweep, a retry's
#: backoff (at most 2 s here), and the view's idle stream timeout and listing
#: round (60 s each) for a follower whose stream went silent.
LIVENESS_BOUND = 2 * LOCK_TTL + 60.0 + 30.0
#: Virtual seconds between two checks of the invariants checked as the run goes.
CHECK_EVERY = 0.25
#: The most a member's clock is ahead of the simulation's (and the clients').
MAX_SKEW = 1.5
ROOT = "/etcdq"
NAME = "q"


@dataclass
class Result:
    seed: int
    violations: List[Violation]
    trace: List[str]
    handovers: int
    requests: int
    virtual: float
    faults: Dict[str, int] = field(default_factory=dict)
    errors: Dict[str, int] = field(default_factory=dict)
    items: int = 0
    #: Virtual seconds from the end of the faults until work/ was empty (-1: never).
    settled: float = -1.0


def simulate(seed: int, *, consumers: int = 3, items: int = 20, faults: bool = True,
             rates: Optional[FaultRates] = None,
             prepare: Optional[Callable[[SimRuntime], None]] = None) -> Result:
    """Run seed ``seed``; ``prepare(sim)`` runs first in the main sim-thread."""
    sim = SimRuntime(seed)
    clocks = random.Random(f"clocks-{seed}")
    # Members' clocks a little apart (up to MAX_SKEW): a leader ahead expires locks early.
    skews = [clocks.uniform(0.0, MAX_SKEW) if faults and clocks.random() < 0.5 else 0.0
             for _ in range(3)]
    cluster = Cluster(3, start=0.0, shuffle=random.Random(f"shuffle-{seed}").shuffle,
                      skews=skews)
    faults_until = FAULTS_FOR if faults else 0.0
    network = Network(sim, cluster, random.Random(f"network-{seed}"),
                      rates=(rates or FaultRates()) if faults else NO_FAULTS,
                      faults_until=faults_until)
    # The clients' clocks are the simulation's (skew 0).
    history = History(overlap=max(skews) + SWEEP_PERIOD + 1.0)
    plan = Plan(items, faults_until, LOCK_TTL, random.Random(f"actors-{seed}"))
    root = Layout(ROOT, NAME).root
    outcome: List[Optional[str]] = [None]
    queues: List[Queue] = []
    stop = [False]
    settled = [-1.0]

    def queue(node: str) -> Queue:
        transport = connect(network.urls(), runtime=sim, member_factory=cast(Callable[[str], Member], network.members_of(node)),
                            timeout=2.0)
        made = Queue(transport, NAME, prefix=ROOT, lock_ttl=LOCK_TTL,
                     node_id=f"{node}-{sim.token()[:6]}", completed_ttl=None, failed_ttl=None,
                     backoff=[0.5, 1.0, 2.0])
        queues.append(made)
        return made

    def main() -> None:
        if prepare is not None:
            prepare(sim)
        def checker() -> None:  # the invariants checked as the run goes
            while True:
                sim.sleep(CHECK_EVERY)
                history.check_live_claims(sim.now)

        threads = [sim.Thread(network.courier, name="courier"),
                   sim.Thread(checker, name="checker")]
        half = items // 2
        makers = [sim.Thread(producer, name="producer-0",
                             args=(queue("p0"), "p0", plan, history, half, False)),
                  sim.Thread(producer, name="producer-1",
                             args=(queue("p1"), "p1", plan, history, items - half, True))]
        takers = [sim.Thread(consumer, name=f"consumer-{n}",
                             args=(queue(f"c{n}"), f"c{n}", plan, history,
                                   lambda: not stop[0], network))
                  for n in range(consumers)]
        if faults:
            threads.append(sim.Thread(canceller, name="canceller",
                                      args=(queue("k"), plan, history)))
        for thread in threads + makers + takers:
            thread.start()
        for thread in makers:
            thread.join()
        give_up = faults_until + LIVENESS_BOUND
        while True:
            sim.sleep(1.0)
            now = sim.now
            store = invariants.stored(cluster, root, now)
            if now >= faults_until and not store.work:
                settled[0] = now - faults_until
                break
            if now >= give_up:
                outcome[0] = (f"{len(store.work)} items still in work/ at {now:.1f} s, "
                              f"{LIVENESS_BOUND:g} s after the faults stopped at "
                              f"{faults_until:g} s: {sorted(store.work)[:5]}")
                break
        stop[0] = True
        for made in queues:
            made.close()

    violations: List[Violation] = []
    try:
        sim.run(main)
    except Deadlock as deadlock:
        violations.append(Violation("no-deadlock", str(deadlock)))
    for name, died in sim.failures:
        violations.append(Violation("no-thread-died", f"{name}: {died!r}"))
    seen: Dict[str, Violation] = {}  # the first of each name is enough
    for name, detail in history.seen:
        seen.setdefault(name, Violation(name, detail))
    violations += list(seen.values())
    store = invariants.stored(cluster, root, sim.now)
    violations += invariants.check(history, store, invariants.fenced_commits(cluster, root),
                                   outcome[0], max(skews) + SWEEP_PERIOD,
                                   invariants.claim_writes(cluster, root))
    requests = network.requests
    handovers = len(sim.trace) - network.notes
    return Result(seed, violations, sim.trace, handovers, requests, sim.now, network.faults,
                  history.errors, len(history.puts), settled[0])
