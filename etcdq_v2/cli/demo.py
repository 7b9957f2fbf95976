"""``etcdq demo``: what the queue promises, shown on a live queue.

The demo enqueues items, starts several ``etcdq work`` processes on them and
SIGKILLs one mid-way.  The items that worker held come back when its lock
expires and other workers complete them; at the end the demo checks that
every item was completed exactly once with the right result, and reports the
throughput.  It runs on the etcd it is given, or on a throwaway one in a
temporary directory when none answers there.

The verb's parser and handler come first, the demo itself after them.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import EtcdqError
from ..queue import Queue
from .exits import EXIT_FAILURE, EXIT_OK, UsageError
from .options import open_queue, verb, worker_environment
from .output import StatusLine, format_counts

#: What each demo item runs: reads {"n": N}, pretends to work, prints N squared.
ITEM_SCRIPT = ("import json, sys, time; n = json.load(sys.stdin)['n']; time.sleep(0.05); "
               "print(json.dumps({'n': n, 'square': n * n}))")
DEADLINE = 60.0
CONCURRENCY = 2
TICK = 0.2


def add_verbs(verbs: Any) -> None:
    parser = verb(verbs, "demo", cmd_demo,
                  "watch worker processes drain a queue, one of them SIGKILLed mid-way",
                  epilog="Uses the etcd at --endpoints, or starts a throwaway one in a "
                         "temporary directory when none answers.")
    parser.add_argument("--items", type=int, default=300, metavar="N", help="default 300")
    parser.add_argument("--workers", type=int, default=4, metavar="N", help="default 4")
    parser.add_argument("--lock-ttl", type=float, default=3.0, metavar="S",
                        help="the workers' lock TTL: how soon a killed worker's items "
                             "come back (default 3)")


def cmd_demo(args: argparse.Namespace) -> int:
    """``etcdq demo``: on the etcd at --endpoints, or on a throwaway one."""
    if args.items < 1 or args.workers < 2:
        raise UsageError("the demo needs --items >= 1 and --workers >= 2")
    return EXIT_OK if run_demo(args) else EXIT_FAILURE


def run_demo(args: argparse.Namespace) -> bool:
    """Run the demo on the etcd at ``args.endpoints``, or on a throwaway one; True if it
    verified."""
    from ..testing import ensure_etcd
    started = ensure_etcd(args.endpoints)
    try:
        if started is None:
            print(f"Using the etcd at {args.endpoints}.")
        else:
            print(f"No etcd answered at {args.endpoints}: started a throwaway etcd at "
                  f"{started.url} (pid {started.pid}), removed at the end.")
            args = argparse.Namespace(**{**vars(args), "endpoints": started.url})
        return _Demo(args).run()
    finally:
        if started is not None:
            started.stop()


class _Demo:
    """Enqueue, start worker processes, SIGKILL one mid-way, verify, report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args  # the connection (global options) and the demo's own
        self.items = args.items
        self.worker_count = args.workers
        self.lock_ttl = args.lock_ttl
        self.name = f"demo-{secrets.token_hex(3)}"
        self.workers: List["subprocess.Popen[bytes]"] = []
        self.logs = Path(tempfile.mkdtemp(prefix="etcdq-demo-"))
        self.victim: Optional[int] = None
        self.victim_items: List[str] = []
        self.status = StatusLine(sys.stdout, every=1.0)

    def run(self) -> bool:
        with open_queue(self.args, self.name, lock_ttl=self.lock_ttl) as queue:
            ids = queue.put_many({"n": n} for n in range(self.items))
            print(f"Queued {len(ids)} items in queue {self.name}; starting "
                  f"{self.worker_count} workers:\n  {self._worker_description()}")
            began = time.monotonic()
            try:
                self._start_workers()
                finished = self._watch(queue, began)
            finally:
                self._stop_workers()
            elapsed = time.monotonic() - began
            verified = self._report(queue, ids, elapsed, finished)
            queue.purge(completed=True, failed=True)
        shutil.rmtree(self.logs, ignore_errors=True)
        return verified

    # -- workers -------------------------------------------------------------

    def _worker_argv(self, number: int) -> List[str]:
        return [sys.executable, "-m", "etcdq_v2", "-q", "work", self.name,
                "--concurrency", str(CONCURRENCY), "--lock-ttl", f"{self.lock_ttl:g}",
                "--node-id", f"worker-{number}", "--grace", "5",
                "--", sys.executable, "-c", ITEM_SCRIPT]

    def _worker_description(self) -> str:
        middle = shlex.join(self._worker_argv(0)[3:-3]).replace("worker-0", "worker-N")
        return f"etcdq {middle} python -c '<sleep 0.05 s, print n squared>'"

    def _start_workers(self) -> None:
        from ..testing import popen_tied
        env = {**os.environ, **worker_environment(self.args),
               "PYTHONPATH": os.pathsep.join(filter(None, [
                   str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")]))}
        for number in range(1, self.worker_count + 1):
            with open(self.logs / f"worker-{number}.log", "wb") as log_file:
                # Tied: if the demo is killed, its etcd dies with it, and workers left
                # behind would retry a dead endpoint forever.
                self.workers.append(popen_tied(
                    self._worker_argv(number), env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=log_file))

    def _stop_workers(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.workers:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _check_workers(self) -> None:
        for number, process in enumerate(self.workers, 1):
            if number != self.victim and process.poll() is not None:
                tail = (self.logs / f"worker-{number}.log").read_text(errors="replace")[-2000:]
                raise EtcdqError(f"demo worker {number} exited with status "
                                 f"{process.returncode}:\n{tail}")

    # -- progress ------------------------------------------------------------

    def _watch(self, queue: Queue, began: float) -> bool:
        """Show progress until every item is completed; False if the deadline passed."""
        total = self.items
        while time.monotonic() - began < DEADLINE:
            self._check_workers()
            counts = queue.stats()
            if self.victim is None and counts["completed"] >= total // 3:
                self._kill_a_worker(queue)
            self._report_reclaims(queue)
            done = counts["completed"] + counts["failed"] >= total and counts["running"] == 0
            self.status.update(self._progress(counts, began), final=done)
            if done:
                self.status.close()
                return True
            time.sleep(TICK)
        self.status.close()
        return False

    def _progress(self, counts: Dict[str, int], began: float) -> str:
        total, done = self.items, counts["completed"]
        bar = "#" * (30 * done // total)
        alive = sum(process.poll() is None for process in self.workers)
        rate = done / max(time.monotonic() - began, 1e-6)
        return (f"[{bar:<30}] {done}/{total} completed  {counts['running']} running  "
                f"{counts['failed']} failed  {alive}/{len(self.workers)} workers  "
                f"{rate:.0f} items/s")

    def _kill_a_worker(self, queue: Queue) -> None:
        running = queue.items("running")
        holders = [info.node_id for info in running]
        number = next((n for n in range(1, len(self.workers) + 1)
                       if f"worker-{n}" in holders), 1)
        self.workers[number - 1].kill()
        self.workers[number - 1].wait()
        self.victim = number
        self.victim_items = [info.id for info in running if info.node_id == f"worker-{number}"]
        held = ", ".join(self.victim_items) or "no items at that instant"
        self.status.event(f"SIGKILLed worker-{number} (pid {self.workers[number - 1].pid}) "
                          f"holding {held}; its items come back when its "
                          f"{self.lock_ttl:g} s lock expires.")

    def _report_reclaims(self, queue: Queue) -> None:
        for item_id in list(self.victim_items):
            info = queue.get(item_id)
            if info.state != "completed":
                continue
            self.victim_items.remove(item_id)
            if info.node_id == f"worker-{self.victim}":
                self.status.event(f"Item {item_id} had been completed just before the kill.")
            else:
                self.status.event(f"Item {item_id} reclaimed: completed by {info.node_id} "
                                  f"on attempt {info.attempts}.")

    # -- verdict -------------------------------------------------------------

    def _report(self, queue: Queue, ids: List[str], elapsed: float, finished: bool) -> bool:
        counts = queue.stats()
        records = queue.items("completed")
        completed_ids = [info.id for info in records]
        results_right = all(info.result == {"n": info.payload["n"],
                                            "square": info.payload["n"] ** 2}
                            for info in records)
        once = (finished and sorted(completed_ids) == sorted(ids) and results_right
                and counts["pending"] == counts["running"] == counts["failed"] == 0)
        reclaimed = sum(1 for info in records if info.attempts > 1)
        print(f"Final stats: {format_counts(counts)}")
        print(f"{len(completed_ids)} items in {elapsed:.1f} s = {len(completed_ids) / elapsed:.1f}"
              f" items/s with {len(self.workers)} worker processes, 1 SIGKILLed mid-way")
        print(f"Items reclaimed after the SIGKILL (completed on a later attempt): {reclaimed}")
        print(f"Each item completed exactly once: {'yes' if once else 'NO'} "
              f"({len(set(completed_ids))} completion records for {len(ids)} items, "
              f"results {'all right' if results_right else 'WRONG'})")
        if not finished:
            print(f"The demo did not finish within {DEADLINE:g} s; worker logs "
                  f"were in {self.logs}", file=sys.stderr)
        return once
