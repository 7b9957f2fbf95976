"""Several consumer processes drain one queue: every item completes exactly once."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Tuple

from etcdq_v2 import Queue

from crashes import left_lock

CONSUMER = textwrap.dedent("""
    import json, sys
    from etcdq_v2 import Queue
    q = Queue(sys.argv[1], sys.argv[2], lock_ttl=10)
    handled = []
    while True:
        claim = q.claim(timeout=float(sys.argv[3]))
        if claim is None:
            break
        handled.append(claim.id)
        claim.complete({"by": q.node_id})
    q.close()
    print(json.dumps({"handled": handled, "requests": sum(q.etcd.requests.values())}))
""")


def run_consumers(endpoints: str, queue_name: str, count: int, idle: float
                  ) -> Tuple[Counter, int]:
    """Items executed (with how often), and the requests all consumers sent."""
    consumers = [subprocess.Popen([sys.executable, "-c", CONSUMER, endpoints, queue_name,
                                   str(idle)], stdout=subprocess.PIPE, text=True)
                 for _ in range(count)]
    executed: Counter = Counter()
    requests = 0
    for consumer in consumers:
        out, _ = consumer.communicate(timeout=300)
        assert consumer.returncode == 0
        report = json.loads(out)
        executed.update(report["handled"])
        requests += report["requests"]
    return executed, requests


def test_four_processes_drain_1200_items_exactly_once(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        ids = queue.put_many(range(1200))
        executed, _ = run_consumers(etcd_url, queue_name, 4, idle=2.0)
        assert sorted(executed) == ids
        assert max(executed.values()) == 1, "an item ran twice without any fault"
        completed = queue.items("completed")
        assert [info.id for info in completed] == ids
        assert len({info.node_id for info in completed}) == 4  # all four took part
        assert queue.stats() == {"pending": 0, "running": 0, "completed": 1200, "failed": 0}
        for entry in queue._protocol.list("locks")[1]:
            left_lock(queue, "completed", entry.id)  # only finishers' locks, left to expire


def test_many_consumers_at_the_end_of_a_drain_do_not_race_for_finished_items(
        etcd_url: str, queue_name: str) -> None:
    # 32 processes on a small machine: views lag, and the last items finish
    # while most consumers have nothing left and watch locks/ as well.  A
    # view that offered a finished item again each time some claim's lock
    # came and went made them race for it until their views caught up:
    # tens of requests per item instead of about five.
    with Queue(etcd_url, queue_name) as queue:
        ids = queue.put_many(range(2000))
        executed, requests = run_consumers(etcd_url, queue_name, 32, idle=1.0)
        assert sorted(executed) == ids and max(executed.values()) == 1
        assert requests <= 12 * len(ids), f"{requests / len(ids):.1f} requests per item"
