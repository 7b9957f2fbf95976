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

import math
import contextlib
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, cast

from ... import steps as steps_module
from ...keys import Layout
from ...queue import Queue
from ...transport import connect
from ...viewstate import CONFIRM, ROUND
from ...wire import Member
from ...worker import Worker
from . import invariants
from .actors import (Commit, History, Plan, RequeueRace, _put_one, canceller, consumer,
                     operator, producer, steady_producer, waiter, worker)
from .cluster import SWEEP_PERIOD, Cluster
from .invariants import Bounds, Live, Violation
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
#: Virtual seconds between two checks of one-live-claim, and of the others
#: checked as the run goes (invariants.Live).
CHECK_EVERY = 0.25
CHECK_VIEWS_EVERY = 1.0
#: An item may stay taken in a view after its lock went, or unknown to a ready
#: view while it is in work/, this long: a watching view's round (ROUND) and
#: its next listing, retried across failed members (a member frozen up to 15 s)
#: and a lock TTL; a quiet view lists locks/ once per lock TTL while items are
#: taken, and relists work/ when it starves.
TAKEN_BOUND = KNOWN_BOUND = ROUND + 2 * LOCK_TTL + 20.0
#: An item may stay taken in a view this long by a lock sign it held when the
#: cluster was restored from an older backup (the lock gone with the history
#: etcd lost): the restore ends every watch, so the view lists work/ and
#: locks/ at once, not a ROUND later; retried across failed members (a member
#: frozen up to 15 s) and a lock TTL, as TAKEN_BOUND.
OLDER_BOUND = TAKEN_BOUND - ROUND
#: An item may stay taken in a view this long after its stream delivered the
#: removal (delete or expire) of the lock it holds the item taken by: the view
#: frees it on the event, or CONFIRM (1 s) after for a sign older than its
#: stream; the checks read the views every CHECK_VIEWS_EVERY.
FREED_BOUND = CONFIRM + 2 * CHECK_VIEWS_EVERY
#: An item the follower's listing of work/ read may stay out of its ready view
#: this long after the reply to the round's last request (the listing, or
#: locks/ and lock reads after it): the round applies its listings then, with
#: no request in between; the checks read the views every CHECK_VIEWS_EVERY.
LISTED_BOUND = 2 * CHECK_VIEWS_EVERY
#: The same bound where every stream delivers what its member applies (no
#: silent stream, no member restored from a snapshot): a consumer away from
#: claiming for up to 4.5 lock TTLs (a pause, and its work after), then a
#: quiet view's listing of locks/ once per lock TTL.
TRUSTED_BOUND = 6 * LOCK_TTL
#: A lone consumer may be handed an item while an older one is free this long:
#: an item freed unseen (its lock expired) is found by the view's listing of
#: locks/ once per lock TTL, whose failure is retried up to a lock TTL later.
ORDER_SLACK = 2 * LOCK_TTL + 5.0
#: A free item may wait this long while a consumer is idle in claim() (no
#: faults): an idle consumer's view watches, and hears the item's put or its
#: lock's delete or expire at once; a sign older than its stream is checked
#: CONFIRM (1 s) after; an orphan (F3 never came) is offered an orphan delay
#: (the transport's deadline, 3 x 2 s) after its lock's delete; a quiet view
#: lists locks/ once per lock TTL; and the checks read the store every
#: CHECK_VIEWS_EVERY.
STARVE_BOUND = LOCK_TTL + 3 * 2.0 + 1.0 + 2 * CHECK_VIEWS_EVERY
#: A consumer at a window of one may be handed this many items newer than an
#: orphan its view holds free (its orphan delay over): a claim round offers the
#: orphans due before it picks, and a window of one picks the head; so one, the
#: item its claim under way picked before the orphan fell due.
ORPHAN_PASSES = 1
#: The faults' aftermath: a request held in flight arrives up to 16 s late, a
#: member frozen up to 15 s or lagging up to 10 s answers again; a view's round
#: listed before a stream went silent or its member was restored from a
#: snapshot ends within ROUND, added when one of those struck.
AFTERMATH = 16.0
#: Items put once the aftermath is over (by a producer and by the consumers'
#: processes, as pipeline stages), to judge claims that no fault disturbs.
LATE_ITEMS = 4
#: The most a member's clock is ahead of the simulation's (and the clients').
MAX_SKEW = 1.5
#: Free items the steady producer (simulate(steady_producer=)) keeps in work/:
#: enough that a claim finds one, fewer than the view's BACKLOG (32), so that
#: a watching view stays watching.
STEADY_LEVEL = 4
ROOT = "/etcdq"
NAME = "q"


@contextlib.contextmanager
def quiet_library() -> Iterator[None]:
    """The library's loggers say only what is critical inside the block (a
    simulation's faults make it warn; the invariants judge), and what they
    said before after it: a caller in the same process, a test, keeps its logs."""
    logger = logging.getLogger("etcdq_v2")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


#: A swarm seed's rates: each fault on with this chance, at its rate times
#: 10 ** uniform(SWARM_SCALE) (a rare fault at a high rate in some seeds), and
#: the faults off by default drawn in their ranges.
SWARM_ON = 0.5
SWARM_SCALE = (-0.5, 1.0)
SWARM_NEW = {"delay_reply": (0.01, 0.1), "partition": (0.005, 0.04),
             "slow_link": (0.005, 0.04), "busy": (0.005, 0.04)}
#: Drawn after the others, so that the faults before them keep their draws.
_ADDED = ("slow_link", "busy")
#: The share of swarm seeds whose operator's requeues are raced (requeue_race),
#: drawn from a generator of its own, after the rates.
SWARM_REQUEUE_RACE = 0.5
#: The share of swarm seeds whose cluster is restored from an older backup
#: (restore_old), drawn by _restore_old's own generator.
SWARM_RESTORE_OLD = 0.25
#: Shares, not rates: drawn on or off, kept as they are.
_SHARES = ("restore", "late_by")


def swarm_rates(rng: random.Random, base: FaultRates) -> FaultRates:
    """Swarm testing: which faults strike in this seed, and how often."""
    drawn: Dict[str, float] = {}
    for name in sorted(vars(base), key=lambda field: (field in _ADDED, field)):
        on = rng.random() < SWARM_ON
        value = getattr(base, name)
        if name in _SHARES:
            drawn[name] = value if on or name == "late_by" else 0.0
        elif name in SWARM_NEW and not value:
            drawn[name] = rng.uniform(*SWARM_NEW[name]) if on else 0.0
        else:
            drawn[name] = min(0.25, value * 10 ** rng.uniform(*SWARM_SCALE)) if on else 0.0
    return FaultRates(**drawn)


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
    #: The longest each bounded state of invariants.Live lasted.
    longest: Dict[str, float] = field(default_factory=dict)


def simulate(seed: int, *, consumers: int = 3, items: int = 20, faults: bool = True,
             workers: int = 1, follow_ups: float = 0.2,
             rates: Optional[FaultRates] = None, kills: float = 0.3,
             record_kills: float = 0.5, swarm: bool = False, send_f4: bool = False,
             lock_delete_kills: float = 0.0,
             requeue_race: bool = False, steady_producer: float = 0.0,
             restore_old: float = 0.0,
             prepare: Optional[Callable[[SimRuntime], None]] = None) -> Result:
    """Run seed ``seed``; ``prepare(sim)`` runs first in the main sim-thread.
    ``workers``: Workers with concurrency besides the ``consumers``' claim loops;
    ``follow_ups``: the share of completes (while faults last) after which a
    consumer puts an item, as a pipeline stage does; ``kills``: the share of
    seeds with faults (and 2 or more consumers) in which consumer 0's process
    dies, and ``record_kills`` the share of those in which it dies at a
    record's PUT (F2), between a commit's F2 and F3; ``lock_delete_kills`` the
    share of the others in which it dies at a lock's DELETE (F4, sent with F3),
    its outcome and F3's unread.  ``swarm``: the seed draws
    which faults are on and their rates (:func:`swarm_rates`), over ``rates``.
    ``send_f4``: finishers delete their lock (F4), as they do with a lock TTL
    over steps.LINGER_MAX, instead of leaving it to expire.  ``requeue_race``
    (drawn in a share SWARM_REQUEUE_RACE of swarm seeds): another process
    requeues or cancels the dead letter the operator requeues, at once, with
    pauses past the lock TTL (actors.RequeueRace), so that a requeue's Q5
    fails.  ``steady_producer`` (seconds; 0: off): another producer keeps
    STEADY_LEVEL items free in work/ from the start until this long after the
    faults stop (actors.steady_producer), so that claims keep finding work.
    ``restore_old``: the share of seeds with faults in which the whole cluster
    is restored from an older backup of its store (:func:`_restore_old`)."""
    with _f4_sent(send_f4):
        return _simulate(seed, consumers, items, faults, workers, follow_ups, rates, kills,
                         record_kills, lock_delete_kills, swarm, requeue_race,
                         steady_producer, restore_old, prepare)


#: restore_old: the backup is taken this many virtual seconds into the faults,
#: and the cluster restored from it this long after (while faults last): from
#: a backup younger than a lock TTL (its locks live on) to one that is many
#: lock TTLs old (its locks expire at the first sweep, and etcd's index goes
#: back by hundreds).
BACKUP_AT = (2.0, 40.0)
RESTORE_AFTER = (1.0, 55.0)


def _restore_old(seed: int, share: float, network: Network) -> bool:
    """In a share ``share`` of the seeds, drawn from a generator of its own (the
    other draws stay the seed's): etcd's index goes back at a seeded moment,
    as when a cluster is restored from an older backup (``etcdctl snapshot
    restore``, or data dirs copied back)."""
    rng = random.Random(f"restore-old-{seed}")
    if not share or rng.random() >= share:
        return False
    backup = rng.uniform(*BACKUP_AT)
    network.restore_old(backup, min(backup + rng.uniform(*RESTORE_AFTER), FAULTS_FOR - 1.0))
    return True


@contextlib.contextmanager
def _f4_sent(sent: bool) -> Iterator[None]:
    """While active (``sent``), F4 is sent at LOCK_TTL: the path of a lock TTL
    over LINGER_MAX (a lock deleted before F3 applies: an orphan's)."""
    linger = steps_module.LINGER_MAX
    if sent:
        steps_module.LINGER_MAX = LOCK_TTL - 1
    try:
        yield
    finally:
        steps_module.LINGER_MAX = linger


def _simulate(seed: int, consumers: int, items: int, faults: bool, workers: int,
              follow_ups: float, rates: Optional[FaultRates], kills: float,
              record_kills: float, lock_delete_kills: float, swarm: bool, requeue_race: bool,
              steady: float, restore_old: float,
              prepare: Optional[Callable[[SimRuntime], None]]) -> Result:
    sim = SimRuntime(seed)
    clocks = random.Random(f"clocks-{seed}")
    # Members' clocks a little apart (up to MAX_SKEW): a leader ahead expires locks early.
    skews = [clocks.uniform(0.0, MAX_SKEW) if faults and clocks.random() < 0.5 else 0.0
             for _ in range(3)]
    cluster = Cluster(3, start=0.0, shuffle=random.Random(f"shuffle-{seed}").shuffle,
                      skews=skews)
    faults_until = FAULTS_FOR if faults else 0.0
    if swarm:
        rates = swarm_rates(random.Random(f"swarm-{seed}"), rates or FaultRates())
        requeue_race = requeue_race or \
            random.Random(f"requeue-race-{seed}").random() < SWARM_REQUEUE_RACE
        restore_old = max(restore_old, SWARM_RESTORE_OLD)
    fault_rates = (rates or FaultRates()) if faults else NO_FAULTS
    network = Network(sim, cluster, random.Random(f"network-{seed}"), rates=fault_rates,
                      faults_until=faults_until)
    # The clients' clocks are the simulation's (skew 0).
    history = History(overlap=max(skews) + SWEEP_PERIOD + 1.0)
    plan = Plan(items, faults_until, LOCK_TTL, random.Random(f"actors-{seed}"), follow_ups)
    root = Layout(ROOT, NAME).root
    outcome: List[Optional[str]] = [None]
    queues: List[Queue] = []
    stop = [False]
    settled = [-1.0]
    started: List[Worker] = []
    rewinds = faults and _restore_old(seed, restore_old, network)
    trusted = fault_rates.silence_stream == 0 and fault_rates.restore == 0 and not rewinds
    live = Live(history, cluster, Layout(ROOT, NAME).root,
                Bounds(LOCK_TTL, TRUSTED_BOUND if trusted else TAKEN_BOUND,
                       TRUSTED_BOUND if trusted else KNOWN_BOUND, ORDER_SLACK, STARVE_BOUND,
                       passes=ORPHAN_PASSES, freed=FREED_BOUND, listed=LISTED_BOUND,
                       older=OLDER_BOUND),
                touched=network.touched, cut_off=network.partitioned, removals=network.removals,
                clock=lambda: sim.now)
    network.exchanged = live.exchanged
    network.rewound = live.rewound

    def calm() -> float:
        """When the faults' aftermath is over (inf while they last)."""
        if not faults:
            return 0.0
        if sim.now < faults_until:
            return math.inf
        stale = network.faults.get("silence_stream", 0) + network.faults.get("restore", 0) \
            + network.faults.get("restore_old", 0)
        return faults_until + AFTERMATH + (ROUND if stale else 0.0)
    live.calm = calm
    history.paused = network.spans
    history.position = lambda: len(cluster.log)
    history.applied_in = lambda item, token, index: invariants.applied_in(
        cluster, root, item, token, index)
    history.payload_of = lambda item: invariants.payload_of(cluster, root, item)
    # In a share (``kills``) of the seeds with faults, consumer c0's process dies
    # after a random number of its requests (it stops dead: see Network.kill_after).
    deaths = random.Random(f"kills-{seed}")
    doomed = deaths.randint(10, 200) if faults and consumers >= 2 and deaths.random() < kills \
        else None
    if doomed is not None and deaths.random() < record_kills:
        # At its first record's PUT from a quarter of that count on (a run's
        # early records: c0 sends fewer requests than 200 in many seeds).
        doomed //= 4
        network.kill_after("c0", doomed, at_record=True)
    elif doomed is not None and lock_delete_kills and deaths.random() < lock_delete_kills:
        # Likewise at a lock's DELETE: with F4 sent beside F3 (send_f4), a reset
        # F3 and an applied F4 leave an orphan no retry of the finisher clears.
        doomed //= 4
        network.kill_after("c0", doomed, at_lock_delete=True)
    elif doomed is not None:
        network.kill_after("c0", doomed)

    def queue(node: str) -> Queue:
        transport = connect(network.urls(), runtime=sim, member_factory=cast(Callable[[str], Member], network.members_of(node)),
                            timeout=2.0)
        made = Queue(transport, NAME, prefix=ROOT, lock_ttl=LOCK_TTL,
                     node_id=f"{node}-{sim.token()[:6]}", completed_ttl=None, failed_ttl=None,
                     backoff=[0.5, 1.0, 2.0])
        queues.append(made)
        return made

    waiting: List[Any] = []  # the sim-thread that claims with no timeout

    def drain(since: float) -> Optional[str]:
        """Wait until work/ is empty after ``since``: why not within LIVENESS_BOUND."""
        while True:
            sim.sleep(1.0)
            now = sim.now
            store = invariants.stored(cluster, root, now)
            if now >= since and not store.work:
                return None
            if now >= since + LIVENESS_BOUND:
                return (f"{len(store.work)} items still in work/ at {now:.1f} s, "
                        f"{LIVENESS_BOUND:g} s after {since:g} s (the faults stopped at "
                        f"{faults_until:g} s): {sorted(store.work)[:5]}")

    def late(start: float) -> None:
        """LATE_ITEMS puts from ``start`` on, a second or two apart, by a producer
        and by the consumers' processes (not a killed one)."""
        rng = random.Random(f"late-{seed}")
        sim.sleep(start - sim.now)
        waiting.append(sim.Thread(waiter, name="waiter", args=(queue("n"), "n0", plan, history)))
        waiting[0].start()
        putters = [queue("p2")] + [made for name, made in sorted(history.queues.items())
                                   if name.startswith("c") and not
                                   (doomed is not None and name == "c0")]
        for n in range(LATE_ITEMS):
            _put_one(rng.choice(putters), f"late-{n}", history)
            sim.sleep(rng.uniform(0.0, 2.0))

    def main() -> None:
        if prepare is not None:
            prepare(sim)
        def checker() -> None:  # the invariants checked as the run goes
            ticks = 0
            while True:
                sim.sleep(CHECK_EVERY)
                history.check_live_claims(sim.now)
                ticks += 1
                live.check(sim.now, store=ticks % round(CHECK_VIEWS_EVERY / CHECK_EVERY) == 0)

        threads = [sim.Thread(network.courier, name="courier"),
                   sim.Thread(checker, name="checker")]
        half = items // 2
        makers = [sim.Thread(producer, name="producer-0",
                             args=(queue("p0"), "p0", plan, history, half, False)),
                  sim.Thread(producer, name="producer-1",
                             args=(queue("p1"), "p1", plan, history, items - half, True))]
        if steady:
            def free() -> int:
                store = invariants.stored(cluster, root, sim.now)
                return sum(1 for item, (_, value) in store.work.items()
                           if item not in store.locks and '"o":' not in value)
            makers.append(sim.Thread(steady_producer, name="producer-3",
                                     args=(queue("p3"), "p3", history, faults_until + steady,
                                           STEADY_LEVEL, free)))
        takers = [sim.Thread(consumer, name=f"consumer-{n}",
                             args=(lambda n=n: queue(f"c{n}"), f"c{n}", plan, history,
                                   lambda: not stop[0], network))
                  for n in range(consumers)]
        takers += [sim.Thread(worker, name=f"worker-{n}",
                              args=(queue(f"w{n}"), f"w{n}", plan, history, started))
                   for n in range(workers)]
        if faults:
            threads.append(sim.Thread(canceller, name="canceller",
                                      args=(queue("k"), plan, history)))
            race = RequeueRace(queue("o2"), "o2", network,
                               random.Random(f"requeue-race-{seed}-actors")) \
                if requeue_race else None
            threads.append(sim.Thread(operator, name="operator",
                                      args=(queue("o"), plan, history, race)))

        for thread in threads + makers + takers:
            thread.start()
        for thread in makers:
            thread.join()
        outcome[0] = drain(faults_until + steady)
        if outcome[0] is None:
            settled[0] = sim.now - faults_until
            late(max(calm(), sim.now))
            outcome[0] = drain(sim.now)
        stop[0] = True
        for running in started:
            running.stop(grace=False)
        for thread in waiting:  # close() ends a claim() that waits with no timeout
            history.queues["n0"].close()
            thread.join(timeout=LOCK_TTL)
            if thread.is_alive():
                history.seen.append(("no-deadlock", "a claim() with no timeout did not "
                                     f"return within {LOCK_TTL} s of its queue's close()"))
        for made in queues:
            if not (doomed is not None and made.node_id.startswith("c0-")):
                made.close()  # a killed process closes nothing

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
    for claim in history.worked:  # the Worker's commits: after every hand-out
        if claim.outcome in ("completed", "dead-lettered"):
            history.commits.append(Commit(history.seq + 1, sim.now, claim.id,
                                          claim._state.index, claim._state.lock.token,
                                          "complete", claim.outcome,
                                          history.claim_era(claim) if history.eras else None))
    violations += list(invariants.refreshes_of_others(cluster, root, network.senders, history))
    violations += list(invariants.waits_agree(history, store, cluster, root))
    violations += list(invariants.read_backs(cluster, root, network.threads, history))
    # Every member answers once a held request, a freeze and a lag are over.
    violations += list(invariants.claims_available(
        history, faults_until + AFTERMATH if faults else 0.0))
    if cluster.rewinds:
        invariants.decide_histories(cluster, root, history)
    eras = [invariants.fenced_commits(cluster, root, era)
            for era in range(len(cluster.rewinds) + 1)] if cluster.rewinds else None
    violations += invariants.check(history, store, invariants.fenced_commits(cluster, root),
                                   outcome[0], max(skews) + SWEEP_PERIOD,
                                   invariants.claim_writes(cluster, root), eras,
                                   invariants.lost_payloads(cluster, root) if cluster.rewinds else None)
    requests = network.requests
    handovers = len(sim.trace) - network.notes
    return Result(seed, violations, sim.trace, handovers, requests, sim.now, network.faults,
                  history.errors, len(history.puts), settled[0], live.longest)
