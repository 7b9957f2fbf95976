"""Chaos run: workers, etcd members and the network fail while a queue drains; count what happened.

A 3-member etcd cluster on loopback, several worker processes whose
handlers take varying time (and fail some items every time, so they are
dead-lettered), and a producer.  Each client reaches each member through a
fault-injecting TCP proxy of its own (tests/faultproxy.py), so that a fault
can hit one member for everyone, or one client on every member.  While they
run:

* a process schedule SIGKILLs workers (and starts new ones), SIGKILLs etcd
  members (the leader at least once) and restarts them on their data
  directories, and SIGSTOPs a member for longer than an election timeout;
* a network schedule black-holes one member for every client for a while,
  then holds one worker's next commit on every member for longer than the
  lock TTL: the worker keeps resending it (its deadline is longer), its
  lock expires, and once another worker was handed the item, the stale
  claim's held copies are released first, then the new claim's commit
  (held too by then).

Workers log each claim handed out, and each completion or dead-letter that
returned, with the claim's attempt and the time (CLOCK_MONOTONIC, one clock
for every process on the host).  At the end:

* every acknowledged item has exactly one record, in completed/ or failed/,
  never both;
* no outcome that returned OK belongs to a claim whose item was handed to
  another claim afterwards (a later attempt), and no record was written by
  an attempt older than the item's last one handed out: either would be a
  stale claim's commit;
* once the locks had time to expire, a fresh consumer finds nothing in work/
  or locks/ that it cannot finish (``swept`` counts what it finished,
  ``left_in_work`` and ``left_in_locks`` what it could not; the locks its
  own completions leave to expire, F4 being skipped, hold nothing and do
  not count).

``tests/test_chaos.py`` runs a small version in CI; ``python bench/chaos.py
--items 20000 --rounds 12`` is the soak version and prints the same figures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

from etcdq_v2 import EtcdqError, ItemInfo, Queue, Unavailable, connect
from etcdq_v2.codec import Junk, Lock
from etcdq_v2.server import EtcdCluster

# The proxy is part of the test harness; the chaos run borrows it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from faultproxy import FaultProxy  # noqa: E402

#: Every n-th item's handler fails, every time: it is dead-lettered at MAX_ATTEMPTS.
FAILING_EVERY = 25
MAX_ATTEMPTS = 3


def commits(item_id: bytes = rb"\d+") -> "re.Pattern[bytes]":
    """The requests that commit an outcome: a record (``PUT completed|failed/<id>``) or,
    since the fenced commit, the item carrying its outcome (``"o":`` in the form-encoded
    value).  Claims and deletes do not match."""
    return re.compile(rb"^PUT /v2/keys/\S+/(?:completed|failed)/(" + item_id + rb")\b"
                      rb"|^PUT /v2/keys/\S+/work/(" + item_id + rb")\b[^\r]*\r\n"
                      rb"(?:[^\r]+\r\n)*\r\n.*%22o%22%3A", re.MULTILINE)


#: What the network schedule holds of one worker: its next commit, whatever the item.
COMMITS = commits()

WORKER = """
import random, sys, time
from etcdq_v2 import Queue, connect
endpoints, name, log_path, lock_ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
queue = Queue(connect(endpoints, timeout=2.0, deadline=60), name, lock_ttl=lock_ttl,
              max_attempts=int(sys.argv[5]), backoff=[1, 2, 4])  # dead letters come soon

def note(log, event, claim, *more):
    fields = [event, claim.id, claim.attempt, repr(time.monotonic()), *more]
    log.write(" ".join(map(str, fields)) + "\\n")
    log.flush()

with open(log_path, "a") as log:
    while True:
        try:
            claim = queue.claim(timeout=15)
        except Exception as exc:
            print("claim failed:", exc, file=sys.stderr)
            continue
        if claim is None:
            break
        note(log, "claimed", claim)
        time.sleep(random.uniform(0, 0.03))   # the handler's work
        try:
            if claim.payload["fails"]:
                claim.fail("this item always fails")
            else:
                claim.complete()
        except Exception as exc:
            note(log, "unsettled", claim, type(exc).__name__)
            continue
        if claim.outcome in ("completed", "dead-lettered"):
            note(log, claim.outcome, claim)
queue.close()
"""


@dataclass
class ChaosReport:
    """The run's figures; :func:`healthy` says which must be zero."""

    items: int = 0
    acknowledged: int = 0
    unknown_puts: int = 0
    completed_records: int = 0
    failed_records: int = 0
    both_records: int = 0
    executions: int = 0
    executed_more_than_once: int = 0
    unsettled: int = 0
    stale_outcomes: int = 0
    superseded_records: int = 0
    lost: int = 0
    swept: int = 0
    left_in_work: int = 0
    left_in_locks: int = 0
    worker_kills: int = 0
    member_kills: int = 0
    leader_kills: int = 0
    member_pauses: int = 0
    black_holes: int = 0
    held_writes: int = 0
    held_requests: int = 0
    held_taken_over: int = 0
    seconds: float = 0.0
    faults: List[str] = field(default_factory=list)
    stale_examples: List[str] = field(default_factory=list)

    def fault(self, what: str) -> None:
        """Log a fault with its start on the workers' clock (time.monotonic())."""
        self.faults.append(f"{what} @{time.monotonic():.1f}")


class Event(NamedTuple):
    """One line of a worker's log."""

    kind: str        # claimed, completed, dead-lettered, unsettled
    item_id: str
    attempt: int
    at: float        # time.monotonic() in the worker


def parse_events(text: str) -> List[Event]:
    """The events of a worker log; a line cut short by a SIGKILL is skipped."""
    events = []
    for line in text.splitlines():
        fields = line.split()
        try:
            events.append(Event(fields[0], fields[1], int(fields[2]), float(fields[3])))
        except (IndexError, ValueError):
            continue
    return events


def stale_outcomes(events: List[Event]) -> List[str]:
    """Outcomes that returned OK although a later attempt of the item was handed out.

    Attempts only grow (each claim's C2 counts one), so a claim handed out
    with a higher attempt than the one that finished the item was made after
    that claim's: the finished claim was no longer the holder when its
    outcome committed (handed out before it returned), or the item ran again
    after it was finished (handed out after).
    """
    handed: Dict[str, List[Event]] = defaultdict(list)
    for event in events:
        if event.kind == "claimed":
            handed[event.item_id].append(event)
    stale = []
    for done in (e for e in events if e.kind in ("completed", "dead-lettered")):
        for later in (e for e in handed[done.item_id] if e.attempt > done.attempt):
            when = "before" if later.at < done.at else "after"
            stale.append(f"{done.item_id}: attempt {done.attempt} {done.kind}, attempt "
                         f"{later.attempt} handed out {abs(later.at - done.at):.3f} s {when} "
                         "that returned")
    return stale


class Network:
    """A proxy in front of each member for each client (the producer, each worker slot)."""

    def __init__(self, member_urls: List[str]) -> None:
        self.member_urls = member_urls
        self.clients: Dict[str, List[FaultProxy]] = {}

    def endpoints(self, client: str) -> str:
        """The client's endpoints: its own proxies, started on first use."""
        if client not in self.clients:
            self.clients[client] = [FaultProxy.to(url).start() for url in self.member_urls]
        return ",".join(proxy.url for proxy in self.clients[client])

    def member(self, index: int) -> List[FaultProxy]:
        """Every client's proxy in front of member ``index``."""
        return [proxies[index] for proxies in list(self.clients.values())]

    def stop(self) -> None:
        for proxies in self.clients.values():
            for proxy in proxies:
                proxy.stop()


class Workers:
    """Worker processes, one per slot, that can be SIGKILLed and replaced.

    ``endpoints(slot)`` gives a slot's endpoints; a replacement keeps its slot's.
    """

    def __init__(self, endpoints: Callable[[int], str], queue: str, folder: Path,
                 lock_ttl: float) -> None:
        self.endpoints, self.queue, self.folder, self.lock_ttl = endpoints, queue, folder, lock_ttl
        self.processes: List[subprocess.Popen] = []
        self.spared: Optional[int] = None  # a slot kill_one leaves alone (its writes are held)
        self._started = 0

    def start(self, count: int) -> None:
        for slot in range(len(self.processes), len(self.processes) + count):
            self.processes.append(self._spawn(slot))

    def _spawn(self, slot: int) -> subprocess.Popen:
        self._started += 1
        members = self.endpoints(slot).split(",")
        shift = slot % len(members)  # spread the workers over the members
        endpoints = ",".join(members[shift:] + members[:shift])
        log = self.folder / f"worker-{self._started}.log"
        with open(self.folder / f"worker-{self._started}.err", "wb") as errors:
            return subprocess.Popen([sys.executable, "-c", WORKER, endpoints, self.queue,
                                     str(log), str(self.lock_ttl), str(MAX_ATTEMPTS)],
                                    stderr=errors)

    def kill_one(self) -> int:
        """SIGKILL a running worker and start another in its slot; the slot."""
        slot = random.choice([i for i, p in enumerate(self.processes)
                              if p.poll() is None and i != self.spared])
        os.kill(self.processes[slot].pid, signal.SIGKILL)
        self.processes[slot].wait()
        self.processes[slot] = self._spawn(slot)
        return slot

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.wait(max(deadline - time.monotonic(), 1))

    def events(self) -> List[Event]:
        events: List[Event] = []
        for log in sorted(self.folder.glob("worker-*.log")):
            events.extend(parse_events(log.read_text()))
        return events

    def handed_out_since(self, item_id: str, since: float) -> bool:
        return any(e.kind == "claimed" and e.item_id == item_id and e.at > since
                   for e in self.events())

    def executions(self) -> Counter:
        """How many times each item was handed to a handler."""
        return Counter(e.item_id for e in self.events() if e.kind == "claimed")


class Producer(threading.Thread):
    """Puts ``count`` items; remembers which puts were acknowledged."""

    def __init__(self, queue: Queue, count: int) -> None:
        super().__init__(daemon=True)
        self.queue, self.count = queue, count
        self.acknowledged: Dict[str, int] = {}
        self.unknown: List[int] = []

    def run(self) -> None:
        for n in range(self.count):
            try:
                item_id = self.queue.put({"n": n, "fails": n % FAILING_EVERY == 0})
                self.acknowledged[item_id] = n
            except Unavailable:
                self.unknown.append(n)  # may or may not be stored; never twice


class NetworkChaos(threading.Thread):
    """Faults between the clients and the members, one after another, until stopped.

    A black hole in front of one member, for every client, for
    ``pause_seconds``.  Then one worker's commits held on every member, past
    the lock TTL, until another worker was handed the held item (or for at
    most ``2.5 * lock_ttl``), and released: the held worker is still waiting
    for them (its deadline is longer), so this is the race of a stale claim's
    commit with the next claim's.  A cycle once begun is finished, so the run
    has at least one of each.
    """

    def __init__(self, network: Network, pool: Workers, queue: Queue, report: ChaosReport,
                 pause_seconds: float) -> None:
        super().__init__(daemon=True)
        self.network, self.pool, self.queue, self.report = network, pool, queue, report
        self.pause_seconds = pause_seconds
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self._black_hole()
            self._gap()
            self._hold_commits()
            self._gap()

    def _gap(self) -> None:
        self.stopping.wait(random.uniform(1.0, 2.5))

    def _black_hole(self) -> None:
        member = random.randrange(len(self.network.member_urls))
        self.report.fault(f"black-hole m{member + 1}")
        for proxy in self.network.member(member):
            proxy.black_hole()
        time.sleep(self.pause_seconds)   # this IS the fault
        for proxy in self.network.member(member):
            proxy.pass_through()
        self.report.black_holes += 1

    def _hold_commits(self) -> None:
        slot = random.randrange(len(self.pool.processes))
        held = self.network.clients[f"worker-{slot}"]
        others = [p for client, proxies in list(self.network.clients.items())
                  if client != f"worker-{slot}" for p in proxies]
        self.report.fault(f"hold worker {slot}'s commits")
        self.pool.spared = slot  # its claim must live to see its writes land
        for proxy in held:
            proxy.hold("up", match=COMMITS)
        self._until_taken_over(held, others)
        self.report.held_requests += sum(len(COMMITS.findall(p.held())) for p in held)
        for proxy in held:  # the stale claim's writes first ...
            proxy.release()
        _wait_for(lambda: not any(p.held() for p in held), 5.0)
        time.sleep(0.5)
        for proxy in others:  # ... then the new claim's
            proxy.release()
        self.pool.spared = None
        self.report.held_writes += 1

    def _until_taken_over(self, held: List[FaultProxy], others: List[FaultProxy]) -> None:
        """Past the lock TTL, until the held item was handed to another claim.

        Once the item is known, the commits other clients make for it are
        held too, so that the stale claim's land before them.
        """
        ttl = self.pool.lock_ttl
        started = time.monotonic()
        at_least, at_most = started + ttl + 1, started + 2.5 * ttl
        item: Optional[str] = None
        while time.monotonic() < at_most:
            if item is None:
                item = _held_item(held)
                if item is not None:
                    _hold_commits_of(others, item)
            elif time.monotonic() > at_least:
                if self.pool.handed_out_since(item, started):
                    self.report.held_taken_over += 1
                    return
                if self._finished(item):
                    return  # the held write came after the commit: nobody takes it over
            time.sleep(0.2)

    def _finished(self, item_id: str) -> bool:
        try:
            return self.queue.get(item_id).state in ("completed", "failed")
        except EtcdqError:
            return False


def _hold_commits_of(proxies: List[FaultProxy], item_id: str) -> None:
    for proxy in proxies:
        proxy.hold("up", match=commits(re.escape(item_id.encode())))


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def _held_item(proxies: List[FaultProxy]) -> Optional[str]:
    for proxy in proxies:
        found = COMMITS.search(proxy.held())
        if found:
            return (found.group(1) or found.group(2)).decode()
    return None


def fault_round(cluster: EtcdCluster, workers: Workers, report: ChaosReport, round_: int,
                pause_seconds: float) -> None:
    """One round of the process schedule: a worker kill, then an etcd fault."""
    report.fault(f"kill worker {workers.kill_one()}")
    report.worker_kills += 1
    leader = cluster.leader_index(timeout=30)
    kind = ("kill-leader", "pause", "kill-member")[round_ % 3]
    target = leader if kind != "kill-member" else random.choice(
        [i for i in range(len(cluster.members)) if i != leader])
    report.fault(f"{kind} m{target + 1}")
    if kind == "pause":
        cluster.pause(target)
        time.sleep(pause_seconds)   # longer than the election timeout: this IS the fault
        cluster.resume(target)
        report.member_pauses += 1
        return
    cluster.kill(target)
    report.member_kills += 1
    report.leader_kills += target == leader
    time.sleep(1.0)  # let the survivors notice before the member comes back
    cluster.restart(target, timeout=60)


def run_chaos(cluster: EtcdCluster, *, items: int, workers: int, rounds: int,
              folder: Path, lock_ttl: float = 15.0, pause_seconds: float = 3.0
              ) -> ChaosReport:
    report = ChaosReport(items=items)
    started = time.monotonic()
    network = Network(cluster.endpoints.split(","))
    name = f"chaos-{os.getpid()}-{random.randrange(1 << 30)}"
    try:
        with Queue(connect(network.endpoints("producer"), timeout=2.0, deadline=30), name,
                   lock_ttl=lock_ttl) as queue:
            pool = Workers(lambda slot: network.endpoints(f"worker-{slot}"), name, folder,
                           lock_ttl)
            chaos = NetworkChaos(network, pool, queue, report, pause_seconds)
            producer = _run_faults(cluster, queue, pool, chaos, report,
                                   workers=workers, rounds=rounds)
            report.seconds = round(time.monotonic() - started, 1)
            check(queue, producer, pool, report)
    finally:
        network.stop()
    return report


def _run_faults(cluster: EtcdCluster, queue: Queue, pool: Workers, chaos: NetworkChaos,
                report: ChaosReport, *, workers: int, rounds: int) -> Producer:
    """Produce, consume and inject faults until everything settled; the producer."""
    producer = Producer(queue, report.items)
    producer.start()
    pool.start(workers)
    chaos.start()
    for round_ in range(rounds):
        time.sleep(random.uniform(1.0, 2.5))
        fault_round(cluster, pool, report, round_, chaos.pause_seconds)
    chaos.stopping.set()
    chaos.join()
    producer.join()
    pool.wait(timeout=600)
    return producer


def check(queue: Queue, producer: Producer, workers: Workers, report: ChaosReport) -> None:
    swept = sweep(queue)
    events = workers.events() + swept
    report.swept = sum(1 for e in swept if e.kind == "claimed")
    records = {state: {info.id: info for info in queue.items(state)}
               for state in ("completed", "failed")}
    _count_records(records, producer, report)
    _count_runs(producer, events, report)
    outcomes, superseded = stale_outcomes(events), superseded_records(records, events)
    report.stale_outcomes, report.superseded_records = len(outcomes), len(superseded)
    report.stale_examples = (outcomes + superseded)[:5]
    report.left_in_work = len(queue._protocol.list("work")[1])
    report.left_in_locks = len(held_locks(queue))


def held_locks(queue: Queue) -> List[str]:
    """The ids in locks/ whose lock holds something: every lock but the ones the
    finishers left to expire (F4 is skipped for lock_ttl <= 60 s), which carry
    the claim token of their item's record (the sweep's own completions too)."""
    finishers = {entry.id: record.claim for kind in ("completed", "failed")
                 for entry, record in queue._protocol.decoded(kind)}
    held = []
    for entry in queue._protocol.list("locks")[1]:
        try:
            token: Optional[str] = Lock.decode(entry.value).token
        except Junk:
            token = None
        if token is None or finishers.get(entry.id) != token:
            held.append(entry.id)
    return held


def superseded_records(records: Dict[str, Dict[str, ItemInfo]], events: List[Event]
                       ) -> List[str]:
    """Records written by an older attempt than the item's last one handed out.

    Once a later claim's C2 changed the item, an older claim's commit must
    fail however late it lands, whether its client waited for it or not.
    """
    last: Dict[str, int] = {}
    for event in events:
        if event.kind == "claimed":
            last[event.item_id] = max(last.get(event.item_id, 0), event.attempt)
    return [f"{info.id}: {state} by attempt {info.attempts}, attempt {last[info.id]} "
            "was handed out"
            for state, infos in records.items() for info in infos.values()
            if info.attempts < last.get(info.id, 0)]


def _count_records(records: Dict[str, Dict[str, ItemInfo]], producer: Producer,
                   report: ChaosReport) -> None:
    completed, failed = set(records["completed"]), set(records["failed"])
    report.acknowledged = len(producer.acknowledged)
    report.unknown_puts = len(producer.unknown)
    report.completed_records, report.failed_records = len(completed), len(failed)
    report.both_records = len(completed & failed)
    report.lost = sum(1 for item_id in producer.acknowledged
                      if item_id not in completed and item_id not in failed)


def _count_runs(producer: Producer, events: List[Event], report: ChaosReport) -> None:
    """Runs of the items whose handler succeeds: more than one needs a reason."""
    runs = Counter(e.item_id for e in events if e.kind == "claimed")
    failing = {item_id for item_id, n in producer.acknowledged.items()
               if n % FAILING_EVERY == 0}
    report.executions = sum(runs.values())
    report.executed_more_than_once = sum(1 for item_id, n in runs.items()
                                         if n > 1 and item_id not in failing)
    report.unsettled = sum(1 for e in events if e.kind == "unsettled")


def sweep(queue: Queue) -> List[Event]:
    """Once every lock could have expired, finish what is left: the events of that.

    Whatever a fresh consumer can claim was not stuck, only left behind by
    workers that gave up waiting (say for a lock that a held write created
    late); what it cannot take stays in work/ or locks/ and is counted.
    """
    deadline = time.monotonic() + queue.lock_ttl + 2
    while queue._protocol.list("locks")[1] and time.monotonic() < deadline:
        time.sleep(0.2)
    events = []
    with Queue(queue.etcd, queue.name, lock_ttl=queue.lock_ttl) as consumer:
        while (claim := consumer.claim(timeout=1)) is not None:
            events.append(Event("claimed", claim.id, claim.attempt, time.monotonic()))
            claim.complete("swept")
            events.append(Event("completed", claim.id, claim.attempt, time.monotonic()))
    return events


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--pause", type=float, default=5.0,
                        help="seconds a member is stopped, and a proxy black-holed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, \
            EtcdCluster(Path(folder) / "cluster", 3) as cluster:
        report = run_chaos(cluster, items=args.items, workers=args.workers, rounds=args.rounds,
                           folder=Path(folder), pause_seconds=args.pause)
    print(json.dumps(asdict(report), indent=2))
    return 0 if healthy(report) else 1


def healthy(report: ChaosReport) -> bool:
    """The run's safety checks: nothing lost, recorded twice, committed stale or stuck."""
    return (report.lost == 0 and report.both_records == 0 and report.stale_outcomes == 0
            and report.superseded_records == 0 and report.left_in_work == 0
            and report.left_in_locks == 0)


if __name__ == "__main__":
    sys.exit(main())
