"""Chaos run: workers and etcd members die while a queue drains; count what happened.

A 3-member etcd cluster on loopback, several worker processes whose handlers
take varying time, and a producer.  While they run, a fault schedule SIGKILLs
workers (and restarts them), SIGKILLs etcd members (the leader at least once)
and restarts them on their data directories, and SIGSTOPs a member for longer
than an election timeout.  At the end every acknowledged item must have
exactly one completion record and nothing may be left in work/ or locks/.

``tests/test_chaos.py`` runs a small version in CI; ``python bench/chaos.py
--items 20000 --rounds 12`` is the soak version and prints the same figures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from etcdq_v2 import Queue, Unavailable, connect
from etcdq_v2.server import EtcdCluster

WORKER = """
import random, sys, time
from etcdq_v2 import Queue, connect
endpoints, name, log_path, lock_ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
queue = Queue(connect(endpoints, timeout=2.0, deadline=30), name, lock_ttl=lock_ttl)
with open(log_path, "a") as log:
    while True:
        try:
            claim = queue.claim(timeout=15)
        except Exception as exc:
            print("claim failed:", exc, file=sys.stderr)
            continue
        if claim is None:
            break
        time.sleep(random.uniform(0, 0.03))   # the handler's work
        log.write(claim.id + "\\n")
        log.flush()
        try:
            claim.complete()
        except Exception as exc:
            print("complete failed:", exc, file=sys.stderr)
queue.close()
"""


@dataclass
class ChaosReport:
    items: int = 0
    acknowledged: int = 0
    unknown_puts: int = 0
    completed_records: int = 0
    executions: int = 0
    executed_more_than_once: int = 0
    lost: int = 0
    left_in_work: int = 0
    left_in_locks: int = 0
    worker_kills: int = 0
    member_kills: int = 0
    leader_kills: int = 0
    member_pauses: int = 0
    seconds: float = 0.0
    faults: List[str] = field(default_factory=list)


class Workers:
    """Worker processes that can be SIGKILLed and replaced."""

    def __init__(self, endpoints: str, queue: str, folder: Path, lock_ttl: float) -> None:
        self.endpoints, self.queue, self.folder, self.lock_ttl = endpoints, queue, folder, lock_ttl
        self.processes: List[subprocess.Popen] = []
        self._started = 0

    def start(self, count: int) -> None:
        for _ in range(count):
            self.processes.append(self._spawn())

    def _spawn(self) -> subprocess.Popen:
        self._started += 1
        members = self.endpoints.split(",")
        shift = self._started % len(members)  # spread the workers over the members
        endpoints = ",".join(members[shift:] + members[:shift])
        log = self.folder / f"worker-{self._started}.log"
        return subprocess.Popen([sys.executable, "-c", WORKER, endpoints, self.queue, str(log),
                                 str(self.lock_ttl)], stderr=subprocess.DEVNULL)

    def kill_one(self) -> None:
        victim = random.choice([p for p in self.processes if p.poll() is None])
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        self.processes[self.processes.index(victim)] = self._spawn()

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for process in self.processes:
            process.wait(max(deadline - time.monotonic(), 1))

    def executions(self) -> Counter:
        counts: Counter = Counter()
        for log in self.folder.glob("worker-*.log"):
            counts.update(log.read_text().split())
        return counts


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
                self.acknowledged[self.queue.put({"n": n})] = n
            except Unavailable:
                self.unknown.append(n)  # may or may not be stored; never twice


def fault_round(cluster: EtcdCluster, workers: Workers, report: ChaosReport, round_: int,
                pause_seconds: float) -> None:
    """One round of the schedule: a worker kill, then an etcd fault."""
    workers.kill_one()
    report.worker_kills += 1
    leader = cluster.leader_index(timeout=30)
    kind = ("kill-leader", "pause", "kill-member")[round_ % 3]
    target = leader if kind != "kill-member" else random.choice(
        [i for i in range(len(cluster.members)) if i != leader])
    report.faults.append(f"{kind} m{target + 1}")
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
              folder: Path, lock_ttl: float = 15.0, pause_seconds: float = 3.0) -> ChaosReport:
    report = ChaosReport(items=items)
    started = time.monotonic()
    name = f"chaos-{os.getpid()}-{random.randrange(1 << 30)}"
    queue = Queue(connect(cluster.endpoints, timeout=2.0, deadline=30), name, lock_ttl=lock_ttl)
    producer = Producer(queue, items)
    producer.start()
    pool = Workers(cluster.endpoints, name, folder, lock_ttl)
    pool.start(workers)
    for round_ in range(rounds):
        time.sleep(random.uniform(1.0, 2.5))
        fault_round(cluster, pool, report, round_, pause_seconds)
    producer.join()
    pool.wait(timeout=600)
    report.seconds = round(time.monotonic() - started, 1)
    check(queue, producer, pool.executions(), report)
    queue.close()
    return report


def check(queue: Queue, producer: Producer, executions: Counter, report: ChaosReport) -> None:
    completed = {info.id: info for info in queue.items("completed")}
    report.acknowledged = len(producer.acknowledged)
    report.unknown_puts = len(producer.unknown)
    report.completed_records = len(completed)
    report.executions = sum(executions.values())
    report.executed_more_than_once = sum(1 for n in executions.values() if n > 1)
    report.lost = sum(1 for item_id in producer.acknowledged if item_id not in completed)
    report.left_in_work = len(queue._protocol.list("work")[1])
    report.left_in_locks = len(queue._protocol.list("locks")[1])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--pause", type=float, default=5.0, help="seconds a member is stopped")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, \
            EtcdCluster(Path(folder) / "cluster", 3) as cluster:
        report = run_chaos(cluster, items=args.items, workers=args.workers, rounds=args.rounds,
                           folder=Path(folder), pause_seconds=args.pause)
    print(json.dumps(asdict(report), indent=2))
    return 0 if report.lost == 0 and report.left_in_work == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
